#include <torchcap/error.h>
#include <torchcap/node.h>
#include <torchcap/tracing_tensor.h>

#include "trace/dispatch_key.h"
#include "trace/trace_state.h"

#include <ATen/core/Formatting.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <sstream>
#include <typeinfo>

namespace torchcap {
namespace {

// The backend of the real tensor goes onto the wrapper, so that autograd picks
// the matching Autograd<Backend> key; nothing else (conjugate and negative
// bits are handled when the real operator runs on the real tensor).
constexpr c10::DispatchKeySet kPropagatedKeys({c10::DispatchKey::CPU, c10::DispatchKey::CUDA});

c10::DispatchKeySet wrapper_keys(const at::Tensor& value, c10::optional<c10::Device> device) {
  if (!device) return c10::DispatchKeySet(detail::kTracerKey) | (value.key_set() & kPropagatedKeys);
  c10::DispatchKeySet backend;
  if (device->is_cpu()) backend = c10::DispatchKeySet(c10::DispatchKey::CPU);
  if (device->is_cuda()) backend = c10::DispatchKeySet(c10::DispatchKey::CUDA);
  return c10::DispatchKeySet(detail::kTracerKey) | backend;
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
// them use the constant. Any other wrapper keeps refusing raw access.
bool TracingTensorImpl::has_storage() const {
  if (storage_exposed_) return true;
  detail::TraceState* st = detail::current_trace();
  if (st == nullptr || st->id() != trace_id_ || node_ == nullptr ||
      node_->op() != OpCode::CallFunction || !node_->inputs().empty()) {
    return false;
  }
  auto* self = const_cast<TracingTensorImpl*>(this);
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
  self->storage_ = written.storage();
  self->storage_offset_ = written.storage_offset();
  self->storage_exposed_ = true;
  return true;
}

void TracingTensorImpl::set_size(int64_t, int64_t) {
  throw TraceError("cannot set the size of a traced tensor; use an operator such as resize_");
}

void TracingTensorImpl::set_stride(int64_t, int64_t) {
  throw TraceError("cannot set the stride of a traced tensor; use an operator such as as_strided");
}

void TracingTensorImpl::set_storage_offset(int64_t) {
  throw TraceError("cannot set the storage offset of a traced tensor");
}

void TracingTensorImpl::shallow_copy_from(const c10::intrusive_ptr<TensorImpl>&) {
  throw TraceError(
      "cannot replace the data of a traced tensor (Tensor::set_data); its value is the result "
      "of a recorded operator");
}

c10::intrusive_ptr<c10::TensorImpl> TracingTensorImpl::copy_with(
    c10::VariableVersion version_counter, bool allow_tensor_metadata_change) const {
  auto copy = c10::make_intrusive<TracingTensorImpl>(
      value_, node_, trace_id_, immutable_,
      device() != value_.device() ? c10::make_optional(device()) : c10::nullopt);
  copy->source_ = source_;
  copy->source_index_ = source_index_;
  if (storage_exposed_) {
    copy->storage_ = storage_;
    copy->storage_offset_ = storage_offset_;
    copy->storage_exposed_ = true;
  }
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
// walk of the class hierarchy that made dynamic_cast about 2 % of a trace's
// time (several calls per operator).
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

}  // namespace torchcap
