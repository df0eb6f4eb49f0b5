// The tracer's entry points and the state of a trace.
#include <torchcap/error.h>
#include <torchcap/tracer.h>

#include "graph/operator_name.h"
#include "kernels/meta_kernels.h"
#include "trace/dynamic.h"
#include "trace/dispatch_key.h"
#include "trace/trace_state.h"
#include "trace/tracing_tensor.h"

#include <ATen/core/enum_tag.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/api/include/torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <optional>

namespace torchcap {

std::vector<std::string> default_preserved_ops(bool inference_mode) {
  if (!inference_mode) return {};
  return {"aten::linear", "aten::layer_norm"};
}

namespace detail {
namespace {

thread_local TraceState* tls_current = nullptr;
// The trace PauseTracing set aside on this thread, if any.
thread_local TraceState* tls_paused = nullptr;
std::atomic<uint64_t> next_trace_id{1};

// Note [Traced tensors on other threads]
// The active trace is thread-local: an operator that a traced program runs
// on another thread (a thread pool, a future, torch.jit.fork) reaches the
// tracer's kernel there with no trace active, computes on the real values,
// and is recorded nowhere; its result comes back as a plain tensor, which
// the trace then lifts as a constant. The graph would return the trace's
// answer for every input. So the traces that are running are listed here
// (a few at most; asked only on that untraced path), and an operator on a
// wrapper of a running trace, from a thread where that trace is not active
// (nor paused, PauseTracing), is refused. Once its trace has ended, a
// wrapper computes anywhere and records nothing.
std::mutex live_traces_mutex;
std::vector<uint64_t> live_traces;

}  // namespace

TraceState* current_trace() { return tls_current; }

namespace {

std::mutex operator_errors_mutex;
std::vector<std::pair<std::string, std::string>> operator_errors;  // (kind, message), oldest first
constexpr size_t kMaxOperatorErrors = 16;

const char* kind_of(const std::exception& e) {
  if (dynamic_cast<const InputError*>(&e) != nullptr) return "InputError";
  if (dynamic_cast<const WeightError*>(&e) != nullptr) return "WeightError";
  if (dynamic_cast<const TraceError*>(&e) != nullptr) return "TraceError";
  if (dynamic_cast<const TypeError*>(&e) != nullptr) return "TraceError";
  if (dynamic_cast<const Error*>(&e) != nullptr) return "Error";
  return nullptr;
}

}  // namespace

void note_operator_error(const std::exception& e) {
  const char* kind = kind_of(e);
  if (kind == nullptr) return;
  std::lock_guard<std::mutex> lock(operator_errors_mutex);
  if (operator_errors.size() == kMaxOperatorErrors) operator_errors.erase(operator_errors.begin());
  operator_errors.emplace_back(kind, e.what());
}

std::string take_operator_error_kind(const std::string& message) {
  std::lock_guard<std::mutex> lock(operator_errors_mutex);
  for (auto it = operator_errors.end(); it != operator_errors.begin();) {
    --it;
    // torch's bindings may rewrite C++ type names in a message's text, and
    // TorchScript adds its own lines after it: the first line must match.
    const std::string& noted = it->second;
    std::string first = noted.substr(0, noted.find('\n'));
    if (message.compare(0, first.size(), first) == 0) {
      std::string kind = it->first;
      operator_errors.erase(it);
      return kind;
    }
  }
  return "";
}

bool is_running_elsewhere(uint64_t trace_id) {
  if (tls_paused != nullptr && tls_paused->id() == trace_id) return false;
  if (tls_current != nullptr && tls_current->id() == trace_id) return false;
  std::lock_guard<std::mutex> lock(live_traces_mutex);
  return std::find(live_traces.begin(), live_traces.end(), trace_id) != live_traces.end();
}

}  // namespace detail

PauseTracing::PauseTracing() : paused_(detail::tls_current), previously_paused_(detail::tls_paused) {
  if (paused_ != nullptr) detail::tls_paused = paused_;
  detail::tls_current = nullptr;
}
PauseTracing::~PauseTracing() {
  detail::tls_current = paused_;
  detail::tls_paused = previously_paused_;
}

namespace detail {

TraceScope::TraceScope(TraceState* state, bool capture_plain_tensors) : previous_(tls_current) {
  if (capture_plain_tensors) include_tracer_.emplace(kTracerKey);
  tls_current = state;
}

TraceScope::~TraceScope() { tls_current = previous_; }

// Note [Inference mode and view tracking]
// Inference mode skips the autograd keys but not ADInplaceOrView for
// ordinary tensors (parameters): its view kernel would attach view metadata,
// with a version counter, to the wrapper the tracer returns, which inference
// mode made an inference tensor ("Cannot set version_counter for inference
// tensor"). Nothing in a trace needs view tracking, so it is switched off
// with autograd.
TracingSession::TracingSession(TraceState* state, bool inference_mode, bool capture_plain_tensors)
    : inference_(inference_mode ? std::make_optional<c10::InferenceMode>() : std::nullopt),
      no_view_tracking_(c10::InferenceMode::is_enabled()
                            ? std::make_optional<c10::impl::ExcludeDispatchKeyGuard>(
                                  c10::DispatchKey::ADInplaceOrView)
                            : std::nullopt),
      scope_(state, capture_plain_tensors) {}

TracingSession::~TracingSession() = default;

TraceState::TraceState(const TraceOptions& options,
                       ModuleTensors module_tensors)
    : id_(next_trace_id++), options_(options), module_tensors_(std::move(module_tensors)) {
  if (tls_current != nullptr) {
    // Note [Nested traces]
    // A trace inside a traced function would wrap the outer trace's tensors
    // (or record its own set-up into the outer graph). It is refused here,
    // before anything runs, so the active trace records nothing of the
    // attempt (the caller may catch the error and go on). Calling the inner
    // function directly gives what a user wants: the outer graph records
    // what it runs.
    throw TraceError(
        "torchcap::trace was called inside a traced function (a trace is already active on this "
        "thread); traces do not nest. Call the inner function directly, and the active trace "
        "records what it runs; or trace it on its own, outside");
  }
  bool inference = options.inference_mode || c10::InferenceMode::is_enabled();
  std::vector<std::string> preserve =
      options.preserve ? *options.preserve : default_preserved_ops(inference);
  for (const std::string& name : preserve) {
    c10::OperatorName op{name, ""};
    try {
      op = parse_operator_name(name);
    } catch (const Error&) {
      // reported below, as an unknown operator
    }
    if (op.name.find("::") == std::string::npos || !c10::Dispatcher::singleton().findSchema(op)) {
      throw TraceError("TraceOptions::preserve: '" + name +
                       "' is not a registered operator (expected e.g. aten::linear)");
    }
    preserve_.insert(qualified_name(op));
  }
  // Last: a constructor that throws runs no destructor.
  std::lock_guard<std::mutex> lock(live_traces_mutex);
  live_traces.push_back(id_);
}

TraceState::~TraceState() {
  std::lock_guard<std::mutex> lock(live_traces_mutex);
  live_traces.erase(std::remove(live_traces.begin(), live_traces.end(), id_), live_traces.end());
}

std::string TraceState::program_location() const {
  if (!options_.record_stack_traces) return "";
  StackTrace trace;
  if (options_.locate_source) {
    NodeMeta located;
    options_.locate_source(located);
    trace = located.stack_trace;
  } else {
    trace = StackTrace::capture();
  }
  // The innermost frame of the program's own, as a Python traceback ends.
  const std::vector<SourceFrame>& frames = trace.frames();
  if (frames.empty()) return "";
  const SourceFrame& f = frames.front();
  std::string where = "\n  File \"" + f.file + "\", line " + std::to_string(f.line) + ", in " +
                      (f.function.empty() ? "?" : f.function);
  if (!f.code.empty()) where += "\n    " + f.code;
  return where;
}

bool TraceState::preserves(const c10::OperatorName& op) const {
  return !preserve_.empty() && preserve_.count(qualified_name(op)) != 0;
}

Node* TraceState::getitem_for(Node* source, int64_t index) {
  // Right after the source and the getitems already made for it, so the
  // listing reads like FX's.
  Node* anchor = source;
  while (anchor->next() != nullptr && anchor->next()->is_getitem() &&
         anchor->next()->args()[0].to_node() == source) {
    if (anchor->next()->args()[1].to_int() == index) return anchor->next();
    anchor = anchor->next();
  }
  Graph::InsertPointGuard after(graph(), InsertPoint::after_node(anchor));
  Node* item = graph().getitem(source, index);
  const ValueMeta& val = source->meta().val;
  if (index >= 0 && static_cast<size_t>(index) < val.tensors.size()) {
    item->meta().val = ValueMeta::tensor(val.tensors[index]);
  }
  item->meta().stack_trace = source->meta().stack_trace;
  item->meta().module_stack = source->meta().module_stack;
  return item;
}

Node* TraceState::node_for(const at::Tensor& t, c10::function_ref<std::string()> what) {
  if (TracingTensorImpl* w = maybe_get_tracing_impl(t)) {
    if (w->trace_id() != id_) {
      throw TraceError(what() +
                       " is a traced tensor from another trace; a trace can only use its own "
                       "inputs, values computed from them, and plain tensors");
    }
    if (w->node() != nullptr) return w->node();
    Node* item = getitem_for(w->source(), w->source_index());
    w->rebind(item);
    return item;
  }
  if (t.key_set().has(kTracerKey)) {
    throw TraceError(what() + " carries the tracer's dispatch key but is not a traced tensor");
  }
  auto it = known_.find(t.unsafeGetTensorImpl());
  if (it != known_.end()) return it->second.node;

  std::string constant;
  const std::string* name = &constant;
  AttributeKind kind = AttributeKind::Constant;
  if (const ModuleTensor* named = module_tensors_.find(t.unsafeGetTensorImpl())) {
    name = named->name;
    kind = named->kind;
  } else {
    do {
      constant = "_tensor_constant" + std::to_string(next_constant_++);
    } while (module_.has_attribute(constant));
  }
  at::Tensor held = snapshot_view(t);
  const bool copied = !held.is_same(t);
  module_.set_attribute(*name, std::move(held), kind);
  Node* node = graph().get_attr(*name);
  node->meta().val = ValueMeta::tensor(TensorMeta::of(t));
  known_.emplace(t.unsafeGetTensorImpl(), Known{t, node, node});
  if (t.has_storage() && !copied) {
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    unsnapshotted_by_storage_[t.storage().unsafeGetStorageImpl()].push_back(impl);
  }
  return node;
}

// Note [Values no input can change]
// A program reads some tensors' values into C++ or Python (.item(), float(),
// a tensor as a condition) that no input can change: computed only from
// constants, literals and sizes. torchvision's detection transform computes
// its resize factor as torch.tensor(image.shape[-2:]) and reads it back;
// MultiScaleRoIAlign reads log2 of a ratio of sizes. Such a read is a
// constant of the graph, as the sizes it came from are, and is allowed. A
// value is constant when its node is a lifted constant's get_attr (not a
// parameter's or a buffer's: weights are bound and trained), or an operator
// that draws no random numbers applied to constant values only; a
// placeholder, and anything computed from one, is not. The answer is kept
// per node, found by a walk over the node's inputs (a work list, not
// recursion: STYLE 13).
bool TraceState::is_constant_value(const at::Tensor& t) {
  Node* start = nullptr;
  if (TracingTensorImpl* w = maybe_get_tracing_impl(t)) {
    if (w->trace_id() != id_) return false;
    start = w->node() != nullptr ? w->node() : w->source();
  } else {
    if (module_tensors_.find(t.unsafeGetTensorImpl()) != nullptr) return false;
    auto it = known_.find(t.unsafeGetTensorImpl());
    if (it == known_.end()) return true;  // a tensor the graph has not met: a constant
    start = it->second.node;
  }
  if (start == nullptr) return false;
  std::vector<const Node*> work = {start};
  while (!work.empty()) {
    const Node* n = work.back();
    if (constant_nodes_.count(n)) {
      work.pop_back();
      continue;
    }
    std::optional<bool> answer;
    switch (n->op()) {
      case OpCode::Placeholder:
      case OpCode::Output:
        answer = false;
        break;
      case OpCode::GetAttr:
        answer = module_.attribute(n->target()).kind == AttributeKind::Constant;
        break;
      case OpCode::CallFunction:
        if (n->is_size_computation() ||
            (n->is_operator() && n->op_handle().hasTag(at::Tag::nondeterministic_seeded))) {
          answer = false;
          break;
        }
        c10::SmallVector<const Node*, 4> pending;
        for (const Node* in : n->inputs()) {
          auto it = constant_nodes_.find(in);
          if (it == constant_nodes_.end()) {
            pending.push_back(in);
          } else if (!it->second) {
            answer = false;
            break;
          }
        }
        if (!answer && pending.empty()) answer = true;
        if (!answer) work.insert(work.end(), pending.begin(), pending.end());  // n waits for them
        break;
    }
    if (answer) {
      constant_nodes_[n] = *answer;
      work.pop_back();
    }
  }
  return constant_nodes_.at(start);
}

at::Tensor TraceState::attribute_tensor(const std::string& name, const at::Tensor& value,
                                        AttributeKind kind) {
  module_.set_attribute(name, value, kind);
  Node* node = graph().get_attr(name);
  node->meta().val = ValueMeta::tensor(TensorMeta::of(value));
  if (meta()) return make_tracing_tensor(stand_in(value), node, id_, /*immutable=*/false, value.device());
  return make_tracing_tensor(value, node, id_, /*immutable=*/false);
}

void TraceState::rebind_plain(const at::Tensor& t, Node* node) {
  auto it = known_.find(t.unsafeGetTensorImpl());
  TORCH_INTERNAL_ASSERT(it != known_.end(), "a written plain tensor was not resolved first");
  it->second.node = node;
}

at::Tensor TraceState::stand_in(const at::Tensor& t) {
  if (t.is_meta()) return t;
  auto it = stand_ins_.find(t.unsafeGetTensorImpl());
  if (it == stand_ins_.end()) {
    if (t.layout() != c10::kStrided) {
      throw TraceError("meta mode: the program uses a " + c10::str(t.layout()) +
                       " tensor, which has no meta form; only strided (dense) tensors can be "
                       "traced in meta mode");
    }
    at::Tensor meta = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
    it = stand_ins_.emplace(t.unsafeGetTensorImpl(), std::make_pair(t, std::move(meta))).first;
  }
  return it->second.second;
}

namespace {

// A tensor with the dtype, place, sizes and strides of `t` in `memory`, a
// copy of t's storage as bytes.
at::Tensor view_of(const at::Tensor& memory, const at::Tensor& t) {
  return at::empty({0}, t.options())
      .set_(memory.storage(), t.storage_offset(), t.sizes(), t.strides());
}

bool can_be_viewed(const at::Tensor& t) {
  return t.has_storage() && !t.is_quantized() && t.layout() == at::kStrided;
}

}  // namespace

at::Tensor TraceState::snapshot_view(const at::Tensor& t) const {
  if (snapshots_.empty() || !can_be_viewed(t)) return t;
  auto it = snapshots_.find(t.storage().unsafeGetStorageImpl());
  return it == snapshots_.end() || !it->second.defined() ? t : view_of(it->second, t);
}

void TraceState::before_write(const at::Tensor& t) {
  // In meta mode nothing writes to real memory.
  if (meta()) return;
  at::Tensor value = unwrap_tracing_tensor(t);
  if (!value.has_storage()) return;
  const c10::StorageImpl* storage = value.storage().unsafeGetStorageImpl();
  auto shared = unsnapshotted_by_storage_.find(storage);
  if (shared == unsnapshotted_by_storage_.end()) return;
  // One copy of the memory, and each attribute on it a view of the copy at
  // its own place: attributes that alias in the program (a buffer and a view
  // of it) alias in the graph too, so that the graph's write to one is seen
  // through the other, as the program's was. Tensors that cannot be such a
  // view (quantized, not strided) are copied on their own.
  at::Tensor& memory = snapshots_[storage];
  for (c10::TensorImpl* impl : shared->second) {
    Known& k = known_.at(impl);
    const std::string& name = k.attribute->target();
    const Attribute& attr = module_.attribute(name);
    at::Tensor copy;
    if (!can_be_viewed(k.tensor)) {
      copy = k.tensor.clone();
    } else {
      if (!memory.defined()) {
        const int64_t nbytes = static_cast<int64_t>(value.storage().nbytes());
        memory = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(value.device()))
                     .set_(value.storage(), 0, {nbytes}, {1})
                     .clone();
      }
      copy = view_of(memory, k.tensor);
    }
    module_.set_attribute(name, std::move(copy), attr.kind);
  }
  unsnapshotted_by_storage_.erase(shared);
}

namespace {

c10::IValue unwrap_all(const c10::IValue& v) {
  auto [leaves, spec] = tree_flatten(v, "output");
  std::vector<c10::IValue> real;
  real.reserve(leaves.size());
  for (const at::Tensor& t : leaves) real.emplace_back(unwrap_tracing_tensor(t));
  return spec.unflatten(real);
}

// A copy of `t` with its sizes and strides, overlapping ones included: the
// program must see the layout the graph records (Note [Inputs in the traced
// layout] in interpreter.cpp); clone() makes a tensor that is not dense
// contiguous. The elements `t` spans are copied as one flat run.
at::Tensor copy_in_layout(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense() || t.layout() != c10::kStrided || t.is_meta()) {
    return t.clone();  // keeps the strides
  }
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return at::empty_strided(t.sizes(), t.strides(), t.options());
    span += (t.size(d) - 1) * t.stride(d);
  }
  at::Tensor flat = t.as_strided({span}, {1}, t.storage_offset()).clone();
  return flat.as_strided(t.sizes(), t.strides(), 0);
}

// A program that calls backward() (or torch::autograd::grad) while traced
// hears from LibTorch that its tensor "does not require grad": the tracer
// runs it under no-grad. Say what is going on instead.
void throw_if_differentiating(const c10::Error& e) {
  const std::string message = e.what_without_backtrace();
  for (const char* phrase : {"does not require grad and does not have a grad_fn",
                             "One of the differentiated Tensors does not require grad"}) {
    if (message.find(phrase) == std::string::npos) continue;
    throw TraceError(
        "the program computes gradients (backward() or torch::autograd::grad) while traced: "
        "a trace records the forward computation, under no-grad, and captures no gradients. To "
        "capture a training step (forward, backward and the optimizer's update) use "
        "export_training (training.h). (LibTorch: " + message.substr(0, message.find('\n')) + ")");
  }
}

}  // namespace

ModuleTensors::ModuleTensors(const ModuleState& state) {
  sorted_.reserve(state.parameters.size() + state.buffers.size());
  for (const auto& [name, t] : state.parameters) {
    if (t.defined()) sorted_.push_back({t.unsafeGetTensorImpl(), ModuleTensor{&name, AttributeKind::Parameter}});
  }
  for (const auto& [name, t] : state.buffers) {
    if (t.defined()) sorted_.push_back({t.unsafeGetTensorImpl(), ModuleTensor{&name, AttributeKind::Buffer}});
  }
  // Stable, so that of tied tensors the first named comes first and stays.
  auto by_address = [](const auto& a, const auto& b) {
    return std::less<const c10::TensorImpl*>()(a.first, b.first);
  };
  std::stable_sort(sorted_.begin(), sorted_.end(), by_address);
  auto same = [](const auto& a, const auto& b) { return a.first == b.first; };
  sorted_.erase(std::unique(sorted_.begin(), sorted_.end(), same), sorted_.end());
}

const ModuleTensor* ModuleTensors::find(const c10::TensorImpl* t) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), t,
                             [](const auto& e, const c10::TensorImpl* key) {
                               return std::less<const c10::TensorImpl*>()(e.first, key);
                             });
  return it != sorted_.end() && it->first == t ? &it->second : nullptr;
}

TraceResult run_trace(const TracedFunction& fn, const std::vector<c10::IValue>& inputs,
                      const TraceOptions& options, const ModuleState& state) {
  if (!options.dynamic.empty()) {
    auto trace_at = [&](const std::vector<c10::IValue>& at_inputs, TraceAtOptions how) {
      TraceOptions fixed = options;
      fixed.dynamic.clear();
      fixed.meta = fixed.meta || how.meta;
      if (how.structure_only) fixed.record_stack_traces = false;
      return run_trace(fn, at_inputs, fixed, state);
    };
    return trace_dynamic(trace_at, inputs, options.dynamic, /*meta_allowed=*/true);
  }
  ensure_tracer_registered();
  if (options.meta) ensure_meta_kernels();  // Note [Meta kernels LibTorch 1.13 lacks]
  TraceState st(options, ModuleTensors(state));
  Graph& g = st.graph();

  // Inputs: one immutable placeholder per tensor, in flattening order.
  auto [leaves, in_spec] = tree_flatten(c10::ivalue::Tuple::create(inputs), "input");
  if (std::string problem = options.call.mismatch(in_spec); !problem.empty()) {
    throw TypeError("the argument names given for the trace do not fit its inputs: " + problem);
  }
  const std::vector<std::string> leaf_names = options.call.leaf_names(in_spec);
  std::vector<c10::IValue> wrapped;
  wrapped.reserve(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    const at::Tensor& t = leaves[i];
    if (is_tracing_tensor(t)) {
      throw TraceError("input tensor " + std::to_string(i) +
                       " is a traced tensor of another trace; pass real tensors as inputs");
    }
    if (t.layout() != c10::kStrided) {
      throw TraceError("input tensor " + std::to_string(i) + " is a " + c10::str(t.layout()) +
                       " tensor; torchcap traces strided (dense) tensors only. Pass the dense one "
                       "(to_dense()) and convert inside the program if it needs another layout");
    }
    Node* ph = g.placeholder(i < leaf_names.size() ? leaf_names[i] : "ph_" + std::to_string(i));
    TensorMeta meta = TensorMeta::of(t);
    if (options.meta) {
      // A meta input is a shape: it stands for a CPU tensor. The program
      // works on a meta tensor, which nothing writes to the caller's.
      if (meta.device.is_meta()) meta.device = c10::Device(c10::kCPU);
      ph->meta().val = ValueMeta::tensor(meta);
      at::Tensor value = t.is_meta() ? t.detach()
                                     : at::empty_strided(t.sizes(), t.strides(),
                                                         t.options().device(c10::kMeta));
      wrapped.emplace_back(make_tracing_tensor(value, ph, st.id(),
                                               /*immutable=*/!options.allow_input_mutation,
                                               meta.device));
      continue;
    }
    ph->meta().val = ValueMeta::tensor(meta);
    // Writable inputs are copies: the caller's tensors keep their values.
    at::Tensor value = options.allow_input_mutation ? copy_in_layout(t.detach()) : t.detach();
    wrapped.emplace_back(
        make_tracing_tensor(value, ph, st.id(), /*immutable=*/!options.allow_input_mutation));
  }
  auto args = in_spec.unflatten(wrapped).toTupleRef().elements().vec();

  c10::IValue result;
  {
    TracingSession session(&st, options.inference_mode);
    try {
      result = fn(std::move(args));
    } catch (const c10::Error& e) {
      throw_if_differentiating(e);
      throw;
    }
  }

  // Outputs: tensors (or none), rebuilt by the output spec.
  auto [out_leaves, out_spec] = tree_flatten(result, "output");
  std::vector<TreeSpec> stack = {out_spec};
  while (!stack.empty()) {
    TreeSpec s = std::move(stack.back());
    stack.pop_back();
    if (s.kind() == TreeSpec::Kind::Constant) {
      throw TypeError("the traced function returned " + s.str() +
                      " among its outputs; outputs must be tensors or None, or tuples, lists and "
                      "dicts of them");
    }
    for (const TreeSpec& c : s.children()) stack.push_back(c);
  }
  ArgumentList results;
  results.reserve(out_leaves.size());
  {
    c10::impl::ExcludeDispatchKeyGuard no_tracer(kTracerKey);
    for (size_t i = 0; i < out_leaves.size(); ++i) {
      results.emplace_back(st.node_for(out_leaves[i], "output " + std::to_string(i)));
    }
  }
  g.output(std::move(results));

  TraceResult traced{std::move(st.module()), unwrap_all(result)};
  traced.module.set_specs(std::move(in_spec), std::move(out_spec));
  traced.module.call = options.call;
  return traced;
}

void throw_forward_arity(size_t expected, size_t given) {
  throw InputError("the module's forward takes " + std::to_string(expected) + " argument(s), got " +
                   std::to_string(given) + " input(s)");
}

}  // namespace detail

ModuleState ModuleState::of(torch::nn::Module& module) {
  ModuleState state;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) state.parameters.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) state.buffers.emplace_back(b.key(), b.value());
  return state;
}

GraphModule detail::trace_function(const TracedFunction& fn, const std::vector<c10::IValue>& inputs,
                                   const TraceOptions& options) {
  return detail::run_trace(fn, inputs, options, {}).module;
}

GraphModule trace(const ModuleState& state, const TracedFunction& fn,
                  const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  return detail::run_trace(fn, inputs, options, state).module;
}

GraphModule trace(torch::nn::Module& module, const TracedFunction& forward,
                  const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  return detail::run_trace(forward, inputs, options, ModuleState::of(module)).module;
}

TraceResult trace_with_outputs(const ModuleState& state, const TracedFunction& fn,
                               const std::vector<c10::IValue>& inputs, const TraceOptions& options) {
  return detail::run_trace(fn, inputs, options, state);
}

}  // namespace torchcap
