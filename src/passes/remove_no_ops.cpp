// Note [Operators that do nothing]
// Some calls give back their input's values in its own shape: `detach`,
// `alias`, `clone` and `_to_copy` to the same dtype and device, a view,
// reshape or expand to the input's own sizes (and their `*_copy` forms in
// an exported graph), dropout with train=False. In a graph that writes no
// tensor, whether a reader gets the input or such a result cannot be told
// apart, so readers get the input and the call goes. Kept: a result the
// graph returns (a caller gets a tensor of its own, never an input or an
// attribute), and a result whose recorded strides differ from its input's
// (a clone that made a tensor contiguous: its readers were traced, and
// their results recorded, with the strides the clone gave).
#include "passes/inference.h"

#include <cstring>
#include <string>
#include <vector>

namespace torchcap::detail {
namespace {

// The operators that give back their first argument's values whatever the
// rest, and those that do only under a condition on their arguments.
bool always_the_input(const Node& n) {
  for (const char* name : {"aten::detach", "aten::alias", "aten::detach_copy", "aten::alias_copy"}) {
    if (is_call_of(&n, name)) return true;
  }
  return false;
}

bool is_false(const Argument& a) { return a.is_bool() && !a.to_bool(); }

bool the_input_here(const Node& n) {
  if (always_the_input(n)) return true;
  const ArgumentList& a = n.args();
  // dropout(input, p, train), feature_dropout, alpha_dropout, ...
  for (const char* name : {"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
                           "aten::feature_alpha_dropout"}) {
    if (is_call_of(&n, name)) return a.size() == 3 && is_false(a[2]) && n.kwargs().empty();
  }
  // clone(input, memory_format=None): same strides checked by the caller.
  if (is_call_of(&n, "aten::clone")) return true;
  // _to_copy with no dtype, layout, device or memory format other than the
  // input's: the caller checks the recorded dtype and strides; the device
  // must be the input's too.
  if (is_call_of(&n, "aten::_to_copy")) {
    for (const auto& [name, value] : n.kwargs()) {
      if (name == "non_blocking" || name == "memory_format" || name == "dtype" || name == "layout") continue;
      if (name == "device" && value.is_device()) continue;
      return false;
    }
    return true;  // dtype and device: compared on the recorded values
  }
  // Shape operators to the input's sizes (compared by the caller).
  for (const char* name : {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::view_copy",
                           "aten::expand", "aten::expand_copy", "aten::_reshape_alias",
                           "aten::_reshape_alias_copy"}) {
    if (is_call_of(&n, name)) return true;
  }
  return false;
}

bool is_graph_output(const Node& n) {
  for (const Node* u : n.users()) {
    if (u->op() == OpCode::Output) return true;
  }
  return false;
}

}  // namespace

bool remove_no_ops(GraphModule& gm) {
  Graph& g = gm.graph();
  if (writes_any_tensor(g)) return false;
  std::vector<Node*> gone;
  for (Node* n : g) {
    if (n->op() != OpCode::CallFunction || !n->is_operator() || n->args().empty() || !n->args()[0].is_node()) {
      continue;
    }
    if (!the_input_here(*n) || is_graph_output(*n)) continue;
    Node* input = n->args()[0].to_node();
    const ValueMeta& in = input->meta().val;
    const ValueMeta& out = n->meta().val;
    // Same dtype, sizes, strides and device as recorded: its readers see no
    // difference (and a dynamic graph's expressions must agree too).
    if (in.kind != ValueKind::Tensor || out.kind != ValueKind::Tensor || !(in.tensors[0] == out.tensors[0])) {
      continue;
    }
    n->replace_all_uses_with(input);
    gone.push_back(n);
  }
  for (Node* n : gone) g.erase(n);
  return !gone.empty();
}

}  // namespace torchcap::detail
