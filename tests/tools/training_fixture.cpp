// Writes, into the directory given as argv[1], a captured training step for
// test_training.py: step.tcg (before any step), data.pt (the inputs and
// targets of every step) and expected.pt (the loss of every step and the
// parameters after the last, from runs in C++). Tensors travel as pickles.
#include <torchcap/interpreter.h>
#include <torchcap/serialize.h>
#include <torchcap/training.h>

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>

namespace {

void write_pickle(const std::string& path, const c10::IValue& value) {
  std::vector<char> bytes = torch::jit::pickle_save(value);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: training_fixture OUT_DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                              torch::nn::Linear(8, 2));
  c10::impl::GenericList data(c10::AnyType::get());
  for (int s = 0; s < 6; ++s) {
    data.push_back(c10::ivalue::Tuple::create({at::randn({5, 4}), at::randn({5, 2})}));
  }
  auto pair = [&](int s) { return data.get(s).toTupleRef().elements().vec(); };
  torchcap::TrainingOptions options;
  options.optimizer = torchcap::Adam{.lr = 0.05, .weight_decay = 1e-3};
  torchcap::GraphModule step = torchcap::export_training(
      model, torchcap::losses::mse(), {pair(0)[0]}, {pair(0)[1]}, options);
  torchcap::save(step, dir + "/step.tcg");

  torchcap::Interpreter interp(step);
  c10::List<at::Tensor> losses;
  for (int s = 0; s < 6; ++s) {
    losses.push_back(interp.run({pair(s)[0], pair(s)[1]}).toGenericDict().at("loss").toTensor());
  }
  c10::Dict<std::string, at::Tensor> state;
  for (const torchcap::Attribute& a : step.attributes()) state.insert(a.name, a.value);
  write_pickle(dir + "/data.pt", data);
  write_pickle(dir + "/expected.pt", c10::ivalue::Tuple::create({losses, state}));
  return 0;
}
