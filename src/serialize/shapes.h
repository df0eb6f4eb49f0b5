// The loader's check of a file's shapes (Note [Checking a file's shapes] in
// shapes.cpp). Internal.
#pragma once

#include <torchcap/graph_module.h>

#include <exception>
#include <optional>
#include <string>

namespace torchcap::detail {

struct ShapeProblem {
  const Node* node;
  std::string what;  // the problem, without the node's name
};

// Note [Kernels written in Python]
// In a Python process torch replaces many meta kernels with Python functions
// (torch/_meta_registrations.py). Their errors reach C++ as exceptions of
// torch's Python bindings (python_error), whose message is made, and Python's
// error indicator cleared, only by code that links Python: torchcap._C
// installs a reader of them here when it is imported. It returns false for
// an exception that is not Python's.
struct KernelError {
  std::string message;
  bool not_implemented = false;  // NotImplementedError: no kernel for meta tensors
};
using PythonErrorReader = bool (*)(std::exception& e, KernelError& out);
void set_python_error_reader(PythonErrorReader reader);

// Runs each operator node of `gm` (which passes lint) on meta tensors made
// from the recorded metadata of its inputs, and compares the results with
// the node's recorded metadata. The first problem in graph order, or nullopt.
std::optional<ShapeProblem> check_shapes(const GraphModule& gm);

}  // namespace torchcap::detail
