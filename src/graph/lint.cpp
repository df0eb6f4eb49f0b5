// Graph::lint: every invariant the rest of torchcap relies on, each with its
// own message.
#include <torchcap/error.h>
#include <torchcap/graph.h>

#include "graph/operator_name.h"
#include "graph/schema_check.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torchcap {
namespace {

[[noreturn]] void fail(const std::string& what) { throw LintError("lint: " + what); }

std::string ref(const Node* n) { return "%" + n->name(); }

// A set of nodes by address, open addressing in one array: lint asks, for
// every node and every edge, whether a node was seen, and a node-based hash
// set made an allocation and a cache miss or two of each (a large part of
// loading a big file went to lint's sets).
class NodeSet {
 public:
  explicit NodeSet(size_t expected) { resize(expected); }

  // False if `n` was in the set already.
  bool insert(const Node* n) {
    if (2 * (size_ + 1) > slots_.size()) resize(2 * (size_ + 1));
    size_t i = slot(n);
    if (slots_[i] == n) return false;
    slots_[i] = n;
    ++size_;
    return true;
  }
  bool contains(const Node* n) const { return slots_[slot(n)] == n; }

 private:
  // Where `n` is, or the empty slot where it would go.
  size_t slot(const Node* n) const {
    auto h = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(n));
    h = (h ^ (h >> 31)) * 0x9e3779b97f4a7c15ULL;  // spread the aligned low bits
    size_t i = static_cast<size_t>(h >> 20) & mask_;
    while (slots_[i] != nullptr && slots_[i] != n) i = (i + 1) & mask_;
    return i;
  }
  // Room for `count` nodes at most half full, keeping those held.
  void resize(size_t count) {
    size_t capacity = 16;
    while (capacity < 2 * count) capacity *= 2;
    std::vector<const Node*> old = std::move(slots_);
    slots_.assign(capacity, nullptr);
    mask_ = capacity - 1;
    for (const Node* n : old) {
      if (n != nullptr) slots_[slot(n)] = n;
    }
  }

  std::vector<const Node*> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace

void Graph::lint() const {
  // Membership tests on a node's users or inputs search short lists directly
  // and sort a copy of long ones once: searching the list for every edge made
  // lint quadratic in fan-out and fan-in (a placeholder read by 100,000
  // nodes; a cat of 100,000 values), and loading a file lints it.
  constexpr size_t kShort = 16;
  auto sorted = [](c10::ArrayRef<Node*> v) {
    std::vector<const Node*> out(v.begin(), v.end());
    std::sort(out.begin(), out.end());
    return out;
  };
  std::unordered_map<const Node*, std::vector<const Node*>> sorted_users;
  auto times_listed_as_user = [&](const Node* in, const Node* user) -> size_t {
    if (in->users_.size() <= kShort) return std::count(in->users_.begin(), in->users_.end(), user);
    auto [it, fresh] = sorted_users.try_emplace(in);
    if (fresh) it->second = sorted(in->users_);
    auto [first, last] = std::equal_range(it->second.begin(), it->second.end(), user);
    return static_cast<size_t>(last - first);
  };
  std::unordered_map<const Node*, std::vector<const Node*>> sorted_inputs;
  auto uses = [&](const Node* user, const Node* in) {
    if (user->inputs_.size() <= kShort) {
      return std::find(user->inputs_.begin(), user->inputs_.end(), in) != user->inputs_.end();
    }
    auto [it, fresh] = sorted_inputs.try_emplace(user);
    if (fresh) it->second = sorted(user->inputs_);
    return std::binary_search(it->second.begin(), it->second.end(), in);
  };

  NodeSet defined(size_);  // the nodes before the one being checked
  size_t count = 0;
  bool seen_non_placeholder = false;
  const Node* output = nullptr;
  // The last operator looked up, and what it was found as: most nodes call
  // the operator one of the nodes before them called.
  const detail::OperatorIdentity* last_operator = nullptr;
  c10::optional<c10::OperatorHandle> last_handle;
  std::vector<Node*> referenced;
  std::unordered_set<const Node*> seen;  // used once `referenced` is long

  for (const Node* n = root_->next_; n != root_; n = n->next_) {
    if (n->graph_ != this) fail("node " + ref(n) + " is owned by a different graph");
    if (n->next_->prev_ != n) fail("the node list is broken after " + ref(n));
    if (output != nullptr) fail("node " + ref(n) + " comes after the output node " + ref(output));
    if (!is_valid_node_name(n->name())) {
      fail("node name '" + n->name() + "' is not a valid, unreserved Python identifier");
    }
    // The name table maps each name to one node, so every node found there
    // under its own name means no two nodes share a name.
    auto named = by_name_.find(n->name());
    if (named == by_name_.end() || named->second != n) {
      if (named != by_name_.end() && named->second->name() == n->name()) {
        fail("two nodes are named '" + n->name() + "'");
      }
      fail("node " + ref(n) + " is missing from the graph's name table");
    }

    // Edges: inputs are exactly the nodes the arguments reference, each defined
    // earlier in this graph, and each lists this node as a user.
    referenced.clear();
    if (!seen.empty()) seen.clear();
    auto collect = [&](Node* in) {
      if (referenced.size() < kShort) {
        if (std::find(referenced.begin(), referenced.end(), in) != referenced.end()) return;
      } else {
        if (seen.empty()) seen.insert(referenced.begin(), referenced.end());
        if (!seen.insert(in).second) return;
      }
      referenced.push_back(in);
    };
    for (const Argument& a : n->args_) a.for_each_node(collect);
    for (const auto& kv : n->kwargs_) kv.second.for_each_node(collect);
    if (referenced != n->inputs()) fail("the inputs of " + ref(n) + " do not match its arguments");
    for (const Node* in : n->inputs_) {
      if (in->graph_ != this) {
        fail("argument " + ref(in) + " of " + ref(n) + " belongs to a different graph");
      }
      if (!defined.contains(in)) {
        fail(in == n ? "node " + ref(n) + " uses itself"
                     : "node " + ref(n) + " uses " + ref(in) +
                           " before it is defined (graph is not in topological order)");
      }
      if (times_listed_as_user(in, n) != 1) {
        fail("node " + ref(n) + " uses " + ref(in) + " but is not listed once among its users");
      }
    }

    switch (n->op()) {
      case OpCode::Placeholder:
        if (seen_non_placeholder) {
          fail("placeholder " + ref(n) + " comes after non-placeholder nodes");
        }
        if (!n->args_.empty() || !n->kwargs_.empty()) {
          fail("placeholder " + ref(n) + " has arguments");
        }
        break;
      case OpCode::GetAttr:
        seen_non_placeholder = true;
        if (n->target().empty()) fail("get_attr " + ref(n) + " has an empty attribute path");
        if (!n->args_.empty() || !n->kwargs_.empty()) fail("get_attr " + ref(n) + " has arguments");
        break;
      case OpCode::CallFunction: {
        seen_non_placeholder = true;
        if (n->is_size_computation()) {
          std::string problem = detail::check_size_computation(*n);
          if (!problem.empty()) fail("node " + ref(n) + ": " + problem);
          break;
        }
        if (n->is_getitem()) {
          if (n->target() != kGetItem) {
            fail("call_function " + ref(n) + " has target '" + n->target() +
                 "', which is neither an operator nor getitem");
          }
          std::string problem = detail::check_getitem(*n);
          if (!problem.empty()) fail("node " + ref(n) + ": " + problem);
          break;
        }
        // The handle was resolved when the node was made; the operator may have
        // been deregistered since (a custom op library unloaded), so look again.
        if (last_operator != n->operator_) {
          last_operator = n->operator_;
          last_handle = c10::Dispatcher::singleton().findSchema(n->operator_->name);
        }
        const c10::optional<c10::OperatorHandle>& handle = last_handle;
        if (!handle) {
          fail("node " + ref(n) + " calls " + n->target() + ", which is not a registered operator");
        }
        std::string problem = detail::check_schema_arguments(*n, handle->schema());
        if (!problem.empty()) fail("node " + ref(n) + ": " + problem);
        break;
      }
      case OpCode::Output:
        seen_non_placeholder = true;
        output = n;
        if (n->args_.size() != 1 || !n->args_[0].is_list() || !n->kwargs_.empty()) {
          fail("output " + ref(n) + " must have one argument: the list of results");
        }
        for (const Argument& a : n->args_[0].to_list()) {
          if (!a.is_none() && !(a.is_node() && detail::produces(*a.to_node()) ==
                                                   detail::Produces::Tensor)) {
            fail("output " + ref(n) + " returns " + a.kind_name() +
                 (a.is_node() ? " " + ref(a.to_node()) : std::string()) +
                 "; results must be Tensor nodes or none");
          }
        }
        break;
    }
    defined.insert(n);
    ++count;
  }
  // Users last: a node listing a user that does not use it. (Each use was
  // checked above, so a missing user is already reported there.)
  for (const Node* n = root_->next_; n != root_; n = n->next_) {
    for (const Node* u : n->users_) {
      if (u->graph_ != this) fail("node " + ref(n) + " has a user in a different graph");
      if (!uses(u, n)) {
        fail("node " + ref(n) + " lists " + ref(u) + " as a user, but " + ref(u) +
             " does not use it");
      }
    }
  }
  if (count != size_) fail("the graph counts " + std::to_string(size_) + " nodes but holds " +
                           std::to_string(count));
  if (output == nullptr) fail("the graph has no output node");
}

}  // namespace torchcap
