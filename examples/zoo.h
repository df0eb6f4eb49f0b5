// torchcap's built-in example programs: C++ frontend models and plain
// functions that the demo, the tests, the benchmarks and the command line
// trace. Each is built deterministically from a fixed seed.
#pragma once

#include <torchcap/tracer.h>

#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace torchcap::examples {

struct Example {
  std::string name;
  std::string description;
  // The model, when the program is a torch::nn module (its parameters and
  // buffers get their qualified names); null for plain functions.
  std::shared_ptr<torch::nn::Module> module;
  // The program: runs eagerly when no trace is active.
  TracedFunction forward;
  // Inputs made from `seed`; seed 0 gives the example's reference inputs.
  std::function<std::vector<c10::IValue>(uint64_t seed)> make_inputs;
};

// Names of the examples, in a stable order.
const std::vector<std::string>& names();
// One line describing each example, by name.
std::string describe(const std::string& name);
// Builds example `name` (weights from a fixed seed). Throws torchcap::Error
// listing the known names if there is no such example.
Example make(const std::string& name);

// Traces the example on `inputs` (its reference inputs if empty).
GraphModule trace(Example& e, const TraceOptions& options = {}, std::vector<c10::IValue> inputs = {});
// The same, with what the program returned.
TraceResult trace_with_outputs(Example& e, const TraceOptions& options = {},
                               std::vector<c10::IValue> inputs = {});

// Turns off requires_grad on the module's parameters (for tools, such as
// LibTorch's own tracer, that refuse tensors requiring grad as constants).
void freeze(Example& e);

// The module's buffers by qualified name (none for plain functions).
std::vector<std::pair<std::string, at::Tensor>> named_buffers(const Example& e);

// The largest absolute difference between two nested results of the same
// structure (tensors compared elementwise); throws torchcap::Error if the
// structures differ.
double max_abs_diff(const c10::IValue& a, const c10::IValue& b);

}  // namespace torchcap::examples
