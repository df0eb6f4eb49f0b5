#include <torchcap/passes.h>

#include "graph/hidden_writes.h"
#include "graph/operator_facts.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>

#include <cstring>
#include <unordered_map>

namespace torchcap {
namespace {

// Whether two calls with equal arguments are bound to give equal results.
bool is_pure(const Node& n) {
  if (n.op() == OpCode::GetAttr) return true;
  if (n.op() != OpCode::CallFunction) return false;
  if (n.is_getitem() || n.is_size_computation()) return true;
  const c10::OperatorHandle& op = n.op_handle();
  const detail::OperatorFacts& f = n.facts();
  // An argument that is written or viewed, or a result that is a view (a
  // distinct alias), makes equal calls distinct.
  if (f.returns_nothing || f.mutable_schema || f.any_alias) return false;
  for (const c10::Argument& a : op.schema().arguments()) {
    if (detail::is_generator_argument(a)) return false;
  }
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  if (n.has_side_effects()) return false;
  return true;
}

void hash_combine(size_t& seed, size_t v) { seed ^= v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2); }

size_t hash_argument(const Argument& a) {
  size_t h = std::hash<size_t>()(a.storage().index());
  if (a.is_node()) hash_combine(h, std::hash<const void*>()(a.to_node()));
  if (a.is_int()) hash_combine(h, std::hash<int64_t>()(a.to_int()));
  if (a.is_double()) {
    double d = a.to_double();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    hash_combine(h, std::hash<uint64_t>()(bits));
  }
  if (a.is_bool()) hash_combine(h, a.to_bool());
  if (a.is_string()) hash_combine(h, std::hash<std::string>()(a.to_string()));
  if (a.is_list()) {
    for (const Argument& e : a.to_list()) hash_combine(h, hash_argument(e));
  }
  return h;
}

struct Key {
  const Node* node;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<std::string>()(k.node->target());
    hash_combine(h, static_cast<size_t>(k.node->op()));
    for (const Argument& a : k.node->args()) hash_combine(h, hash_argument(a));
    for (const auto& kv : k.node->kwargs()) {
      hash_combine(h, std::hash<std::string>()(kv.first));
      hash_combine(h, hash_argument(kv.second));
    }
    return h;
  }
};

struct KeyEq {
  bool operator()(const Key& a, const Key& b) const {
    return a.node->op() == b.node->op() && a.node->target() == b.node->target() &&
           a.node->args() == b.node->args() && a.node->kwargs() == b.node->kwargs();
  }
};

}  // namespace


bool eliminate_common_subexpressions(Graph& g) {
  // One walk in order: a node's arguments are final (already replaced by
  // their earliest equivalent) by the time it is looked up.
  std::unordered_map<Key, Node*, KeyHash, KeyEq> seen;
  bool changed = false;
  for (Node* n : g) {
    if (!is_pure(*n)) continue;
    auto [it, inserted] = seen.emplace(Key{n}, n);
    if (inserted) continue;
    if (!n->users().empty()) {
      n->replace_all_uses_with(it->second);
      changed = true;
    }
  }
  return changed;
}

}  // namespace torchcap
