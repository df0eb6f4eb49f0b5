// export_program and the functionalizing re-trace (upstream's dispatch_trace).

#include <torchcap/error.h>
#include <torchcap/evaluator.h>
#include <torchcap/export.h>
#include <torchcap/passes.h>

#include "graph/hidden_writes.h"
#include "graph/ivalue_conversion.h"
#include "graph/node_source.h"
#include "graph/operator_facts.h"
#include "kernels/meta_kernels.h"
#include "trace/dynamic.h"
#include "trace/dispatch_key.h"
#include "trace/trace_state.h"
#include "trace/tracing_tensor.h"

#include <ATen/FunctionalTensorWrapper.h>

#include <optional>
#include <sstream>

namespace torchcap {

namespace {

namespace fz = at::functionalization::impl;

at::Tensor functional(const at::Tensor& t) {
  if (!t.defined() || fz::isFunctionalTensor(t)) return t;
  return fz::to_functional_tensor(t);
}

c10::IValue functional(const c10::IValue& v) {
  if (v.isTensor()) return functional(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(functional(t));
    return out;
  }
  return v;
}

at::Tensor unfunctional(const at::Tensor& t) {
  if (!fz::isFunctionalTensor(t)) return t;
  fz::sync(t);
  return fz::from_functional_tensor(t);
}

c10::IValue unfunctional(const c10::IValue& v) {
  if (v.isTensor()) return unfunctional(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(unfunctional(t));
    return out;
  }
  if (v.isList()) {
    c10::impl::GenericList out(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) out.push_back(unfunctional(e));
    return out;
  }
  return v;
}

bool has_tensor(const std::vector<c10::IValue>& stack) {
  for (const c10::IValue& v : stack) {
    if (v.isTensor() && v.toTensor().defined()) return true;
    if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor() && e.toTensor().defined()) return true;
      }
    }
  }
  return false;
}

// A value the re-trace may write: an input or a parameter/buffer.
struct Writable {
  at::Tensor functional;  // what the program works on
  at::Tensor original;    // the traced tensor it started as
  OutputKind kind;
  std::string target;
};

// Interprets the first trace's graph with every value a traced tensor inside
// a FunctionalTensorWrapper: functionalization turns mutations and views into
// functional operators on the way to the tracer, which records them into a
// new graph. Nodes take the metadata (stack traces, module stacks) of the
// node they came from.
class Functionalizer : public Evaluator {
 public:
  Functionalizer(const GraphModule& gm, detail::TraceState& st) : Evaluator(gm), st_(st) {}

  std::vector<Writable> writable;

 protected:
  c10::IValue placeholder(const Node& n, size_t index) override {
    Node* ph = st_.graph().placeholder(n.name());
    ph->meta() = n.meta();
    at::Tensor t = Evaluator::placeholder(n, index).toTensor();
    at::Tensor w;
    if (st_.meta()) {
      // The first trace's metadata has the device the input stands for.
      const ValueMeta& val = n.meta().val;
      c10::Device device = val.tensors.empty() ? c10::Device(c10::kCPU) : val.tensors[0].device;
      w = make_tracing_tensor(st_.stand_in(t.detach()), ph, st_.id(), /*immutable=*/false, device);
    } else {
      w = make_tracing_tensor(t.detach(), ph, st_.id(), /*immutable=*/false);
    }
    at::Tensor f = functional(w);
    writable.push_back({f, w, OutputKind::InputMutation, n.name()});
    return f;
  }

  c10::IValue get_attr(const Node& n) override {
    const Attribute& a = module().attribute(n.target());
    at::Tensor w = st_.attribute_tensor(a.name, a.value, a.kind);
    at::Tensor f = functional(w);
    if (a.kind != AttributeKind::Constant) {
      writable.push_back({f, w, OutputKind::BufferMutation, a.name});
    }
    return f;
  }

  c10::IValue call_operator(const Node& n, const std::vector<BoundArgument>& args) override {
    st_.set_origin(&n);
    c10::IValue result = Evaluator::call_operator(n, args);
    st_.set_origin(nullptr);
    return result;
  }

  void run_kernel(const Node& n, std::vector<c10::IValue>& stack) override {
    if (n.schema().operator_name() == lift_fresh_) {
      // The identity on a tensor the program just made (torch::tensor(2.0)),
      // which functionalization refuses to see wrapped: it is its argument.
      stack.resize(1);
      return;
    }
    const detail::HiddenWrites* hidden = detail::hidden_writes(n.schema().operator_name());
    if (hidden != nullptr && detail::hidden_writes_happen(*hidden, stack)) {
      write_functionally(n, *hidden, stack);
    } else if (st_.preserves(n.op_handle().operator_name())) {
      // Kept whole: functionalization would decompose a composite operator,
      // so it is called on the traced tensors inside (the preserved
      // operators are functional: no writes, no views).
      for (c10::IValue& v : stack) v = unfunctional(v);
      n.op_handle().callBoxed(&stack);
    } else {
      // Factories (no tensor argument) must reach the tracer, which is not
      // in the thread's dispatch keys during the re-trace.
      std::optional<c10::impl::IncludeDispatchKeyGuard> factory;
      if (!has_tensor(stack)) factory.emplace(detail::kTracerKey);
      n.op_handle().callBoxed(&stack);
    }
    for (c10::IValue& v : stack) v = functional(v);
  }

 private:
  // Note [Writes the schema does not declare]: the operator's functional
  // form computes the results and the written arguments' new values, which
  // are then copied in, a write functionalization sees (Note [Functional
  // BatchNorm]).
  void write_functionally(const Node& n, const detail::HiddenWrites& hidden,
                          std::vector<c10::IValue>& stack) {
    if (hidden.functional == nullptr) {
      throw TraceError("export: %" + n.name() + " (" + n.target() +
                       ") updates its arguments in place in a way export cannot make functional; "
                       "do not preserve it, or export in eval mode");
    }
    std::vector<c10::IValue> written;
    for (size_t i : hidden.arguments) written.push_back(stack.at(i));
    std::vector<at::Tensor> updates = hidden.functional(stack);
    for (size_t k = 0; k < updates.size(); ++k) written[k].toTensor().copy_(updates[k]);
  }

  detail::TraceState& st_;
  const c10::OperatorName lift_fresh_{"aten::lift_fresh", ""};
};

}  // namespace

GraphModule functionalize(const GraphModule& gm, const std::vector<c10::IValue>& inputs,
                          const TraceOptions& options) {
  gm.lint();
  detail::ensure_tracer_registered();
  if (options.meta) detail::ensure_meta_kernels();
  TraceOptions retrace_options = options;
  retrace_options.allow_input_mutation = true;
  detail::TraceState st(retrace_options, {});
  Graph& g = st.graph();
  std::vector<c10::IValue> leaves =
      gm.in_spec.flatten_like(c10::ivalue::Tuple::create(inputs), "input");

  Functionalizer functionalizer(gm, st);
  std::vector<c10::IValue> outputs;
  {
    at::functionalization::impl::FunctionalizationReapplyViewsGuard no_views(false);
    // Every value is a traced tensor already (placeholders, attributes), so
    // operators on plain tensors need not reach the tracer: they would be
    // functionalization's own bookkeeping. Factories are the exception.
    detail::TracingSession session(&st, options.inference_mode, /*capture_plain_tensors=*/false);
    outputs = functionalizer.run(std::move(leaves));
    // Note [Pending writes are replayed while tracing]
    // A write through a view (`x[0].add_(1)`) reaches the viewed tensor
    // when it is next read: functionalization replays the write on it then,
    // as operators on the traced tensors inside. For the outputs and the
    // written inputs and buffers that happens here, while the tracer records
    // (after the session it would compute unrecorded, on tensors that have
    // no memory to compute on).
    for (const c10::IValue& v : outputs) {
      if (v.isTensor() && fz::isFunctionalTensor(v.toTensor())) fz::sync(v.toTensor());
    }
    for (const Writable& w : functionalizer.writable) fz::sync(w.functional);
  }

  // The program's outputs, then the writes functionalization took out.
  ArgumentList results;
  std::vector<OutputSpec> specs;
  c10::impl::ExcludeDispatchKeyGuard no_tracer(detail::kTracerKey);
  for (size_t i = 0; i < outputs.size(); ++i) {
    at::Tensor t = unfunctional(outputs[i].toTensor());
    results.emplace_back(st.node_for(t, "output " + std::to_string(i)));
    specs.push_back(i < gm.output_specs.size() ? gm.output_specs[i] : OutputSpec{});
  }
  for (const Writable& w : functionalizer.writable) {
    at::Tensor now = unfunctional(w.functional);
    if (now.unsafeGetTensorImpl() == w.original.unsafeGetTensorImpl()) continue;
    results.emplace_back(st.node_for(now, "new value of " + w.target));
    specs.push_back(OutputSpec{w.kind, w.target});
  }
  g.output(std::move(results));

  GraphModule result = std::move(st.module());
  result.in_spec = gm.in_spec;
  result.out_spec = gm.out_spec;
  result.call = gm.call;
  result.output_specs = std::move(specs);
  eliminate_dead_code(result.graph());
  result.remove_unused_attributes();
  result.lint();
  return result;
}

namespace {

std::string where(const Node& n) { return detail::source_lines(n); }

const TensorMeta* first_tensor(const ValueMeta& val, size_t index) {
  return index < val.tensors.size() ? &val.tensors[index] : nullptr;
}

std::string name_of_root(const Node& root) {
  return root.op() == OpCode::Placeholder ? "graph input %" + root.name()
                                          : "attribute " + root.target();
}

// Note [Writes export cannot express]
// An exported graph gives the program's writes to its inputs and buffers
// back as new values, which a run copies into them (export.h). A write that
// changes a tensor's shape, strides or storage instead (t_, unsqueeze_,
// resize_, set_, an out= argument that is resized) cannot be given back
// that way: the copy would fail, or leave the input as it was while the
// program had replaced it. Such writes are refused before the re-trace,
// naming the operator and the program's line. trace() with
// allow_input_mutation records the operator itself and has none of this
// problem. And with `out_into_inputs_refused` (dispatch_trace), an out=
// argument that is an input or a view of one is refused as the tracer
// refuses it, as upstream's dispatch_trace does; in-place writes stay
// exported.
void check_writes_export_can_express(const GraphModule& gm, bool out_into_inputs_refused) {
  for (const Node* n : gm.graph()) {
    if (!n->is_operator()) continue;
    const c10::FunctionSchema& s = n->schema();
    const detail::OperatorFacts& f = n->facts();
    std::vector<const Argument*> given;
    const auto& params = s.arguments();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!f.writes[i]) continue;
      if (given.empty()) given = detail::given_arguments(*n);
      if (given[i] == nullptr || !given[i]->is_node()) continue;
      const Node* arg = given[i]->to_node();
      if (out_into_inputs_refused && params[i].kwarg_only()) {
        const Node* root = detail::memory_root(arg, /*through_views=*/true);
        if (root->op() == OpCode::Placeholder) {
          std::ostringstream schema;
          schema << s;
          throw TraceError("Immutable tensor `" + params[i].name() +
                           "` is potentially getting modified by " + schema.str() + ": it is " +
                           (root == arg ? "graph input %" + root->name()
                                        : "%" + arg->name() + ", a view of graph input %" + root->name()) +
                           ", which a graph may not modify. Clone it first." + where(*n));
        }
      }
      size_t result = 0;
      for (size_t r = 0; r < f.written_argument.size(); ++r) {
        if (f.written_argument[r] == static_cast<int>(i)) result = r;
      }
      const TensorMeta* before = first_tensor(arg->meta().val, 0);
      const TensorMeta* after = first_tensor(n->meta().val, result);
      const bool replaces_storage = s.name() == "aten::set_";
      const bool reshapes = before != nullptr && after != nullptr &&
                            (before->sizes != after->sizes || before->strides != after->strides);
      const Node* root = detail::memory_root(arg, /*through_views=*/false);
      if (root->op() != OpCode::Placeholder && root->op() != OpCode::GetAttr) {
        // LibTorch 1.13's functionalization of resize_ computes the new
        // tensor's strides wrongly and fails inside setStorage.
        if (reshapes && (s.name() == "aten::resize_" || s.name() == "aten::resize_as_")) {
          throw TraceError("export: %" + n->name() + " (" + n->target() + ") resizes %" + arg->name() +
                           " in place (" + before->str() + " to " + after->str() +
                           "), which LibTorch 1.13's functionalization cannot make functional. "
                           "Make a tensor of the new size instead (new_empty, reshape), or trace "
                           "without export." + where(*n));
        }
        continue;
      }
      if (!replaces_storage && !reshapes) continue;
      std::string change = replaces_storage ? "replaces the memory of"
                                            : "changes the shape or strides of";
      throw TraceError(
          "export: %" + n->name() + " (" + n->target() + ") " + change + " " + name_of_root(*root) +
          (reshapes ? " (" + before->str() + " to " + after->str() + ")" : "") +
          " in place. An exported graph gives an input or buffer new values, not a new shape, "
          "strides or memory. Compute on a new tensor instead (x = x.t() rather than x.t_()), "
          "or trace with allow_input_mutation, whose graph runs the operator itself." + where(*n));
    }
  }
}

GraphModule finish_export(GraphModule first, const std::vector<c10::IValue>& inputs,
                          const TraceOptions& options) {
  check_writes_export_can_express(first, options.refuse_out_into_inputs);
  eliminate_dead_code(first.graph());
  first.remove_unused_attributes();
  return functionalize(first, inputs, options);
}

TraceOptions first_trace_options(const TraceOptions& options) {
  TraceOptions first = options;
  first.allow_input_mutation = true;
  return first;
}

// An exported graph at the inputs' sizes, or, with dynamic dimensions, the
// exported graphs at several sizes aligned into one (Note [Dynamic shapes
// by aligned traces] in src/trace/dynamic.cpp). Export re-traces for real,
// so every trace runs for real.
GraphModule export_at(const std::function<GraphModule(const std::vector<c10::IValue>&, const TraceOptions&)>& trace_first,
                      const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  if (options.dynamic.empty()) {
    return finish_export(trace_first(inputs, first_trace_options(options)), inputs, options);
  }
  TraceOptions fixed = options;
  fixed.dynamic.clear();
  auto trace_at = [&](const std::vector<c10::IValue>& at_inputs, detail::TraceAtOptions how) {
    TraceOptions at = fixed;
    if (how.structure_only) at.record_stack_traces = false;
    GraphModule exported = finish_export(trace_first(at_inputs, first_trace_options(at)), at_inputs, at);
    return TraceResult{std::move(exported), c10::IValue()};
  };
  return detail::trace_dynamic(trace_at, inputs, options.dynamic, /*meta_allowed=*/false).module;
}

}  // namespace

GraphModule detail::export_function(const TracedFunction& fn, const std::vector<c10::IValue>& inputs,
                                    const TraceOptions& options) {
  return export_at([&](const auto& in, const TraceOptions& o) { return trace(fn, in, o); }, inputs, options);
}

GraphModule export_program(torch::nn::Module& module, const TracedFunction& forward,
                           const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  return export_at([&](const auto& in, const TraceOptions& o) { return trace(module, forward, in, o); },
                   inputs, options);
}

GraphModule export_program(const ModuleState& state, const TracedFunction& fn,
                           const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  return export_at([&](const auto& in, const TraceOptions& o) { return trace(state, fn, in, o); }, inputs,
                   options);
}

GraphModule export_program(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                           const TraceOptions& options) {
  return export_at([&](const auto& in, const TraceOptions& o) { return trace(module, in, o); }, inputs,
                   options);
}

}  // namespace torchcap
