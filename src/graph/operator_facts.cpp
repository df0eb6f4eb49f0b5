#include "graph/operator_facts.h"

#include <torchcap/graph_module.h>
#include <torchcap/node.h>

#include "graph/hidden_writes.h"

#include <unordered_map>

namespace torchcap {
namespace detail {

bool is_write(const c10::AliasInfo* info) {
  if (info == nullptr) return false;
  if (info->isWrite()) return true;
  for (const c10::AliasInfo& c : info->containedTypes()) {
    if (is_write(&c)) return true;
  }
  return false;
}

int written_argument_of(const c10::FunctionSchema& schema, const c10::Argument& r) {
  if (!r.alias_info() || !r.alias_info()->isWrite()) return -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if (a != nullptr && a->isWrite() && a->beforeSets() == r.alias_info()->beforeSets()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

int aliased_argument_of(const c10::FunctionSchema& schema, const c10::Argument& r) {
  if (!r.alias_info() || r.alias_info()->isWrite()) return -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if (a != nullptr && a->beforeSets() == r.alias_info()->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

const Node* memory_root(const Node* n, bool through_views) {
  while (n->is_operator() && !n->schema().returns().empty()) {
    const c10::FunctionSchema& s = n->schema();
    int k = written_argument_of(s, s.returns()[0]);
    if (k < 0 && through_views) k = aliased_argument_of(s, s.returns()[0]);
    if (k < 0) break;
    // Positional arguments come first; out= arguments are keywords.
    const std::string& name = s.arguments()[k].name();
    const Argument* given = nullptr;
    if (static_cast<size_t>(k) < n->args().size()) {
      given = &n->args()[k];
    } else {
      for (const auto& [key, value] : n->kwargs()) {
        if (key == name) given = &value;
      }
    }
    if (given == nullptr || !given->is_node()) break;
    n = given->to_node();
  }
  return n;
}

std::vector<bool> written_inputs(const GraphModule& gm) {
  std::unordered_map<const Node*, size_t> input_of;
  std::vector<bool> written;
  for (const Node* n : gm.graph()) {
    if (n->op() != OpCode::Placeholder) continue;
    input_of[n] = written.size();
    written.push_back(false);
  }
  for (const Node* n : gm.graph()) {
    if (!n->is_operator()) continue;
    for (const Argument* a : written_arguments(*n)) {
      a->for_each_node([&](Node* m) {
        auto it = input_of.find(memory_root(m, /*through_views=*/true));
        if (it != input_of.end()) written[it->second] = true;
      });
    }
  }
  for (const OutputSpec& spec : gm.output_specs) {
    if (spec.kind != OutputKind::InputMutation) continue;
    for (const auto& [node, k] : input_of) {
      if (node->name() == spec.target) written[k] = true;
    }
  }
  return written;
}

}  // namespace detail
}  // namespace torchcap
