// The training example of docs/training.md: capture one training step of a torch::nn
// model, train with it, save it, and continue from the file.
#include <torchcap/interpreter.h>
#include <torchcap/serialize.h>
#include <torchcap/training.h>

#include <torch/torch.h>

#include <cstdio>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 3));
  at::Tensor x = torch::randn({64, 8});
  at::Tensor y = x.slice(1, 0, 3).argmax(1);  // a class the inputs decide

  torchcap::TrainingOptions options;
  options.optimizer = torchcap::SGD{.lr = 0.1, .momentum = 0.9};
  torchcap::GraphModule step =
      torchcap::export_training(model, torchcap::losses::cross_entropy(), {x}, {y}, options);
  std::printf("%s", torchcap::training_signature(step).str().c_str());

  torchcap::Interpreter interp(step);
  for (int i = 1; i <= 5; ++i) {
    at::Tensor loss = interp.run({x, y}).toGenericDict().at("loss").toTensor();
    std::printf("step %d: loss %.4f\n", i, loss.item<double>());
  }
  torchcap::save(step, "step.tcg");  // parameters and momentum buffers after 5 steps

  torchcap::GraphModule again = torchcap::load("step.tcg");
  at::Tensor loss = torchcap::Interpreter(again).run({x, y}).toGenericDict().at("loss").toTensor();
  std::printf("step 6, from step.tcg: loss %.4f\n", loss.item<double>());
}
