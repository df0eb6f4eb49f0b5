// The state of one active trace, shared by the tracer entry points and the
// dispatch handler. Internal.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/tracer.h>

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torchcap {
namespace detail {

// What torchcap knows of an operator (graph/operator_facts.h), which the
// tracer looks up once per trace (Note [Operator facts, looked up once] in
// dispatch.cpp).
struct OperatorFacts;

// A named tensor of the traced module: a parameter or a buffer. `name`
// points into the ModuleState the trace was given, which outlives it.
struct ModuleTensor {
  const std::string* name;
  AttributeKind kind;
};

// The traced module's named tensors by identity; tied tensors keep the first
// name. One sorted array, built per trace: a hash map would allocate a node
// per parameter, and each is looked up once per trace.
class ModuleTensors {
 public:
  ModuleTensors() = default;
  explicit ModuleTensors(const ModuleState& state);

  // The named tensor `t` is, or nullptr.
  const ModuleTensor* find(const c10::TensorImpl* t) const;

 private:
  std::vector<std::pair<const c10::TensorImpl*, ModuleTensor>> sorted_;
};

class TraceState {
 public:
  TraceState(const TraceOptions& options,
             ModuleTensors module_tensors);
  ~TraceState();
  TraceState(const TraceState&) = delete;
  TraceState& operator=(const TraceState&) = delete;

  uint64_t id() const { return id_; }
  const TraceOptions& options() const { return options_; }
  GraphModule& module() { return module_; }
  Graph& graph() { return module_.graph(); }
  bool preserves(const c10::OperatorName& op) const;

  // The node whose value `t` holds: a wrapper's node (making the getitem node
  // of a multi-output node's output on first use), or for a plain tensor the
  // get_attr node of the parameter, buffer or lifted constant it is. `what`
  // names the tensor in errors ("argument 'self' of aten::add.Tensor").
  // `what` is called only for an error.
  Node* node_for(const at::Tensor& t, c10::function_ref<std::string()> what);
  Node* node_for(const at::Tensor& t, const std::string& what) {
    return node_for(t, [&what] { return what; });
  }

  // Note [Values no input can change] (tracer.cpp): whether `t`'s value
  // follows from constants alone (lifted constants, literals, sizes), not
  // from an input's, a parameter's or a buffer's values, or from random
  // numbers: reading it (.item()) reads a constant of the graph.
  bool is_constant_value(const at::Tensor& t);

  // A plain tensor's value is now `node`'s (after an in-place op on it).
  void rebind_plain(const at::Tensor& t, Node* node);

  // A get_attr node for attribute `name` (added to the module) and a traced
  // tensor holding `value` as that node's result.
  at::Tensor attribute_tensor(const std::string& name, const at::Tensor& value, AttributeKind kind);

  // The facts of the operator with `schema`, null until the tracer looks
  // them up (Note [Operator facts, looked up once] in dispatch.cpp). The
  // slot is valid until the next call; the facts, until the process ends.
  const OperatorFacts*& facts(const c10::FunctionSchema* schema) { return facts_[schema]; }

  // While set, nodes take their stack trace from `origin` instead of
  // capturing one: a re-trace keeps the first trace's metadata.
  void set_origin(const Node* origin) { origin_ = origin; }
  const Node* origin() const { return origin_; }

  // Before an operator writes to `t`: an attribute whose memory is about to
  // change keeps its value from before the trace (Note [Attributes written
  // during a trace]).
  void before_write(const at::Tensor& t);

  // Where the program is now, for an error message: "\n" and the program's
  // innermost frames as a traceback (its Python or TorchScript frames when
  // the front end locates sources), or "" when none is known.
  std::string program_location() const;

  // Meta mode (TraceOptions::meta, Note [Meta mode] in dispatch.cpp).
  bool meta() const { return options_.meta; }
  // What the program computes with in place of plain tensor `t` (a
  // parameter, a buffer, a constant): a meta tensor of its dtype, shape and
  // strides, the same one every time (writes to it are then seen by later
  // reads of its metadata). `t` itself when it is on the meta device.
  at::Tensor stand_in(const at::Tensor& t);

 private:
  struct Known {
    at::Tensor tensor;  // strong reference: identity by address needs it alive
    Node* attribute;    // its get_attr node, whose target is the attribute's name
    Node* node;         // the node holding its current value
  };
  Node* getitem_for(Node* source, int64_t index);
  // `t` as the graph holds it: a view of the copy of its memory if an
  // attribute on that memory was written and copied, else `t`.
  at::Tensor snapshot_view(const at::Tensor& t) const;

  uint64_t id_;
  const TraceOptions& options_;
  GraphModule module_;
  ModuleTensors module_tensors_;
  ska::flat_hash_map<c10::TensorImpl*, Known> known_;
  // The known tensors not yet snapshotted, by storage: an in-place write to
  // any other storage (nearly every write) costs one lookup, not a walk over
  // known_.
  ska::flat_hash_map<const c10::StorageImpl*, c10::SmallVector<c10::TensorImpl*, 1>>
      unsnapshotted_by_storage_;
  // The copies of written memory (bytes) the graph's attributes are views of,
  // by the program's storage: a tensor on that memory met only after the
  // write becomes a view of the copy too (TraceState::snapshot_view).
  ska::flat_hash_map<const c10::StorageImpl*, at::Tensor> snapshots_;
  // Meta stand-ins of plain tensors, beside a strong reference to each.
  std::unordered_map<c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> stand_ins_;
  std::unordered_set<std::string> preserve_;
  ska::flat_hash_map<const c10::FunctionSchema*, const OperatorFacts*> facts_;
  int64_t next_constant_ = 0;
  const Node* origin_ = nullptr;
  // is_constant_value's answers by node: a node's value never changes.
  std::unordered_map<const Node*, bool> constant_nodes_;
};

// The trace active on this thread, or nullptr.
TraceState* current_trace();

// Note [Errors raised inside operators]
// A torchcap error thrown inside an operator the program called (a refusal
// of the tracer's kernel, a raw memory read) reaches a Python program as
// the RuntimeError torch's bindings make of any C++ exception, with the
// message and nothing else. So each such error is noted here, by its kind
// and message, as it leaves the tracer, and torchcap's Python front end asks,
// for a RuntimeError that comes out of the traced program, which torchcap
// error it was (torchcap._C.operator_error_kind): errors cross by kind, not
// by phrases matched in their text. The notes are process-wide (the
// exception may surface on another thread than the one that threw it: a
// future's) and few: the oldest are dropped.
void note_operator_error(const std::exception& e);
// The kind ("TraceError", "InputError", "Error", ...) of the noted error
// whose message `message` starts with, forgetting it; "" if none.
std::string take_operator_error_kind(const std::string& message);

// The aten operators whose calls are on this thread's stack, innermost first
// (read from at::_ops symbols; for error messages only, it is slow).
std::vector<std::string> operators_on_stack();

// Whether trace `trace_id` is running, but neither active nor paused on this
// thread (Note [Traced tensors on other threads] in tracer.cpp).
bool is_running_elsewhere(uint64_t trace_id);

// Makes `state` the active trace of this thread, until destroyed (normally or
// by an exception). With `capture_plain_tensors`, operators on plain tensors
// reach the tracer too (the tracer's key is included thread-locally).
class TraceScope {
 public:
  explicit TraceScope(TraceState* state, bool capture_plain_tensors = true);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  TraceState* previous_;
  std::optional<c10::impl::IncludeDispatchKeyGuard> include_tracer_;
};


// Traces `fn` on `inputs`; `state` names the program's parameters and
// buffers. Every public trace() ends here.
TraceResult run_trace(const TracedFunction& fn, const std::vector<c10::IValue>& inputs,
                      const TraceOptions& options, const ModuleState& state);

// The dispatch setup a trace runs under, the first trace and export's
// re-trace alike: no grad; inference mode when asked, with view tracking
// off (Note [Inference mode and view tracking]); `state` active on this
// thread (TraceScope). Restored when destroyed, normally or by an exception.
class TracingSession {
 public:
  TracingSession(TraceState* state, bool inference_mode, bool capture_plain_tensors = true);
  ~TracingSession();
  TracingSession(const TracingSession&) = delete;
  TracingSession& operator=(const TracingSession&) = delete;

 private:
  at::NoGradGuard no_grad_;
  std::optional<c10::InferenceMode> inference_;
  std::optional<c10::impl::ExcludeDispatchKeyGuard> no_view_tracking_;
  TraceScope scope_;
};

// Registers the dispatch handler (once per process).
void ensure_tracer_registered();

}  // namespace detail
}  // namespace torchcap
