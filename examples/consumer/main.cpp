// Using torchcap from another project: trace a torch::nn model, print its
// graph, save it, load it, run it and check it against the model.
#include <torchcap/torchcap.h>

#include <torch/torch.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 2), torch::nn::ReLU());

  // Parameters become get_attr nodes named by their path in the model.
  torchcap::GraphModule gm = torchcap::trace(model, {torch::randn({3, 4})});
  std::cout << gm.graph().str();

  // Saved with its parameters, loaded back without the model's code, then
  // resolved once to run many times on new inputs of the traced shapes.
  torchcap::save(gm, "model.tcg");
  torchcap::Interpreter graph(torchcap::load("model.tcg"));
  torch::Tensor x = torch::randn({3, 4});
  torch::Tensor y = graph.run({x}).toTensor();

  torch::NoGradGuard no_grad;
  double diff = (y - model->forward(x)).abs().max().item<double>();
  std::cout << "max |graph - model| = " << diff << "\n";
  return diff <= 1e-6 ? 0 : 1;
}
