// A node of a torchcap graph (torch.fx's `Node`).
//
// Ownership: a Node belongs to exactly one Graph, which creates it, keeps it in
// order and destroys it. Users hold `Node*` that stay valid until the node is
// erased or the graph is destroyed.
//
// Edges: a node's inputs are derived from its arguments and kept consistent
// with every input's `users()` by one write path (`set_args`/`set_kwargs`);
// every edit goes through it, so edges never drift (docs/STYLE.md 2).
#pragma once

#include <torchcap/argument.h>
#include <torchcap/meta.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

namespace torchcap {

class Graph;
namespace detail {
struct OperatorIdentity;
struct OperatorFacts;
}

enum class OpCode : uint8_t { Placeholder, GetAttr, CallFunction, Output };

// "placeholder", "get_attr", "call_function", "output".
const char* opcode_name(OpCode op);

// The one call_function target that is not an operator: take output `i` of a
// node that produces several values (FX's `operator.getitem`).
inline constexpr const char* kGetItem = "getitem";

// Size computations, the integer-valued nodes of dynamic graphs (symbolic.h),
// as torch.fx's symbolic traces spell them: `sym_size(x, d)` is dimension d of
// tensor x (aten.sym_size), and `add`, `sub`, `mul`, `floordiv` combine two
// integers, each a size computation or a constant (operator.add, ...). They
// feed the integer arguments of operators (view's sizes, arange's end).
inline constexpr const char* kSymSize = "sym_size";
// Whether `target` names a size computation.
bool is_size_target(const std::string& target);

class Node {
 public:
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  Graph* owning_graph() const { return graph_; }
  OpCode op() const { return op_; }
  // Unique in the graph, a valid Python identifier.
  const std::string& name() const { return name_; }

  // placeholder: its name; get_attr: the attribute path ("layer1.0.conv1.weight");
  // call_function: the qualified operator name with overload ("aten::add.Tensor",
  // "aten::addmm"), kGetItem or a size computation's; output: "output".
  const std::string& target() const;
  bool is_getitem() const { return op_ == OpCode::CallFunction && !handle_ && !size_computation_; }
  // A size computation (kSymSize, add, sub, mul, floordiv): its value is an integer.
  bool is_size_computation() const { return size_computation_; }
  // A call_function of an operator (not getitem).
  bool is_operator() const { return handle_.has_value(); }
  // The operator, resolved once when the node was created. Only for is_operator().
  const c10::OperatorHandle& op_handle() const;
  const c10::FunctionSchema& schema() const;
  // What torchcap knows of the operator (internal: src/graph/operator_facts.h),
  // looked up on first use. Only for is_operator().
  const detail::OperatorFacts& facts() const;

  const ArgumentList& args() const { return args_; }
  const Kwargs& kwargs() const { return kwargs_; }
  // The value of keyword argument `name`, or nullptr.
  const Argument* kwarg(const std::string& name) const;

  // The one write path for edges: replaces the arguments and updates inputs and
  // every affected node's users.
  void set_args(ArgumentList args);
  void set_kwargs(Kwargs kwargs);
  void set_arg(size_t i, Argument a);
  // Replaces every reference to `old_input` in this node's arguments.
  void replace_input_with(Node* old_input, Node* new_input);
  // Makes every user of this node use `replacement` instead; returns the users
  // that changed. `replacement` must not be this node.
  std::vector<Node*> replace_all_uses_with(Node* replacement);

  // Distinct nodes referenced by the arguments, in order of first appearance.
  // Like users(), a view, valid until the edges change: copy it (`.vec()`)
  // to edit the graph while walking it.
  c10::ArrayRef<Node*> inputs() const { return inputs_; }
  // Distinct nodes that reference this node, in the order they started to.
  c10::ArrayRef<Node*> users() const { return users_; }

  NodeMeta& meta() { return meta_; }
  const NodeMeta& meta() const { return meta_; }

  // Neighbours in graph order; nullptr at either end.
  Node* prev() const;
  Node* next() const;

  // Whether running this node has an effect besides its result: the output,
  // placeholders, and operators whose schema writes an argument or returns nothing.
  bool has_side_effects() const;

 private:
  friend struct GraphTestPeer;  // tests corrupt graphs to exercise lint
  friend class Graph;
  // `identity` is the operator's (detail::operator_identity) when `handle` is
  // set, else null; `target` is then empty.
  Node(Graph* graph, OpCode op, std::string name, std::string target,
       std::optional<c10::OperatorHandle> handle, const detail::OperatorIdentity* identity);
  // Inline up to a few: most nodes read one to three values and are read by
  // one or two, and a trace or a load makes thousands of nodes.
  using Inputs = c10::SmallVector<Node*, 3>;
  using Users = c10::SmallVector<Node*, 2>;
  Inputs collect_inputs(const ArgumentList& args, const Kwargs& kwargs) const;
  void commit_inputs(Inputs fresh);
  void remove_user(Node* user);

  Graph* graph_;
  OpCode op_;
  bool size_computation_ = false;
  std::string name_;
  // The target of nodes that do not call an operator; empty for those that do.
  std::string target_;
  std::optional<c10::OperatorHandle> handle_;
  // For operator nodes, the operator's name and target, shared by every node
  // that calls it. Kept beside the handle: if the operator is deregistered,
  // the handle dangles but lint can still look the name up and report it.
  const detail::OperatorIdentity* operator_ = nullptr;
  // The operator's facts, once asked for (threads may race to set the same
  // pointer; the facts live until the process ends).
  mutable std::atomic<const detail::OperatorFacts*> facts_{nullptr};
  ArgumentList args_;
  Kwargs kwargs_;
  Inputs inputs_;
  Users users_;
  NodeMeta meta_;
  // Intrusive list, owned by the graph; the graph's sentinel closes the ring.
  Node* prev_ = nullptr;
  Node* next_ = nullptr;
};

}  // namespace torchcap
