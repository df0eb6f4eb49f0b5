// The tracer's dispatch handler: every aten operator that reaches the tracer's
// key runs here (docs/STYLE.md 6: one boxed handler, explicit exceptions).
#include <torchcap/error.h>
#include <torchcap/evaluator.h>

#include "graph/data_dependence.h"
#include "graph/hidden_writes.h"
#include "graph/ivalue_conversion.h"
#include "graph/operator_facts.h"
#include "graph/operator_name.h"
#include "trace/dispatch_key.h"
#include "trace/trace_state.h"
#include "trace/tracing_tensor.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <mutex>
#include <sstream>

namespace torchcap {
namespace detail {
namespace {

using Stack = std::vector<c10::IValue>;

std::string schema_str(const c10::FunctionSchema& s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// at::equal(a, b) where a and b hold the same node's value depends on that
// identity, which the graph keeps, not on the data (short of NaNs).
// MultiheadAttention asks this to detect self-attention.
bool same_value_comparison(TraceState& st, const c10::FunctionSchema& schema, const Stack& stack,
                           size_t base) {
  if (schema.name() != "aten::equal") return false;
  const c10::IValue& a = stack[base];
  const c10::IValue& b = stack[base + 1];
  if (!a.isTensor() || !b.isTensor()) return false;
  if (a.toTensor().is_same(b.toTensor())) return true;
  return st.node_for(a.toTensor(), "argument 'self' of aten::equal") ==
         st.node_for(b.toTensor(), "argument 'other' of aten::equal");
}

c10::IValue unwrap(const c10::IValue& v) {
  if (v.isTensor()) {
    TracingTensorImpl* w = maybe_get_tracing_impl(v.toTensor());
    return w != nullptr ? c10::IValue(w->value()) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    auto in = v.toTensorList();
    out.reserve(in.size());
    for (const at::Tensor& t : in) out.push_back(unwrap_tracing_tensor(t));
    return out;
  }
  if (v.isList() && is_tensor_like(v)) {  // Tensor?[]
    c10::impl::GenericList out(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) out.push_back(unwrap(e));
    return out;
  }
  return v;
}

// Note [Operator facts, looked up once]
// Everything the handler needs from an operator's registration (its name,
// which arguments it writes, which results alias which arguments, whether a
// result is data: operator_facts.h) is looked up once per operator and
// trace, not for every call: the handler runs for every operator the program
// calls, and the process-wide table's lock and hash would cost more than many
// of the operators themselves. The trace's own table (TraceState::facts) is
// flat and reached from the state the handler holds; it is read right after
// a kernel has left the caches cold, where every line read is a miss.
const OperatorFacts& facts_of(TraceState& st, const c10::OperatorHandle& op) {
  const OperatorFacts*& facts = st.facts(&op.schema());
  if (facts == nullptr) facts = &operator_facts(op);
  return *facts;
}

bool is_immutable_tensor(const c10::IValue& v) {
  if (!v.isTensor()) return false;
  TracingTensorImpl* w = maybe_get_tracing_impl(v.toTensor());
  return w != nullptr && w->is_immutable();
}

// A wrapper among `v` whose trace runs on another thread, or nullptr.
TracingTensorImpl* wrapper_of_trace_elsewhere(const c10::IValue& v) {
  if (v.isTensor()) {
    TracingTensorImpl* w = maybe_get_tracing_impl(v.toTensor());
    return w != nullptr && is_running_elsewhere(w->trace_id()) ? w : nullptr;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (TracingTensorImpl* w = wrapper_of_trace_elsewhere(e)) return w;
    }
  }
  return nullptr;
}

void run_untraced(const c10::OperatorHandle& op, Stack* stack) {
  // No trace on this thread: wrappers compute, nothing is recorded. Results
  // are plain tensors, except write-aliases, which return the argument itself.
  const c10::FunctionSchema& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  const OperatorFacts& facts = operator_facts(op);
  for (auto it = stack->end() - n_args; it != stack->end(); ++it) {
    if (wrapper_of_trace_elsewhere(*it) != nullptr) {
      // Note [Traced tensors on other threads] in tracer.cpp.
      throw TraceError(facts.identity->qualified +
                       " was called on a traced tensor on a thread that is not tracing it (the "
                       "trace runs on another thread). A trace records the operators of its own "
                       "thread only, so this one would be missing from the graph and its result "
                       "fixed at this run's value. Compute on the tracing thread: no thread pools, "
                       "futures or forks inside a traced program");
    }
  }
  std::vector<c10::IValue> original(stack->end() - n_args, stack->end());
  for (auto it = stack->end() - n_args; it != stack->end(); ++it) *it = unwrap(*it);
  op.callBoxed(stack);
  const auto& returns = schema.returns();
  for (size_t j = 0; j < returns.size(); ++j) {
    int k = facts.written_argument[j];
    if (k >= 0) (*stack)[stack->size() - returns.size() + j] = original[k];
  }
}

// Note [Reshape aliases are recorded as views]
// `reshape` of a tensor that can be viewed decomposes to
// `_reshape_alias(self, size, stride)`, whose strides are those of *this*
// tensor's layout. A graph may later run it on a tensor of another layout:
// export's re-trace computes views as `*_copy` operators, which return
// contiguous tensors, so a `_reshape_alias_copy` there reads with the old
// strides, giving wrong values or, past the end of the storage, a crash
// inside LibTorch 1.13 (window attention: Swin, MaxViT, MViT). The operator
// is a view of its argument with the given size whenever the tracer sees it,
// so it is recorded as `aten::view(self, size)`, as later PyTorch releases
// do; the real `_reshape_alias` still runs on the real tensor.
Node* record_node(Graph& g, const c10::OperatorHandle& op, const OperatorFacts& facts,
                  ArgumentList args, Kwargs kwargs) {
  if (facts.is_reshape_alias) {
    static const c10::OperatorHandle view =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::view", "");
    TORCH_INTERNAL_ASSERT(args.size() >= 2 && kwargs.empty(), "_reshape_alias: unexpected arguments");
    args.resize(2);
    return g.call_function(view, std::move(args));
  }
  return g.call_function(op, *facts.identity, std::move(args), std::move(kwargs));
}

// Note [Attributes written during a trace]
// The tracer runs the program for real, so an operator that writes a buffer
// (BatchNorm's running stats in train mode) changes the module's real buffer,
// just as eager execution would. The graph records that write too; for running
// the graph to have the same effect as running the program once, its attribute
// must hold the value from *before* the trace. So the first write to an
// attribute's memory snapshots it: the GraphModule keeps the copy, the module
// keeps going with its own tensor.

// Note [Proxy rebinding for in-place ops]
// An in-place or out= operator returns its written argument. The recorded node
// computes the argument's new value, so the argument's wrapper (or, for a
// plain tensor, the trace's entry for it) is pointed at that node: later reads
// depend on the write, and the tensor object the program holds stays the same.

// One call of an operator reaching the tracer: its arguments are the last
// `schema.arguments().size()` entries of `stack`.
struct OpCall {
  const c10::OperatorHandle& op;
  const c10::FunctionSchema& schema;
  const OperatorFacts& facts;
  const std::string& target;
  Stack* stack;
  size_t base;  // index of the first argument on the stack

  const c10::IValue& arg(size_t i) const { return (*stack)[base + i]; }
  size_t num_args() const { return schema.arguments().size(); }
};

std::string describe_immutable(const c10::IValue& v) {
  TracingTensorImpl* w = maybe_get_tracing_impl(v.toTensor());
  Node* n = w->node() != nullptr ? w->node() : w->source();
  if (n == nullptr) return "a graph input or a view of one";
  return n->op() == OpCode::Placeholder ? "graph input %" + n->name()
                                        : "%" + n->name() + ", a view of a graph input";
}

// The refusal of a write to an immutable tensor (a graph input, or a view of
// one): `why` says how the operator writes when its schema does not.
TraceError immutable_write_error(const std::string& argument, const c10::FunctionSchema& schema,
                                 const c10::IValue& v, const std::string& why) {
  return TraceError("Immutable tensor `" + argument + "` is potentially getting modified by " +
                    schema_str(schema) + why + ": it is " + describe_immutable(v) +
                    ", which a graph may not modify. Clone it first, or let the program write to "
                    "its inputs (TraceOptions::allow_input_mutation, or torchcap::export).");
}

// Whether every tensor the call reads holds a value no input can change
// (Note [Values no input can change] in tracer.cpp).
bool reads_constant_values_only(TraceState& st, const OpCall& c) {
  for (size_t i = 0; i < c.num_args(); ++i) {
    const c10::IValue& v = c.arg(i);
    if (v.isTensor()) {
      if (v.toTensor().defined() && !st.is_constant_value(v.toTensor())) return false;
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor() && e.toTensor().defined() && !st.is_constant_value(e.toTensor())) return false;
      }
    }
  }
  return true;
}

void record_source(TraceState& st, Node* node);

// What a call that reads tensor data into a plain value is.
enum class DataRead {
  None,       // the call reads no tensor data (or nothing the graph cannot know)
  SameValue,  // at::equal of a value with itself: true, which the trace knows
  Guarded,    // a value an input can change, baked and guarded
};

// Step 0: a plain value read from tensor data would be baked in. Refused,
// unless the values are constants (Note [Values no input can change] in
// tracer.cpp) or the program allows it: then the read is guarded (Note
// [Guards of values the program read] in kernels/guards.cpp).
DataRead check_data_dependence(TraceState& st, const OpCall& c) {
  if (!c.facts.returns_data) return DataRead::None;
  if (c.facts.is_equal && same_value_comparison(st, c.schema, *c.stack, c.base)) {
    return DataRead::SameValue;
  }
  if (!st.meta() && reads_constant_values_only(st, c)) return DataRead::None;
  if (!st.meta() && st.options().allow_data_dependent_values) return DataRead::Guarded;
  if (st.meta()) {
    throw TraceError(c.target +
                     " reads a tensor's value into C++ (for example .item(), at::equal, allclose "
                     "or a tensor used as a condition), and in meta mode tensors have no values. "
                     "Keep the computation in tensors (torch::where instead of a branch), or trace "
                     "without meta mode. Schema: " + schema_str(c.schema) + st.program_location());
  }
  throw TraceError(c.target +
                   " reads a tensor's value into C++ (for example .item(), at::equal, "
                   "allclose or a tensor used as a condition); the graph would bake "
                   "that value, and any branch taken on it, in. Keep the computation in tensors "
                   "(torch::where instead of a branch), or set "
                   "TraceOptions::allow_data_dependent_values (the value is then baked in and "
                   "checked on every run). Schema: " + schema_str(c.schema) +
                   st.program_location());
}

// The read's node (its value is a number, which the program took), and after
// it the guard that compares what it reads on every run with the value
// traced (Note [Guards of values the program read] in kernels/guards.cpp).
void record_guarded_read(TraceState& st, const OpCall& c, ArgumentList args, Kwargs kwargs) {
  const c10::IValue& value = c.stack->back();
  // LibTorch 1.13 hands a bool tensor's .item() back as an int.
  const c10::IValue& first = c.arg(0);
  const bool of_bools = first.isTensor() && first.toTensor().defined() &&
                        first.toTensor().scalar_type() == c10::kBool;
  Argument expected;
  if (value.isDouble()) {
    expected = Argument(value.toDouble());
  } else if (value.isInt() && of_bools) {
    expected = Argument(value.toInt() != 0);
  } else if (value.isInt()) {
    expected = Argument(value.toInt());
  } else if (value.isBool()) {
    expected = Argument(value.toBool());
  } else {
    throw TraceError(c.target + " returns " + value.tagKind() +
                     ", a value read from tensor data that torchcap cannot check on every run; "
                     "keep the computation in tensors" + st.program_location());
  }
  Graph& g = st.graph();
  Node* read = record_node(g, c.op, c.facts, std::move(args), std::move(kwargs));
  record_source(st, read);
  static const c10::OperatorHandle guard =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchcap::guard_value", "");
  // What read it, and where: the message of a failed guard names the line
  // whichever way the graph runs (the interpreter, torch.fx's code).
  const std::string what = (c.target == "aten::_local_scalar_dense"
                                ? std::string(".item(), float(), int() or a tensor as a condition")
                                : c.target) +
                           st.program_location();
  Node* check = g.call_function(guard, {Argument(read), std::move(expected), Argument(what)});
  record_source(st, check);
}

// Step 0, continued: a result whose shape depends on tensor values would
// have the size seen now in the graph (Note [Shapes that depend on values]).
// In meta mode the operator's missing meta kernel says so (run_meta).
void check_data_dependent_shape(TraceState& st, const OpCall& c) {
  if (!c.facts.maybe_data_dependent_shape || st.meta()) return;
  if (st.options().allow_data_dependent_values) return;
  if (!has_data_dependent_shape(c.op, c10::ArrayRef<c10::IValue>(*c.stack).slice(c.base))) return;
  throw TraceError(c.target +
                   " returns a tensor whose shape depends on tensor values (a boolean mask, "
                   "nonzero, unique, ...); the graph would fix the size seen now, which other "
                   "inputs change. Keep shapes fixed (torch::where(mask, x, 0) instead of x[mask]), "
                   "or set TraceOptions::allow_data_dependent_values: the graph then computes the "
                   "size on every run, and sizes the program reads from it are fixed. Schema: " +
                   schema_str(c.schema) + st.program_location());
}

// Step 1: writes the graph cannot express, and writes to inputs, are refused
// before anything runs, so the input keeps its value. Returns which arguments
// the operator writes (declared or hidden, Note [Writes the schema does not
// declare]).
// Empty when the operator writes nothing.
std::vector<bool> check_writes(const OpCall& c) {
  if (!c.facts.writes_any()) return {};
  const auto& params = c.schema.arguments();
  const size_t n = c.num_args();
  std::vector<bool> written = c.facts.writes;
  std::vector<bool> hidden(n, false);
  if (const HiddenWrites* h = c.facts.hidden) {
    const c10::IValue& flag = c.arg(h->condition);
    if (flag.isBool() && flag.toBool()) {
      for (size_t i : h->arguments) {
        const c10::IValue& v = c.arg(i);
        hidden[i] = written[i] = v.isTensor() && v.toTensor().defined();
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!written[i]) continue;
    const c10::IValue& v = c.arg(i);
    if (hidden[i]) {
      if (is_immutable_tensor(v)) {
        throw immutable_write_error(params[i].name(), c.schema, v,
                                    " (it updates its running statistics in place when training)");
      }
      continue;
    }
    bool returned = false;
    for (int w : c.facts.written_argument) returned = returned || w == static_cast<int>(i);
    if (!returned) {
      throw TraceError(c.target + " writes to argument '" + params[i].name() +
                       "' without returning it" +
                       (c.facts.writes_elements[i] ? " (it writes list elements)" : "") +
                       "; a graph cannot express that mutation. Schema: " + schema_str(c.schema));
    }
    if (is_immutable_tensor(v)) {
      throw immutable_write_error(params[i].name(), c.schema, v, "");
    }
  }
  return written;
}

// Step 2: the arguments as the node records them: tensors become the nodes
// holding their values; arguments equal to their defaults are left out.
// Resolving may add get_attr and getitem nodes, which therefore come before
// this operator's node.
bool equals_default(const c10::IValue& v, const c10::Argument& param) {
  const auto& def = param.default_value();
  if (!def) return false;
  if (v.isNone()) return def->isNone();
  if (v.isTensor()) return false;
  if (v.tagKind() != def->tagKind()) return false;
  if (v.isInt()) return v.toInt() == def->toInt();
  if (v.isBool()) return v.toBool() == def->toBool();
  return !is_tensor_like(v) && v == *def;
}

std::pair<ArgumentList, Kwargs> record_arguments(TraceState& st, const OpCall& c) {
  const auto& params = c.schema.arguments();
  const size_t n = c.num_args();
  auto node_of = [&st](const at::Tensor& t, const auto& what) { return st.node_for(t, what); };
  auto convert = [&](size_t i) {
    auto what = [&c, &params, i] { return "argument '" + params[i].name() + "' of " + c.target; };
    return argument_of(c.arg(i), *params[i].real_type(), node_of, what);
  };
  const size_t positional = c.facts.positional;
  size_t last = positional;  // trailing positional defaults are dropped
  while (last > 0 && equals_default(c.arg(last - 1), params[last - 1])) --last;
  ArgumentList args;
  Kwargs kwargs;
  args.reserve(last);
  // In order: resolving a tensor may add get_attr or getitem nodes, which
  // the listing then shows in argument order.
  for (size_t i = 0; i < positional; ++i) {
    if (i < last) {
      args.push_back(convert(i));
    } else {
      convert(i);  // a default value: nothing to record, but checked
    }
  }
  for (size_t i = positional; i < n; ++i) {
    Argument a = convert(i);
    if (!equals_default(c.arg(i), params[i])) kwargs.emplace_back(params[i].name(), std::move(a));
  }
  return {std::move(args), std::move(kwargs)};
}

// Note [Meta mode]
// In meta mode (TraceOptions::meta) every value the program computes is a
// meta tensor, and an operator runs as its meta kernel: results get dtype,
// shape and strides, and no memory or arithmetic. The tracer does the rest
// as in a real trace, so the graph is the same: inputs are wrapped around
// meta tensors; plain tensors (parameters, buffers, constants) are recorded
// as get_attr nodes of the real tensors while the operator gets a meta
// stand-in of each (TraceState::stand_in); factories are asked for the meta
// device, while the node records the device the program gave. The wrappers
// report the device the real program would compute on (the device argument
// of a factory, else the first tensor argument's, else the CPU), and node
// metadata records that device, so the program sees, and branches on, what
// it would see in a real trace.
// What meta mode cannot do is refused by name, never done by computing:
// operators whose result depends on values (data_dependent_output:
// .item(), at::equal; dynamic_output_shape: nonzero, masked_select, unique)
// and operators without a meta kernel. LibTorch 1.13 lacks meta kernels for
// some common operators; torchcap provides them (Note [Meta kernels
// LibTorch 1.13 lacks]), one set that shape propagation uses too.

// A meta mode argument: wrappers give their (meta) values, plain tensors
// their stand-ins.
c10::IValue meta_argument(TraceState& st, const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return v;
    TracingTensorImpl* w = maybe_get_tracing_impl(t);
    return w != nullptr ? c10::IValue(w->value()) : c10::IValue(st.stand_in(t));
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    auto in = v.toTensorList();
    out.reserve(in.size());
    for (const at::Tensor& t : in) out.push_back(meta_argument(st, t).toTensor());
    return out;
  }
  if (v.isList() && is_tensor_like(v)) {  // Tensor?[]
    c10::impl::GenericList out(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) out.push_back(meta_argument(st, e));
    return out;
  }
  return v;
}

bool is_device_type(const c10::Type& t) {
  return unwrap_optional(t).kind() == c10::TypeKind::DeviceObjType;
}

// The device the real program would compute a result on: a factory's
// device argument, else the first tensor argument's (a wrapper reports the
// program's device), else the CPU. `args` as the program passed them.
c10::Device result_device(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  const auto& params = schema.arguments();
  for (size_t i = 0; i < params.size(); ++i) {
    if (is_device_type(*params[i].real_type()) && args[i].isDevice()) return args[i].toDevice();
  }
  for (const c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined()) return v.toTensor().device();
    if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor() && e.toTensor().defined()) return e.toTensor().device();
      }
    }
  }
  return c10::Device(c10::kCPU);
}

// "Could not run 'aten::nonzero' with arguments from the 'Meta' backend":
// the operator that had no meta kernel (it may be called by the one traced).
std::string operator_without_meta_kernel(const std::string& message) {
  const std::string prefix = "Could not run '";
  size_t at = message.find(prefix);
  if (at == std::string::npos || message.find("'Meta' backend", at) == std::string::npos) return "";
  size_t begin = at + prefix.size();
  size_t end = message.find('\'', begin);
  return end == std::string::npos ? "" : message.substr(begin, end - begin);
}

[[noreturn]] void throw_meta_unsupported(const OpCall& c, const std::string& inner) {
  std::string via = inner.empty() || inner == c.target ? "" : " (it calls " + inner + ")";
  const std::string& op = inner.empty() ? c.target : inner;
  auto handle = c10::Dispatcher::singleton().findSchema(parse_operator_name(op));
  if (handle && handle->hasTag(at::Tag::dynamic_output_shape)) {
    throw TraceError(c.target + via +
                     ": the shape of its result depends on tensor values, and in meta mode "
                     "tensors have no values. Trace without meta mode. Schema: " +
                     schema_str(c.schema));
  }
  throw TraceError(op + " has no meta kernel" + via +
                   " (LibTorch has none for it and torchcap provides none), so meta mode cannot "
                   "run it without computing. Trace without meta mode. Schema: " +
                   schema_str(c.schema));
}

// The operator's meta kernel on the meta values (Note [Meta mode]).
void run_meta(TraceState& st, const OpCall& c) {
  // An operator tagged dynamic_output_shape may still have a meta kernel
  // for the cases where the shape is known (index.Tensor with integer
  // indices); with a boolean mask, that kernel calls nonzero, caught below.
  if (!c.op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta)) throw_meta_unsupported(c, "");
  const auto& params = c.schema.arguments();
  for (size_t i = 0; i < c.num_args(); ++i) {
    c10::IValue& v = (*c.stack)[c.base + i];
    if (is_device_type(*params[i].real_type())) {
      v = c10::Device(c10::kMeta);
    } else {
      v = meta_argument(st, v);
    }
  }
  try {
    c.op.callBoxed(c.stack);
  } catch (const c10::Error& e) {
    std::string inner = operator_without_meta_kernel(e.what_without_backtrace());
    if (inner.empty()) throw;
    throw_meta_unsupported(c, inner);
  }
}

// Step 3: the operator on the real tensors (in meta mode on meta ones, Note
// [Meta mode]). Attributes about to be written are snapshotted first (Note
// [Attributes written during a trace]). Returns the arguments as the program
// passed them (wrappers included) when recording the results needs them: in
// meta mode, and for operators that return a written argument or a view of
// one; else nothing.
using Originals = c10::SmallVector<c10::IValue, 6>;

Originals run_operator(TraceState& st, const OpCall& c, const std::vector<bool>& written) {
  Originals original;
  if (st.meta() || c.facts.returns_written || c.facts.returns_view) {
    original.assign(c.stack->begin() + c.base, c.stack->end());
  }
  if (st.meta()) {
    run_meta(st, c);
    return original;
  }
  for (size_t i = 0; i < written.size(); ++i) {
    if (written[i] && c.arg(i).isTensor()) st.before_write(c.arg(i).toTensor());
  }
  for (size_t i = 0; i < c.num_args(); ++i) (*c.stack)[c.base + i] = unwrap(c.arg(i));
  c.op.callBoxed(c.stack);
  return original;
}

// Whether the results can be recorded: tensors (or tensor lists) only, or
// nothing. Non-tensor results (sizes, flags) are plain values the program
// keeps; no node is made.
bool has_tensor_results(const OpCall& c) {
  const auto& returns = c.schema.returns();
  const size_t rbase = c.stack->size() - returns.size();
  size_t tensors = 0;
  for (size_t j = 0; j < returns.size(); ++j) {
    const c10::IValue& out = (*c.stack)[rbase + j];
    if (out.isTensor() || out.isTensorList()) {
      ++tensors;
    } else if (out.isList() && is_tensor_like(out)) {
      throw TraceError(c.target + " returns a list of optional tensors, which torchcap cannot "
                                  "record yet. Schema: " + schema_str(c.schema));
    }
  }
  if (tensors == 0 && !returns.empty()) return false;
  if (tensors != returns.size()) {
    throw TraceError(c.target + " returns tensors and other values together, which torchcap "
                                "cannot record. Schema: " + schema_str(c.schema));
  }
  return true;
}

void record_source(TraceState& st, Node* node) {
  if (st.origin() != nullptr) {
    node->meta().stack_trace = st.origin()->meta().stack_trace;
    node->meta().module_stack = st.origin()->meta().module_stack;
  } else if (st.options().record_stack_traces) {
    if (st.options().locate_source) {
      st.options().locate_source(node->meta());
    } else {
      node->meta().stack_trace = StackTrace::capture();
    }
  }
}

// Step 4: the node, its metadata, and the results handed back to the
// program: written arguments are rebound (Note [Proxy rebinding for in-place
// ops]), other results wrapped (views of an input stay immutable).
void record_results(TraceState& st, const OpCall& c, ArgumentList args, Kwargs kwargs,
                    const Originals& original) {
  const auto& returns = c.schema.returns();
  const size_t rbase = c.stack->size() - returns.size();
  // The device the program sees its results on: in meta mode not the meta
  // device the values are on (Note [Meta mode]).
  c10::optional<c10::Device> device;
  if (st.meta()) device = result_device(c.schema, original);
  // As upstream: undefined outputs become empty tensors.
  for (size_t j = 0; j < returns.size(); ++j) {
    c10::IValue& out = (*c.stack)[rbase + j];
    if (out.isTensor() && !out.toTensor().defined()) {
      out = st.meta() ? at::empty({0}, at::TensorOptions().device(c10::kMeta)) : at::empty({0});
    }
  }
  for (size_t j = 0; j < returns.size(); ++j) {
    const c10::IValue& out = (*c.stack)[rbase + j];
    auto check = [&](const at::Tensor& t) {
      if (t.defined() && t.layout() != c10::kStrided) {
        throw TraceError(c.target + " returns a " + c10::str(t.layout()) +
                         " tensor; torchcap records strided (dense) tensors only. Convert it with "
                         "to_dense() in the program. Schema: " + schema_str(c.schema));
      }
    };
    if (out.isTensor()) check(out.toTensor());
    if (out.isTensorList()) {
      for (const at::Tensor& t : out.toTensorList()) check(t);
    }
  }
  Graph& g = st.graph();
  Node* node = record_node(g, c.op, c.facts, std::move(args), std::move(kwargs));
  node->meta().val = result_meta(c.schema, c10::ArrayRef<c10::IValue>(*c.stack).slice(rbase));
  if (device) {
    for (TensorMeta& m : node->meta().val.tensors) m.device = *device;
  }
  record_source(st, node);

  const bool multi = returns.size() > 1;
  for (size_t j = 0; j < returns.size(); ++j) {
    c10::IValue& out = (*c.stack)[rbase + j];
    int w = c.facts.written_argument[j];
    if (w >= 0) {
      const at::Tensor& arg = original[w].toTensor();
      if (TracingTensorImpl* impl = maybe_get_tracing_impl(arg)) {
        impl->refresh_metadata();  // out= ops may resize
        if (multi) {
          impl->rebind_to_output(node, static_cast<int64_t>(j));
        } else {
          impl->rebind(node);
        }
      } else {
        Node* value = node;
        if (multi) {
          value = g.getitem(node, static_cast<int64_t>(j));
          value->meta().val = ValueMeta::tensor(TensorMeta::of(arg));
        }
        st.rebind_plain(arg, value);
      }
      out = original[w];
      continue;
    }
    int a = c.facts.viewed_argument[j];
    bool immutable = a >= 0 && is_immutable_tensor(original[a]);
    auto wrap = [&](const at::Tensor& t, int64_t index) {
      at::Tensor wrapped =
          make_tracing_tensor(t, index < 0 ? node : nullptr, st.id(), immutable, device);
      if (index >= 0) maybe_get_tracing_impl(wrapped)->rebind_to_output(node, index);
      return wrapped;
    };
    if (out.isTensor()) {
      out = wrap(out.toTensor(), multi ? static_cast<int64_t>(j) : -1);
    } else {
      c10::List<at::Tensor> list = out.toTensorList();
      c10::List<at::Tensor> wrapped;
      wrapped.reserve(list.size());
      for (size_t k = 0; k < list.size(); ++k) wrapped.push_back(wrap(list[k], static_cast<int64_t>(k)));
      out = wrapped;
    }
  }
}

void trace_op(TraceState& st, const c10::OperatorHandle& op, Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const OperatorFacts& facts = facts_of(st, op);
  OpCall c{op, schema, facts, facts.identity->qualified, stack,
           stack->size() - schema.arguments().size()};
  const DataRead read = check_data_dependence(st, c);
  if (read == DataRead::SameValue && st.meta()) {
    // at::equal(x, x): true, which a meta kernel cannot say.
    c.stack->erase(c.stack->begin() + static_cast<std::ptrdiff_t>(c.base), c.stack->end());
    c.stack->emplace_back(true);
    return;
  }
  check_data_dependent_shape(st, c);
  std::vector<bool> written = check_writes(c);
  auto [args, kwargs] = record_arguments(st, c);
  Originals original = run_operator(st, c, written);
  if (read == DataRead::Guarded && c.schema.returns().size() == 1) {
    record_guarded_read(st, c, std::move(args), std::move(kwargs));
    return;
  }
  if (!has_tensor_results(c)) return;
  record_results(st, c, std::move(args), std::move(kwargs), original);
}

bool has_direct_cpu_kernel(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
}

// Registered as a kernel for every operator that LibTorch does not decompose.
// Note [Wrappers around traced tensors]
// A tensor that wraps a traced tensor (functionalization's
// FunctionalTensorWrapper) copies its dispatch keys, the tracer's among them,
// and the tracer's key sits above Functionalize. Such a call is not the
// tracer's yet: it is passed down to the wrapper's own key, whose kernel
// unwraps and calls the operator again on the traced tensors inside.
bool has_foreign_tracer_key(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && t.key_set().has(kTracerKey) && !is_tracing_tensor(t);
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (has_foreign_tracer_key(e)) return true;
    }
  }
  return false;
}

bool passes_down(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - n; it != stack->end(); ++it) {
    if (has_foreign_tracer_key(*it)) {
      op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kTracerKey),
                         stack);
      return true;
    }
  }
  return false;
}

void traced_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* stack) {
  if (passes_down(op, ks, stack)) return;
  c10::impl::ExcludeDispatchKeyGuard no_tracer(kTracerKey);
  TraceState* st = current_trace();
  try {
    if (st == nullptr) return run_untraced(op, stack);
    trace_op(*st, op, stack);
  } catch (const Error& e) {
    note_operator_error(e);  // Note [Errors raised inside operators]
    throw;
  }
}

// The fallback: composite operators (which reach the tracer whole only when the
// autograd keys are skipped) and operators registered after the tracer was.
void traced_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* stack) {
  if (passes_down(op, ks, stack)) return;
  TraceState* st = current_trace();
  if (st != nullptr && op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
      !st->preserves(op.operator_name()) && !has_direct_cpu_kernel(op)) {
    // Decompose while still tracing: the composite kernel, which also fills
    // the CPU slot of the dispatch table, calls its constituent operators on
    // the wrappers, and those reach the tracer one by one.
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    return;
  }
  traced_kernel(op, ks, stack);
}

}  // namespace

void ensure_tracer_registered() {
  // Note [Registrations for the life of the process]
  // Kernels torchcap registers with the dispatcher stay registered until
  // exit: their handles are never destroyed (at exit the dispatcher may be
  // gone before them). The handles are held through a static pointer rather
  // than dropped, so that leak checkers see them as reachable
  // (tests/leak_test.cpp).
  static auto* const handles = new std::vector<c10::RegistrationHandleRAII>();
  static std::once_flag once;
  std::call_once(once, [] {
    auto& d = c10::Dispatcher::singleton();
    handles->push_back(d.registerFallback(
        kTracerKey, c10::KernelFunction::makeFromBoxedFunction<&traced_fallback>(),
        "torchcap tracer fallback"));
    // Note [Wrappers are subclass-like] (tracing_tensor.cpp): a wrapper's
    // autograd key is AutogradMeta, which LibTorch 1.13, unlike the CPU's,
    // gives no fallthrough for operators without autograd kernels (custom
    // operators). It gets the one every other backend has.
    try {
      handles->push_back(d.registerFallback(c10::DispatchKey::AutogradMeta,
                                            c10::KernelFunction::makeFallthrough(),
                                            "torchcap: autograd of wrappers"));
    } catch (const c10::Error&) {
      // Someone registered one already: theirs serves.
    }
    // A fallback alone would let CompositeExplicitAutograd kernels run before
    // the tracer sees some primitives; a direct kernel per operator does not.
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      auto op = d.findOp(name);
      if (!op || !op->hasSchema()) continue;
      if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
      handles->push_back(d.registerImpl(
          name, kTracerKey, c10::KernelFunction::makeFromBoxedFunction<&traced_kernel>(),
          c10::nullopt, nullptr, "torchcap tracer"));
    }
  });
}

}  // namespace detail
}  // namespace torchcap
