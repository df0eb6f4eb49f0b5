// export_program and the functionalizing re-trace (upstream's dispatch_trace).
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/passes.h>
#include <torchcap/tracing_tensor.h>

#include "graph/hidden_writes.h"
#include "graph/schema_check.h"
#include "runtime/ivalues.h"
#include "trace/dispatch_key.h"
#include "trace/trace_state.h"

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/InferenceMode.h>

#include <unordered_map>

namespace torchcap {

bool is_functional(const Graph& g, std::string* problem) {
  auto fail = [&](const Node* n, const std::string& why) {
    if (problem != nullptr) *problem = "%" + n->name() + " (" + n->target() + ") " + why;
    return false;
  };
  for (const Node* n : g) {
    if (!n->is_operator()) continue;
    const c10::FunctionSchema& s = n->schema();
    for (const c10::Argument& a : s.arguments()) {
      if (a.alias_info() != nullptr && a.alias_info()->isWrite()) {
        return fail(n, "writes its argument '" + a.name() + "'");
      }
    }
    if (n->has_side_effects() && detail::hidden_writes(s.operator_name()) != nullptr) {
      return fail(n, "updates running statistics in place");
    }
    for (const c10::Argument& r : s.returns()) {
      if (r.alias_info() != nullptr) return fail(n, "returns a view of its argument");
    }
  }
  return true;
}

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

// Note [Functional BatchNorm]
// native_batch_norm in training mode updates running_mean and running_var in
// place without saying so in its schema (Note [Writes the schema does not
// declare]), so functionalization cannot see the writes. The re-trace
// therefore rewrites it: batch statistics from native_batch_norm without
// running stats (the same output as eager), and the running-stat updates
// written out as the functional computation LibTorch performs, followed by
// copy_ into the buffers, which functionalization turns into buffer-mutation
// outputs. (PyTorch 2 does the same with _native_batch_norm_legit_functional.)
c10::IValue functional_batch_norm(const std::vector<c10::IValue>& s) {
  const at::Tensor& input = s[0].toTensor();
  c10::optional<at::Tensor> weight = s[1].isNone() ? c10::nullopt : c10::optional<at::Tensor>(s[1].toTensor());
  c10::optional<at::Tensor> bias = s[2].isNone() ? c10::nullopt : c10::optional<at::Tensor>(s[2].toTensor());
  at::Tensor running_mean = s[3].toTensor();
  at::Tensor running_var = s[4].toTensor();
  double momentum = s[6].toDouble();
  double eps = s[7].toDouble();
  auto [out, save_mean, save_invstd] =
      at::native_batch_norm(input, weight, bias, c10::nullopt, c10::nullopt, true, momentum, eps);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (d != 1) dims.push_back(d);
  }
  const double n = static_cast<double>(input.numel() / input.size(1));
  at::Tensor biased_var = at::var(input, dims, /*unbiased=*/false, /*keepdim=*/false);
  at::Tensor new_mean = save_mean * momentum + running_mean * (1 - momentum);
  at::Tensor new_var = biased_var * (momentum * n / std::max(n - 1, 1.0)) + running_var * (1 - momentum);
  running_mean.copy_(new_mean);
  running_var.copy_(new_var);
  return c10::ivalue::Tuple::create({out, save_mean, save_invstd});
}

bool is_training_batch_norm(const Node& n, const std::vector<c10::IValue>& s) {
  return n.target() == "aten::native_batch_norm" && s.size() == 8 && s[5].isBool() &&
         s[5].toBool() && s[3].isTensor() && s[3].toTensor().defined() && s[4].isTensor() &&
         s[4].toTensor().defined();
}

// A value the re-trace may write: an input or a parameter/buffer.
struct Writable {
  at::Tensor functional;  // what the program works on
  at::Tensor original;    // the traced tensor it started as
  OutputKind kind;
  std::string target;
};

}  // namespace

GraphModule functionalize(const GraphModule& gm, const std::vector<c10::IValue>& inputs,
                          const TraceOptions& options) {
  gm.lint();
  detail::ensure_tracer_registered();
  TraceOptions retrace_options = options;
  retrace_options.allow_input_mutation = true;
  detail::TraceState st(retrace_options, {});
  Graph& g = st.graph();
  const Graph& source = gm.graph();

  std::vector<c10::IValue> leaves = gm.in_spec.flatten_like(c10::ivalue::Tuple::create(inputs), "input");
  std::unordered_map<const Node*, c10::IValue> env;
  std::vector<Writable> writable;
  auto value_of = [&](const Node* n) -> c10::IValue {
    auto it = env.find(n);
    TORCH_INTERNAL_ASSERT(it != env.end(), "functionalize: %", n->name(), " has no value");
    return it->second;
  };

  size_t next_input = 0;
  for (const Node* n : source) {
    if (n->op() != OpCode::Placeholder) continue;
    Node* ph = g.placeholder(n->name());
    ph->meta() = n->meta();
    at::Tensor t = leaves.at(next_input++).toTensor();
    at::Tensor w = make_tracing_tensor(t.detach(), ph, st.id(), /*immutable=*/false);
    at::Tensor f = functional(w);
    env[n] = f;
    writable.push_back({f, w, OutputKind::InputMutation, n->name()});
  }

  {
    at::NoGradGuard no_grad;
    std::optional<c10::InferenceMode> inference;
    if (options.inference_mode) inference.emplace();
    std::optional<c10::impl::ExcludeDispatchKeyGuard> no_view_tracking;
    if (c10::InferenceMode::is_enabled()) no_view_tracking.emplace(c10::DispatchKey::ADInplaceOrView);
    at::functionalization::impl::FunctionalizationReapplyViewsGuard no_views(false);
    // Every value is a traced tensor already (placeholders, attributes), so
    // operators on plain tensors need not reach the tracer: they would be
    // functionalization's own bookkeeping. Factories are the exception.
    detail::TraceScope scope(&st, /*capture_plain_tensors=*/false);

    for (const Node* n : source) {
      switch (n->op()) {
        case OpCode::Placeholder:
        case OpCode::Output:
          break;
        case OpCode::GetAttr: {
          const Attribute& a = gm.attribute(n->target());
          at::Tensor w = st.attribute_tensor(a.name, a.value, a.kind);
          at::Tensor f = functional(w);
          env[n] = f;
          if (a.kind != AttributeKind::Constant) {
            writable.push_back({f, w, OutputKind::BufferMutation, a.name});
          }
          break;
        }
        case OpCode::CallFunction: {
          if (n->is_getitem()) {
            c10::IValue src = value_of(n->args()[0].to_node());
            int64_t i = n->args()[1].to_int();
            env[n] = src.isTuple() ? src.toTupleRef().elements().at(i) : src.toListRef().at(i);
            break;
          }
          st.set_origin(n);
          std::vector<c10::IValue> stack = detail::call_stack(*n, value_of);
          const size_t n_returns = n->schema().returns().size();
          if (is_training_batch_norm(*n, stack)) {
            env[n] = functional_batch_norm(stack);
          } else if (st.preserves(n->op_handle().operator_name())) {
            // Kept whole: functionalization would decompose a composite
            // operator, so it is called on the traced tensors inside (the
            // preserved operators are functional: no writes, no views).
            for (c10::IValue& v : stack) v = unfunctional(v);
            n->op_handle().callBoxed(&stack);
            for (c10::IValue& v : stack) v = functional(v);
            if (n_returns == 1) {
              env[n] = stack.at(0);
            } else if (n_returns > 1) {
              env[n] = c10::ivalue::Tuple::create(std::move(stack));
            }
          } else {
            std::optional<c10::impl::IncludeDispatchKeyGuard> factory;
            if (!has_tensor(stack)) factory.emplace(detail::kTracerKey);
            n->op_handle().callBoxed(&stack);
            for (c10::IValue& v : stack) v = functional(v);
            if (n_returns == 1) {
              env[n] = stack.at(0);
            } else if (n_returns > 1) {
              env[n] = c10::ivalue::Tuple::create(std::move(stack));
            }
          }
          st.set_origin(nullptr);
          break;
        }
      }
    }
  }

  // The program's outputs, then the writes functionalization took out.
  ArgumentList results;
  std::vector<OutputSpec> specs;
  c10::impl::ExcludeDispatchKeyGuard no_tracer(detail::kTracerKey);
  const Node* out = source.output_node();
  const ArgumentList& source_results = out->args()[0].to_list();
  for (size_t i = 0; i < source_results.size(); ++i) {
    at::Tensor t = unfunctional(value_of(source_results[i].to_node()).toTensor());
    results.emplace_back(st.node_for(t, "output " + std::to_string(i)));
    specs.push_back(i < gm.output_specs.size() ? gm.output_specs[i] : OutputSpec{});
  }
  bool mutated = false;
  for (const Writable& w : writable) {
    at::Tensor now = unfunctional(w.functional);
    if (now.unsafeGetTensorImpl() == w.original.unsafeGetTensorImpl()) continue;
    mutated = true;
    results.emplace_back(st.node_for(now, "new value of " + w.target));
    specs.push_back(OutputSpec{w.kind, w.target});
  }
  g.output(std::move(results));

  GraphModule result = std::move(st.module());
  result.in_spec = gm.in_spec;
  result.out_spec = gm.out_spec;
  if (mutated || !gm.output_specs.empty()) result.output_specs = std::move(specs);
  eliminate_dead_code(result.graph());
  result.remove_unused_attributes();
  result.lint();
  return result;
}

namespace {

GraphModule finish_export(GraphModule first, const std::vector<c10::IValue>& inputs,
                          const TraceOptions& options) {
  eliminate_dead_code(first.graph());
  first.remove_unused_attributes();
  return functionalize(first, inputs, options);
}

TraceOptions first_trace_options(const TraceOptions& options) {
  TraceOptions first = options;
  first.allow_input_mutation = true;
  return first;
}

}  // namespace

GraphModule export_program(const TracedFunction& fn, const std::vector<c10::IValue>& inputs,
                           const TraceOptions& options) {
  return finish_export(trace(fn, inputs, first_trace_options(options)), inputs, options);
}

GraphModule export_program(torch::nn::Module& module, const TracedFunction& forward,
                           const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  return finish_export(trace(module, forward, inputs, first_trace_options(options)), inputs, options);
}

GraphModule export_program(const ModuleState& state, const TracedFunction& fn,
                           const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  return finish_export(trace(state, fn, inputs, first_trace_options(options)), inputs, options);
}

GraphModule export_program(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                           const TraceOptions& options) {
  return finish_export(trace(module, inputs, first_trace_options(options)), inputs, options);
}

}  // namespace torchcap
