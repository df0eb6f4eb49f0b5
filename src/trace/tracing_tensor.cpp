#include <torchcap/error.h>
#include <torchcap/node.h>

#include "trace/dispatch_key.h"
#include "trace/trace_state.h"
#include "trace/tracing_tensor.h"

#include <ATen/core/Formatting.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include <dlfcn.h>
#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include <sstream>
#include <typeinfo>

namespace torchcap {
namespace {

// The backend of the real tensor goes onto the wrapper; nothing else
// (conjugate and negative bits are handled when the real operator runs on the
// real tensor).
constexpr c10::DispatchKeySet kPropagatedKeys({c10::DispatchKey::CPU, c10::DispatchKey::CUDA});

// Note [Wrappers are subclass-like]
// LibTorch's composite operators that run above the tracer (at the autograd
// key, before it sees them) take a fast path on ordinary tensors that reads
// their memory directly: max_pool1d, ctc_loss, linalg_eigvals, tensor_split
// with tensor indices, ... A wrapper has no memory of its own, so that path
// failed with LibTorch's "Cannot access data pointer of Tensor that doesn't
// have storage". For tensors without storage of their own (Python
// subclasses, make_fx's among them) these composites take a path of
// operators instead, asking `at::isTensorSubclassLike`, which in 1.13 is true
// for a tensor whose key set holds the Meta backend bit. So a wrapper carries
// that bit, beside its real backend's. Nothing reads the bit as a device:
// is_meta(), is_cpu() and device() read the wrapper's device, which stays the
// one it reports. Autograd's key for the wrapper becomes AutogradMeta, whose
// kernels are those of every backend (the Autograd alias), and under the
// tracer's no-grad they only pass the call down.
constexpr c10::DispatchKeySet kSubclassLike(c10::BackendComponent::MetaBit);

c10::DispatchKeySet wrapper_keys(const at::Tensor& value, c10::optional<c10::Device> device) {
  const c10::DispatchKeySet tracer = c10::DispatchKeySet(detail::kTracerKey) | kSubclassLike;
  if (!device) return tracer | (value.key_set() & kPropagatedKeys);
  c10::DispatchKeySet backend;
  if (device->is_cpu()) backend = c10::DispatchKeySet(c10::DispatchKey::CPU);
  if (device->is_cuda()) backend = c10::DispatchKeySet(c10::DispatchKey::CUDA);
  return tracer | backend;
}

}  // namespace

TracingTensorImpl::TracingTensorImpl(at::Tensor value, Node* node, uint64_t trace_id,
                                     bool immutable, c10::optional<c10::Device> device)
    : c10::TensorImpl(wrapper_keys(value, device), value.dtype(), device ? *device : value.device()),
      value_(std::move(value)),
      node_(node),
      trace_id_(trace_id),
      immutable_(immutable) {
  TORCH_INTERNAL_ASSERT(value_.defined(), "a tracing tensor needs a defined value");
  TORCH_INTERNAL_ASSERT(!is_tracing_tensor(value_), "tracing tensors do not nest");
  set_storage_access_should_throw();
  refresh_metadata();
}

void TracingTensorImpl::rebind(Node* node) {
  node_ = node;
  source_ = nullptr;
  source_index_ = -1;
}

void TracingTensorImpl::rebind_to_output(Node* source, int64_t index) {
  node_ = nullptr;
  source_ = source;
  source_index_ = index;
}

void TracingTensorImpl::refresh_metadata() {
  sizes_and_strides_.set_sizes(value_.sizes());
  sizes_and_strides_.set_strides(value_.strides());
  refresh_numel();
  refresh_contiguous();
}

// Note [Raw writes into a fresh tensor]
// Some LibTorch code builds a tensor by allocating it and writing its memory
// directly: TorchScript's torch.tensor([...]) / torch.as_tensor(list) make an
// empty tensor and store the list's numbers through data_ptr(). While a trace
// captures factories, that empty tensor is a wrapper, whose storage cannot be
// reached, and the graph would hold an `empty` node whose values nothing
// recorded. Raw access starts with has_storage(), which is virtual: when it is
// asked of a wrapper whose value is a factory's fresh result (a call with no
// graph values among its arguments, so its value depends on no input), the
// tracer lifts the real tensor as a `_tensor_constant` attribute, rebinds the
// wrapper to that get_attr node, and exposes the real tensor's storage. The
// writes land in the constant, which the graph module keeps; operators after
// them use the constant.
//
// Note [Raw reads of traced tensors]
// Any other raw access to a wrapper's memory during its trace reads values
// the graph would then hold as constants: `.data_ptr()`, `.tolist()`,
// `.numpy()`, an accessor in C++, or a LibTorch function that reads memory
// itself above the tracer. That is refused with a TraceError naming the
// operator being run (read off the stack, where there is one) and the
// program's line, as `.item()` is; with allow_data_dependent_values the
// real tensor's memory is exposed for reading, and the values are baked in,
// as `.item()`'s are. A wrapper whose trace has ended computes but has no
// memory to show.
bool TracingTensorImpl::has_storage() const {
  if (storage_exposed_) return true;
  try {
    return expose_storage();
  } catch (const Error& e) {
    detail::note_operator_error(e);  // Note [Errors raised inside operators]
    throw;
  }
}

bool TracingTensorImpl::expose_storage() const {
  detail::TraceState* st = detail::current_trace();
  if (st == nullptr || st->id() != trace_id_) {
    if (detail::is_running_elsewhere(trace_id_)) {
      throw TraceError("the memory of a traced tensor was read on a thread that is not tracing it; "
                       "a trace records the operators of its own thread only. Compute on the "
                       "tracing thread");
    }
    throw Error("this traced tensor belongs to a trace that has ended; it has no memory of its "
                "own. Use the values the traced program returned, or run the graph");
  }
  auto* self = const_cast<TracingTensorImpl*>(this);
  const bool fresh = node_ != nullptr && node_->op() == OpCode::CallFunction && node_->inputs().empty();
  if (!fresh) {
    // Note [Values no input can change] (tracer.cpp): a constant's memory is
    // read as .item() reads it.
    const bool constant = !st->meta() && st->is_constant_value(at::Tensor(
        c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(self)));
    if (!constant && (!st->options().allow_data_dependent_values || st->meta())) throw_raw_read(*st);
    // Read access to the values, which the graph will hold baked in; each
    // run checks them (Note [Guards of values the program read] in
    // kernels/guards.cpp).
    if (!constant) guard_raw_read(*st);
    self->expose(value_);
    return true;
  }
  // In meta mode the factory made no memory: the constant gets real memory,
  // on the device the program asked for, and the writes land there.
  at::Tensor written = value_;
  {
    c10::impl::ExcludeDispatchKeyGuard no_tracer(detail::kTracerKey);
    if (value_.is_meta() && !device().is_meta()) {
      written = at::empty_strided(value_.sizes(), value_.strides(),
                                  value_.options().device(device()));
    }
    self->rebind(st->node_for(written, "a tensor built by raw writes"));
  }
  self->expose(written);
  return true;
}

void TracingTensorImpl::guard_raw_read(detail::TraceState& st) const {
  c10::impl::ExcludeDispatchKeyGuard no_tracer(detail::kTracerKey);
  static const c10::OperatorHandle guard =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchcap::guard_values", "");
  if (node_ == nullptr && source_ == nullptr) return;
  auto* self = const_cast<TracingTensorImpl*>(this);
  Node* read = st.node_for(at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(self)),
                           "a tensor read directly");
  Node* expected = st.node_for(value_.clone(), "the traced values of a tensor read directly");
  Node* check = st.graph().call_function(
      guard, {Argument(read), Argument(expected),
              Argument(".tolist(), .numpy() or a data pointer" + st.program_location())});
  check->meta().stack_trace = read->meta().stack_trace;
}

void TracingTensorImpl::expose(const at::Tensor& memory) {
  storage_ = memory.storage();
  storage_offset_ = memory.storage_offset();
  storage_exposed_ = true;
  // storage() too, which NumPy's conversion asks for.
  storage_access_should_throw_ = false;
}

void TracingTensorImpl::throw_raw_read(detail::TraceState& st) const {
  std::vector<std::string> ops = detail::operators_on_stack();
  Node* n = node_ != nullptr ? node_ : source_;
  std::string tensor = n == nullptr ? "a traced tensor" : "traced tensor %" + n->name();
  std::string what;
  if (ops.empty()) {
    what = "The program reads the memory of " + tensor +
           " directly (.data_ptr(), .tolist(), .numpy(), an accessor), so its values would be "
           "baked into the graph.";
  } else {
    std::string via = ops.size() > 1 ? " (through " + ops.front() + ")" : "";
    what = ops.back() + via + " reads the memory of " + tensor +
           " directly: LibTorch implements it above the tracer, on raw memory, so the tracer "
           "cannot record it, and its values would be baked into the graph.";
  }
  if (st.meta()) {
    throw TraceError(what + " In meta mode tensors have no values: trace without meta mode, and "
                            "compute with tensor operators" + st.program_location());
  }
  throw TraceError(what + " Compute with tensor operators, or set "
                          "TraceOptions::allow_data_dependent_values to read the values and bake "
                          "them in" + st.program_location());
}

namespace {

// Thrown where the program's call may come through torch's Python bindings
// (Note [Errors raised inside operators] in trace_state.h).
[[noreturn]] void refuse(const std::string& message) {
  TraceError e(message);
  detail::note_operator_error(e);
  throw e;
}

}  // namespace

void TracingTensorImpl::set_size(int64_t, int64_t) {
  refuse("cannot set the size of a traced tensor; use an operator such as resize_");
}

void TracingTensorImpl::set_stride(int64_t, int64_t) {
  refuse("cannot set the stride of a traced tensor; use an operator such as as_strided");
}

void TracingTensorImpl::set_storage_offset(int64_t) {
  refuse("cannot set the storage offset of a traced tensor");
}

void TracingTensorImpl::shallow_copy_from(const c10::intrusive_ptr<TensorImpl>&) {
  refuse("cannot replace the data of a traced tensor (Tensor::set_data); its value is the result "
         "of a recorded operator");
}

c10::intrusive_ptr<c10::TensorImpl> TracingTensorImpl::copy_with(
    c10::VariableVersion version_counter, bool allow_tensor_metadata_change) const {
  auto copy = c10::make_intrusive<TracingTensorImpl>(
      value_, node_, trace_id_, immutable_,
      device() != value_.device() ? c10::make_optional(device()) : c10::nullopt);
  copy->source_ = source_;
  copy->source_index_ = source_index_;
  if (storage_exposed_) copy->expose_from(*this);
  // Inference tensors carry no version counter and may not be given one.
  if (!copy->is_inference()) copy->set_version_counter(std::move(version_counter));
  copy->set_allow_tensor_metadata_change(allow_tensor_metadata_change);
  return copy;
}

c10::intrusive_ptr<c10::TensorImpl> TracingTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  return copy_with(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> TracingTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return copy_with(std::move(version_counter), allow_tensor_metadata_change);
}

const char* TracingTensorImpl::tensorimpl_type_name() const { return "TracingTensorImpl"; }

// The tracer's key alone does not tell a wrapper: tensors that wrap one copy
// its keys (Note [Wrappers around traced tensors]). The class is final, so
// comparing the exact type answers what a dynamic_cast would, without the
// walk of the class hierarchy that made dynamic_cast a visible part of a
// trace's time (several calls per operator).
TracingTensorImpl* maybe_get_tracing_impl(const at::TensorBase& t) {
  if (!t.defined()) return nullptr;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->key_set().has(detail::kTracerKey) || typeid(*impl) != typeid(TracingTensorImpl)) {
    return nullptr;
  }
  return static_cast<TracingTensorImpl*>(impl);
}

bool is_tracing_tensor(const at::TensorBase& t) { return maybe_get_tracing_impl(t) != nullptr; }

at::Tensor make_tracing_tensor(at::Tensor value, Node* node, uint64_t trace_id, bool immutable,
                               c10::optional<c10::Device> device) {
  return at::Tensor(c10::make_intrusive<TracingTensorImpl>(std::move(value), node, trace_id,
                                                           immutable, device));
}

at::Tensor unwrap_tracing_tensor(const at::Tensor& t) {
  TracingTensorImpl* impl = maybe_get_tracing_impl(t);
  return impl != nullptr ? impl->value() : t;
}

std::string describe_tensor(const at::Tensor& t) {
  TracingTensorImpl* impl = maybe_get_tracing_impl(t);
  std::ostringstream os;
  if (impl == nullptr) {
    os << t;
    return os.str();
  }
  // Printing runs operators; keep the tracer out of them.
  c10::impl::ExcludeDispatchKeyGuard no_tracer(detail::kTracerKey);
  os << "TracedTensor(";
  // Nodes are only safe to read while their trace is active on this thread.
  const detail::TraceState* st = detail::current_trace();
  if (st == nullptr || st->id() != impl->trace_id()) {
    os << "from another trace, ";
  } else if (impl->node() != nullptr) {
    os << "%" << impl->node()->name() << ", ";
  } else if (impl->source() != nullptr) {
    os << "%" << impl->source()->name() << "[" << impl->source_index() << "], ";
  }
  os << TensorMeta::of(impl->value()).str() << (impl->is_immutable() ? ", immutable" : "")
     << ", value=\n"
     << impl->value() << ")";
  return os.str();
}

namespace detail {
namespace {


// "aten::add.Tensor" for the struct name "add_Tensor" of at::_ops, whose
// name joins the operator's and its overload's with '_' (and operator names
// hold '_' too): the split that names a registered operator.
std::string aten_operator_of(const std::string& ops_struct) {
  auto& d = c10::Dispatcher::singleton();
  if (d.findSchema({"aten::" + ops_struct, ""})) return "aten::" + ops_struct;
  for (size_t at = ops_struct.rfind('_'); at != std::string::npos && at > 0;
       at = ops_struct.rfind('_', at - 1)) {
    c10::OperatorName name{"aten::" + ops_struct.substr(0, at), ops_struct.substr(at + 1)};
    if (d.findSchema(name)) return name.name + "." + name.overload_name;
    if (at == 0) break;
  }
  return "aten::" + ops_struct;
}

}  // namespace

std::vector<std::string> operators_on_stack() {
  void* pcs[128];
  int n = unw_backtrace(pcs, 128);
  std::vector<std::string> ops;
  const std::string prefix = "at::_ops::";
  for (int i = 0; i < n; ++i) {
    Dl_info info;
    if (dladdr(static_cast<char*>(pcs[i]) - 1, &info) == 0 || info.dli_sname == nullptr) continue;
    std::string fn = c10::demangle(info.dli_sname);
    if (fn.compare(0, prefix.size(), prefix) != 0) continue;
    size_t end = fn.find("::", prefix.size());
    if (end == std::string::npos) continue;
    std::string op = aten_operator_of(fn.substr(prefix.size(), end - prefix.size()));
    if (ops.empty() || ops.back() != op) ops.push_back(op);
  }
  return ops;
}

}  // namespace detail

}  // namespace torchcap
