// Exporting a program: upstream's dispatch_trace, in C++.
//
//   export_program = trace -> dead-code elimination -> functionalize
//
// Functionalization re-traces the graph by interpreting it under ATen's
// functionalization pass (the Functionalize dispatch key) with the tracer
// below it: in-place operators become out-of-place ones and views become
// `*_copy` operators (views are not reapplied), so the result has no
// mutation and no aliasing. Node metadata (stack traces) is carried over
// from the first trace.
//
// Mutations that functionalization removes are not lost: the new values of
// written buffers and inputs become extra outputs, after the user outputs,
// and GraphModule::output_specs says which output updates which buffer or
// input (torch.export's graph signature). The Interpreter writes them back
// after a run, so running the exported graph has the same effect as running
// the program.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/passes.h>
#include <torchcap/tracer.h>

#include <optional>
#include <string>
#include <vector>

namespace torchcap {

// Each entry point mirrors trace() in tracer.h. `options.allow_input_mutation`
// is implied.
namespace detail {
GraphModule export_function(const TracedFunction& fn, const std::vector<c10::IValue>& inputs,
                            const TraceOptions& options);
}  // namespace detail
template <typename F, typename = detail::EnableIfTracedFunction<F>>
GraphModule export_program(F&& fn, const std::vector<c10::IValue>& inputs,
                           const TraceOptions& options = {}) {
  return detail::export_function(std::forward<F>(fn), inputs, options);
}
GraphModule export_program(torch::nn::Module& module, const TracedFunction& forward,
                           const std::vector<c10::IValue>& inputs, const TraceOptions& options = {});
GraphModule export_program(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                           const TraceOptions& options = {});
GraphModule export_program(const ModuleState& state, const TracedFunction& fn,
                           const std::vector<c10::IValue>& inputs, const TraceOptions& options = {});
template <typename Holder, typename = typename Holder::ContainedType>
GraphModule export_program(Holder& model, const std::vector<c10::IValue>& inputs,
                           const TraceOptions& options = {}) {
  return export_program(
      static_cast<torch::nn::Module&>(*model),
      [&model](std::vector<c10::IValue> in) { return detail::call_forward(model, in); }, inputs,
      options);
}

// The functionalizing re-trace of a traced graph, on `inputs` (its program's
// arguments, as for Interpreter::run). `options.inference_mode` and
// `options.preserve` should match the first trace.
GraphModule functionalize(const GraphModule& gm, const std::vector<c10::IValue>& inputs,
                          const TraceOptions& options = {});

}  // namespace torchcap
