// The tracer: runs a LibTorch program for real and records every aten
// operator it executes into a GraphModule (EXIR's DispatchTracer, in C++).
//
// Inputs become placeholders ph_0, ph_1, ... and are immutable; parameters and
// buffers become one get_attr node each, named by their qualified path; other
// tensors the program reads are lifted as `_tensor_constant0`, ... Operators on
// plain tensors inside the traced function (`weight.t()`, `torch::ones(...)`)
// are recorded too while the trace is active.
//
// Decomposition. LibTorch decomposes CompositeImplicitAutograd operators
// (aten::linear, aten::layer_norm, aten::dropout, ...) at the autograd dispatch
// key, above the tracer, so by default a graph holds their decompositions.
// Under inference mode the autograd keys are skipped and such operators reach
// the tracer whole: it records the ones in `TraceOptions::preserve` as single
// nodes and decomposes the rest itself. So:
//   - no grad (the tracer always runs the program under NoGradGuard): every
//     composite operator is decomposed; `preserve` cannot take effect;
//   - inference mode (TraceOptions::inference_mode, or a c10::InferenceMode
//     active around the call): `preserve` operators are kept whole; the
//     default set is {aten::linear, aten::layer_norm}, as upstream.
// Operators LibTorch never decomposes are always recorded whole.
//
// Threads: the active trace is thread-local and scoped; traces on different
// threads are independent. A trace that throws leaves nothing behind.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/module_state.h>

#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchcap {

// A dimension of an input that the graph must take at any size in [min, max]
// (Note [Dynamic shapes by aligned traces] in src/trace/dynamic.cpp).
// `input` counts the program's input tensors in flattening order (the
// placeholders: for trace(model, {x, y}), x is 0 and y is 1); a negative
// `dim` counts from the end. Dimensions given the same name are one symbol,
// equal in every call; an empty name makes a symbol of its own.
struct DynamicDim {
  size_t input = 0;
  int64_t dim = 0;
  std::string name;
  // The smallest size a call may have. 2 by default, as torch.export: a
  // program traced at sizes of 2 or more may take another path at 1 (a
  // squeeze, a broadcast). Asking for 1 (or 0) makes the trace also check
  // the graph at that size: shapes it would compute there must be those the
  // program computes, else the trace fails.
  int64_t min = 2;
  int64_t max = kNoMaxSize;
};

struct TraceOptions {
  // Record where every node came from: the user's stack trace (capture is
  // cheap; symbolizing happens only when a node's stack trace is read) and,
  // for front ends that know it, the enclosing modules.
  bool record_stack_traces = true;
  // For programs that are not C++ (a TorchScript module, a Python function):
  // called on the tracing thread for every node recorded, in place of
  // capturing the C++ stack, to fill the node's `stack_trace` (the program's
  // own frames) and `module_stack`. Not called when record_stack_traces is
  // off. trace(torch::jit::Module&, ...) sets one of its own (the model's Python
  // frames and submodules) unless one is given.
  std::function<void(NodeMeta&)> locate_source;
  // Run the program under c10::InferenceMode (see the note above).
  bool inference_mode = false;
  // Qualified operator names ("aten::linear") kept whole when they reach the
  // tracer undecomposed. Unset: default_preserved_ops(inference).
  std::optional<std::vector<std::string>> preserve;
  // Let the program write to its inputs. The trace then works on copies, so
  // the caller's tensors are not touched, and the graph records the writes;
  // export_program (export.h) turns them into outputs. Off by default: a
  // write to an input is an error naming the input and the operator.
  bool allow_input_mutation = false;
  // Reading a tensor's value into C++ (`.item()`, `at::equal`, `if (t.is_nonzero())`)
  // bakes the value into the graph. By default that is an error.
  bool allow_data_dependent_values = false;
  // Meta mode (Note [Meta mode] in src/trace/dispatch.cpp): the program
  // computes on meta tensors (dtype, shape and strides, no data) and no
  // compute kernel runs, so a trace costs bookkeeping only and needs neither
  // activations nor weights in memory. The graph is the one a real trace
  // records: parameters and buffers are still get_attr nodes of the real
  // tensors, devices in node metadata are those the real program would use.
  // Inputs may be real tensors or meta tensors (shapes only), which stand for
  // CPU tensors. The traced tensors the program sees report those devices
  // too; what trace_with_outputs returns are meta tensors.
  // Errors: an operator with no meta kernel, and any operator whose result
  // depends on tensor values (.item(), nonzero, masked_select, ...), name the
  // operator; allow_data_dependent_values cannot apply (there are no values).
  bool meta = false;
  // Export only (export.h): refuse an out= argument that is a graph input or
  // a view of one, as trace() does, while writes of in-place operators to
  // inputs are exported. Upstream's dispatch_trace treats inputs this way.
  bool refuse_out_into_inputs = false;
  // The program's argument names and whether the last input is a dict of
  // keyword arguments (call_convention.h; front ends that know the
  // signature set it). Placeholders are named after the arguments (`x`,
  // `xs_0`, `scale`) instead of ph_0, ph_1..., and the GraphModule keeps it.
  // It must describe the inputs (TypeError otherwise).
  CallConvention call;
  // Input dimensions the graph takes at any size in their range (symbolic.h).
  // The program is traced more than once, at other sizes of those
  // dimensions made from the example inputs (each extra trace in meta mode
  // where it can run so), and the graphs aligned: the result is one graph
  // whose size arguments are computed from its inputs' sizes. A trace at a
  // size that fails, or that records a different graph (control flow on a
  // size), fails the whole trace with TraceError naming the sizes and the
  // first node that differs.
  std::vector<DynamicDim> dynamic;
};

namespace detail {
class TraceState;
}

// Inside its scope, the trace active on this thread (if any) records nothing:
// for computations on the side, such as a pass run from a traced function.
// Traced tensors still compute (their operators run on the real values).
class PauseTracing {
 public:
  PauseTracing();
  ~PauseTracing();
  PauseTracing(const PauseTracing&) = delete;
  PauseTracing& operator=(const PauseTracing&) = delete;

 private:
  detail::TraceState* paused_;
  detail::TraceState* previously_paused_;
};

// {aten::linear, aten::layer_norm} under inference mode, nothing otherwise.
std::vector<std::string> default_preserved_ops(bool inference_mode);

// A traced program: takes the inputs, returns tensors, none, or tuples, lists
// and dicts of them.
using TracedFunction = std::function<c10::IValue(std::vector<c10::IValue>)>;

namespace detail {

template <typename T, typename = void>
struct IsModuleHolder : std::false_type {};
template <typename T>
struct IsModuleHolder<T, std::void_t<typename T::ContainedType>> : std::true_type {};

// The callables trace(fn, inputs) takes. A torch::nn module holder is ruled
// out before std::function is asked about it: its operator() forwards any
// arguments to forward(), so asking whether it takes a vector of IValues is a
// compile error rather than a failed match, and trace(holder, {x}) would not
// compile.
template <typename F>
using EnableIfTracedFunction = std::enable_if_t<std::conjunction_v<
    std::negation<IsModuleHolder<std::decay_t<F>>>, std::is_constructible<TracedFunction, F>>>;

GraphModule trace_function(const TracedFunction& fn, const std::vector<c10::IValue>& inputs,
                           const TraceOptions& options);

}  // namespace detail

// Traces `fn` on `inputs` (tensors, tuples, lists, dicts, none, scalars;
// scalars are specialised into the graph).
template <typename F, typename = detail::EnableIfTracedFunction<F>>
GraphModule trace(F&& fn, const std::vector<c10::IValue>& inputs, const TraceOptions& options = {}) {
  return detail::trace_function(std::forward<F>(fn), inputs, options);
}

// Traces `fn`; the tensors of `state` become get_attr nodes by their names
// (a Python module's state, say, or a C++ program's weights).
GraphModule trace(const ModuleState& state, const TracedFunction& fn,
                  const std::vector<c10::IValue>& inputs, const TraceOptions& options = {});

// Traces `forward`, which calls `module`: the module's parameters and buffers
// become get_attr nodes named by their qualified names ("layer1.0.conv1.weight").
GraphModule trace(torch::nn::Module& module, const TracedFunction& forward,
                  const std::vector<c10::IValue>& inputs, const TraceOptions& options = {});

// Traces a torch::nn module holder's `forward` (torch::nn::Linear, a
// TORCH_MODULE of your own, torch::nn::Sequential): `inputs` are its
// arguments, converted to the parameter types forward declares (tensors,
// optional tensors, numbers). A forward that is a template or overloaded
// (Sequential's) takes one tensor.
//   auto gm = torchcap::trace(model, {torch::randn({1, 3, 224, 224})});
template <typename Holder, typename = typename Holder::ContainedType>
GraphModule trace(Holder& model, const std::vector<c10::IValue>& inputs,
                  const TraceOptions& options = {});

// Traces the `forward` method of a TorchScript module (torch::jit::load), with
// the TorchScript executor's optimisations off so that the recorded operators
// are the module's own. Trailing arguments not given take their declared
// defaults.
GraphModule trace(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                  const TraceOptions& options = {});

// A graph and what the program returned while it was traced (real tensors).
struct TraceResult {
  GraphModule module;
  c10::IValue outputs;
};

// The same traces, also returning the program's outputs.
TraceResult trace_with_outputs(const ModuleState& state, const TracedFunction& fn,
                               const std::vector<c10::IValue>& inputs,
                               const TraceOptions& options = {});
TraceResult trace_with_outputs(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                               const TraceOptions& options = {});

namespace detail {

template <typename T>
struct ForwardSignature;
template <typename R, typename C, typename... A>
struct ForwardSignature<R (C::*)(A...)> {
  using Arguments = std::tuple<std::decay_t<A>...>;
};
template <typename R, typename C, typename... A>
struct ForwardSignature<R (C::*)(A...) const> : ForwardSignature<R (C::*)(A...)> {};

template <typename Impl, typename = void>
struct HasPlainForward : std::false_type {};
template <typename Impl>
struct HasPlainForward<Impl, std::void_t<decltype(&Impl::forward)>> : std::true_type {};

[[noreturn]] void throw_forward_arity(size_t expected, size_t given);

template <typename Holder, size_t... I>
c10::IValue call_forward(Holder& model, const std::vector<c10::IValue>& in,
                         std::index_sequence<I...>) {
  using Arguments = typename ForwardSignature<decltype(&Holder::ContainedType::forward)>::Arguments;
  if (in.size() != sizeof...(I)) throw_forward_arity(sizeof...(I), in.size());
  return c10::IValue(model->forward(in[I].template to<std::tuple_element_t<I, Arguments>>()...));
}

template <typename Holder>
c10::IValue call_forward(Holder& model, const std::vector<c10::IValue>& in) {
  using Impl = typename Holder::ContainedType;
  if constexpr (HasPlainForward<Impl>::value) {
    using Arguments = typename ForwardSignature<decltype(&Impl::forward)>::Arguments;
    return call_forward(model, in, std::make_index_sequence<std::tuple_size_v<Arguments>>());
  } else {
    if (in.size() != 1) throw_forward_arity(1, in.size());
    return c10::IValue(model->forward(in[0].toTensor()));
  }
}

}  // namespace detail

template <typename Holder, typename>
GraphModule trace(Holder& model, const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  return trace(
      static_cast<torch::nn::Module&>(*model),
      [&model](std::vector<c10::IValue> in) { return detail::call_forward(model, in); }, inputs,
      options);
}

}  // namespace torchcap
