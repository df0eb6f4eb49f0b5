#include <torchcap/error.h>
#include <torchcap/graph.h>
#include <torchcap/printer.h>

#include "graph/hidden_writes.h"
#include "graph/operator_facts.h"
#include "graph/operator_name.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <unordered_set>

namespace torchcap {

const char* opcode_name(OpCode op) {
  switch (op) {
    case OpCode::Placeholder:
      return "placeholder";
    case OpCode::GetAttr:
      return "get_attr";
    case OpCode::CallFunction:
      return "call_function";
    case OpCode::Output:
      return "output";
  }
  return "?";
}

Node::Node(Graph* graph, OpCode op, std::string name, std::string target,
           std::optional<c10::OperatorHandle> handle, const detail::OperatorIdentity* identity)
    : graph_(graph),
      op_(op),
      size_computation_(op == OpCode::CallFunction && !handle.has_value() && is_size_target(target)),
      name_(std::move(name)),
      target_(std::move(target)),
      handle_(std::move(handle)),
      operator_(identity) {
  TORCH_INTERNAL_ASSERT(handle_.has_value() == (operator_ != nullptr) &&
                        (operator_ == nullptr || target_.empty()));
}

bool is_size_target(const std::string& target) {
  return target == kSymSize || target == "add" || target == "sub" || target == "mul" ||
         target == "floordiv";
}

const std::string& Node::target() const {
  return operator_ != nullptr ? operator_->qualified : target_;
}

const c10::OperatorHandle& Node::op_handle() const {
  if (!handle_) {
    throw Error("node %" + name_ + " (" + opcode_name(op_) + " " + target() +
                ") does not call an operator");
  }
  return *handle_;
}

const c10::FunctionSchema& Node::schema() const { return op_handle().schema(); }

const detail::OperatorFacts& Node::facts() const {
  const detail::OperatorFacts* f = facts_.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = &detail::operator_facts(op_handle());
    facts_.store(f, std::memory_order_release);
  }
  return *f;
}

const Argument* Node::kwarg(const std::string& name) const {
  for (const auto& kv : kwargs_) {
    if (kv.first == name) return &kv.second;
  }
  return nullptr;
}

void Node::set_args(ArgumentList args) {
  Inputs inputs = collect_inputs(args, kwargs_);
  args_ = std::move(args);
  commit_inputs(std::move(inputs));
}

void Node::set_kwargs(Kwargs kwargs) {
  Inputs inputs = collect_inputs(args_, kwargs);
  kwargs_ = std::move(kwargs);
  commit_inputs(std::move(inputs));
}

void Node::set_arg(size_t i, Argument a) {
  if (i >= args_.size()) {
    throw Error("set_arg: node %" + name_ + " has " + std::to_string(args_.size()) +
                " arguments, no argument " + std::to_string(i));
  }
  ArgumentList args = args_;
  args[i] = std::move(a);
  set_args(std::move(args));
}

void Node::replace_input_with(Node* old_input, Node* new_input) {
  auto swap = [&](Node* n) { return n == old_input ? new_input : n; };
  ArgumentList args;
  args.reserve(args_.size());
  for (const Argument& a : args_) args.push_back(a.map_nodes(swap));
  Kwargs kwargs;
  kwargs.reserve(kwargs_.size());
  for (const auto& kv : kwargs_) kwargs.emplace_back(kv.first, kv.second.map_nodes(swap));
  Inputs inputs = collect_inputs(args, kwargs);
  args_ = std::move(args);
  kwargs_ = std::move(kwargs);
  commit_inputs(std::move(inputs));
}

std::vector<Node*> Node::replace_all_uses_with(Node* replacement) {
  if (replacement == this) {
    throw Error("replace_all_uses_with: %" + name_ + " cannot replace itself");
  }
  if (replacement == nullptr || replacement->graph_ != graph_) {
    throw Error("replace_all_uses_with: the replacement for %" + name_ +
                " must be a node of the same graph");
  }
  std::vector<Node*> changed(users_.begin(), users_.end());  // copy: edits below shrink users_
  for (Node* u : changed) u->replace_input_with(this, replacement);
  return changed;
}

// Edges are derived from arguments here and committed in commit_inputs, the
// single write path (docs/STYLE.md 2). Collecting validates before anything changes.
Node::Inputs Node::collect_inputs(const ArgumentList& args, const Kwargs& kwargs) const {
  Inputs fresh;
  // Sized once: most nodes read a few values, and growing the vector one
  // push at a time would allocate for each of the first few.
  size_t references = 0;
  auto count = [&references](Node*) { ++references; };
  for (const Argument& a : args) a.for_each_node(count);
  for (const auto& kv : kwargs) kv.second.for_each_node(count);
  fresh.reserve(references);
  // Short lists are searched; long ones (a cat of thousands of values) are
  // indexed, or creating the node would be quadratic in its inputs.
  std::unordered_set<Node*> seen;
  auto add = [&](Node* n) {
    if (n == nullptr) {
      throw Error("node %" + name_ + ": an argument refers to a null node");
    }
    if (n->graph_ != graph_) {
      throw Error("node %" + name_ + ": argument %" + n->name_ +
                  " belongs to a different graph");
    }
    if (fresh.size() < 16) {
      if (std::find(fresh.begin(), fresh.end(), n) != fresh.end()) return;
    } else {
      if (seen.empty()) seen.insert(fresh.begin(), fresh.end());
      if (!seen.insert(n).second) return;
    }
    fresh.push_back(n);
  };
  for (const Argument& a : args) a.for_each_node(add);
  for (const auto& kv : kwargs) kv.second.for_each_node(add);
  return fresh;
}

void Node::commit_inputs(Inputs fresh) {
  for (Node* old : inputs_) {
    if (std::find(fresh.begin(), fresh.end(), old) == fresh.end()) old->remove_user(this);
  }
  for (Node* n : fresh) {
    if (std::find(inputs_.begin(), inputs_.end(), n) == inputs_.end()) n->users_.push_back(this);
  }
  inputs_ = std::move(fresh);
}

void Node::remove_user(Node* user) {
  auto it = std::find(users_.begin(), users_.end(), user);
  TORCH_INTERNAL_ASSERT(it != users_.end(), "user list of %", name_, " lacks %", user->name_);
  users_.erase(it);
}

Node* Node::prev() const { return prev_ == graph_->root_ ? nullptr : prev_; }
Node* Node::next() const { return next_ == graph_->root_ ? nullptr : next_; }

bool Node::has_side_effects() const {
  if (op_ == OpCode::Output || op_ == OpCode::Placeholder) return true;
  if (!handle_) return false;  // get_attr, getitem, size computations
  const detail::OperatorFacts& f = facts();
  if (f.returns_nothing || f.writes_declared) return true;
  // Hidden writes, when they happen, to the written arguments given.
  for (const Argument* a : detail::written_arguments(*this)) {
    if (a->is_node()) return true;
  }
  return false;
}

namespace detail {

std::vector<const Argument*> written_arguments(const Node& n) {
  std::vector<const Argument*> out;
  if (!n.is_operator()) return out;
  const c10::FunctionSchema& s = n.op_handle().schema();
  const OperatorFacts& f = n.facts();
  if (!f.writes_any()) return out;
  auto given = [&](size_t i) -> const Argument* {
    return i < n.args().size() ? &n.args()[i] : n.kwarg(s.arguments()[i].name());
  };
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    if (!f.writes[i]) continue;
    if (const Argument* a = given(i)) out.push_back(a);
  }
  if (const HiddenWrites* hidden = f.hidden) {
    const Argument* cond = given(hidden->condition);
    if (cond != nullptr && cond->is_bool() && cond->to_bool()) {
      for (size_t i : hidden->arguments) {
        if (const Argument* a = given(i)) out.push_back(a);
      }
    }
  }
  return out;
}

}  // namespace detail
}  // namespace torchcap
