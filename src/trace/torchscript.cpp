// Tracing TorchScript modules (torch::jit::load).
#include <torchcap/tracer.h>

#include "trace/trace_state.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

namespace torchcap {

ModuleState ModuleState::of(torch::jit::Module& module) {
  ModuleState state;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) state.parameters.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) state.buffers.emplace_back(b.name, b.value);
  return state;
}

TraceResult trace_with_outputs(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                               const TraceOptions& options) {
  auto forward = [&module](std::vector<c10::IValue> args) {
    // Unoptimised execution: no fusion groups or specialisations, so the
    // operators that reach the tracer are the ones the module's code calls.
    torch::jit::GraphOptimizerEnabledGuard no_optimization(false);
    return module.forward(std::move(args));
  };
  return detail::run_trace(forward, inputs, options, ModuleState::of(module));
}

GraphModule trace(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                  const TraceOptions& options) {
  return trace_with_outputs(module, inputs, options).module;
}

}  // namespace torchcap
