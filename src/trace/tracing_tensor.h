// The wrapper tensor the tracer hands to traced code (EXIR's PythonTensor,
// shaped after functorch's BatchedTensorImpl).
//
// A TracingTensorImpl holds the real tensor (`value`), the graph node that
// produced its current value, and whether it is immutable (a graph input, or a
// view of one). It reports the real tensor's sizes, strides, dtype and device
// (in meta mode the value is a meta tensor and the device is the one the real
// program would use, see TraceOptions::meta);
// touching its storage throws, because raw reads and writes would bypass the
// tracer (one exception: a tensor a factory just made, see Note [Raw writes
// into a fresh tensor] in tracing_tensor.cpp); metadata setters throw too. Every aten operator on it reaches the
// tracer's dispatch handler, which runs the operator on the real tensors and
// records it.
//
// Lifetime: the wrapper owns its value. Its node belongs to the graph of the
// trace that made it, identified by `trace_id`; the node is only dereferenced
// while that trace is active, so a wrapper may outlive its trace safely.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <c10/util/Optional.h>

#include <cstdint>
#include <string>

namespace torchcap {

class Node;
namespace detail {
class TraceState;
}

class TracingTensorImpl final : public c10::TensorImpl {
 public:
  // `device`: the device the wrapper reports, when it is not the value's.
  TracingTensorImpl(at::Tensor value, Node* node, uint64_t trace_id, bool immutable,
                    c10::optional<c10::Device> device = c10::nullopt);

  const at::Tensor& value() const { return value_; }
  // The node whose result this tensor's value is; null for one output of a
  // multi-output node whose getitem node has not been made yet (see source()).
  Node* node() const { return node_; }
  // For an output of a multi-output node: that node and the output's index.
  Node* source() const { return source_; }
  int64_t source_index() const { return source_index_; }
  uint64_t trace_id() const { return trace_id_; }
  bool is_immutable() const { return immutable_; }

  // Points the tensor at a new node: after an in-place or out= op the tensor's
  // value is that op's result (Note [Proxy rebinding for in-place ops]).
  void rebind(Node* node);
  void rebind_to_output(Node* source, int64_t index);
  // Re-reads sizes and strides from the value (after resize_ or out= ops).
  void refresh_metadata();

  // Setters that make no sense for a wrapper throw.
  void set_size(int64_t dim, int64_t new_size) override;
  void set_stride(int64_t dim, int64_t new_stride) override;
  void set_storage_offset(int64_t storage_offset) override;
  void shallow_copy_from(const c10::intrusive_ptr<TensorImpl>& impl) override;
  // Asked before any raw access to the data (Tensor::data_ptr).
  bool has_storage() const override;

  // Views made above the tracer (autograd's ADInplaceOrView) copy the wrapper
  // through these: the copy shares value, node and immutability.
  c10::intrusive_ptr<TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;

 private:
  const char* tensorimpl_type_name() const override;
  bool expose_storage() const;
  // Raw access to `memory`'s storage from now on (Note [Raw writes into a
  // fresh tensor], Note [Raw reads of traced tensors]).
  void expose(const at::Tensor& memory);
  void expose_from(const TracingTensorImpl& other) {
    storage_ = other.storage_;
    storage_offset_ = other.storage_offset_;
    storage_exposed_ = true;
    storage_access_should_throw_ = false;
  }
  [[noreturn]] void throw_raw_read(detail::TraceState& st) const;
  // Records the check of the values a raw read bakes in (Note [Guards of
  // values the program read] in kernels/guards.cpp).
  void guard_raw_read(detail::TraceState& st) const;
  c10::intrusive_ptr<TensorImpl> copy_with(c10::VariableVersion version_counter,
                                           bool allow_tensor_metadata_change) const;

  at::Tensor value_;
  Node* node_ = nullptr;
  Node* source_ = nullptr;
  int64_t source_index_ = -1;
  uint64_t trace_id_ = 0;
  bool immutable_ = false;
  bool storage_exposed_ = false;
};

// Free helpers (functorch's isBatchedTensor / maybeGetBatchedImpl / makeBatched).
bool is_tracing_tensor(const at::TensorBase& t);
// The wrapper's impl, or nullptr for any other tensor.
TracingTensorImpl* maybe_get_tracing_impl(const at::TensorBase& t);
// Wraps `value` (detached) as produced by `node` in trace `trace_id`;
// `device`, when given, is the device the wrapper reports (meta mode).
at::Tensor make_tracing_tensor(at::Tensor value, Node* node, uint64_t trace_id, bool immutable,
                               c10::optional<c10::Device> device = c10::nullopt);
// The real tensor inside a wrapper; any other tensor is returned as is.
at::Tensor unwrap_tracing_tensor(const at::Tensor& t);

// "TracedTensor(%addmm, f32[2, 10], value=...)" for wrappers, with the real
// values; printing a wrapper with operator<< would need its storage.
std::string describe_tensor(const at::Tensor& t);

}  // namespace torchcap
