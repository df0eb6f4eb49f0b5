// The named tensors of a program (its parameters and buffers), as traces,
// exports, training captures and weight binding take them.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
namespace jit {
struct Module;
}
}  // namespace torch

namespace torchcap {

// The named tensors of a program: its parameters and buffers, which a trace
// records as get_attr nodes by these names. Tied tensors are one tensor
// under several names: the first name is used.
struct ModuleState {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  std::vector<std::pair<std::string, at::Tensor>> buffers;

  // A torch::nn module's, by qualified name ("layer1.0.conv1.weight").
  static ModuleState of(torch::nn::Module& module);
  // A TorchScript module's.
  static ModuleState of(torch::jit::Module& module);
};

}  // namespace torchcap
