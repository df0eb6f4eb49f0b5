// Note [Constants folded]
// In an inference graph, a call whose every tensor argument is an attribute
// (a parameter, buffer or lifted constant) computes the same tensor at every
// run: `mul(bias, 2)`, `_to_copy(weight, dtype)`, `rsqrt(add(var, eps))`. It
// is computed once, here, and becomes a new attribute read by a get_attr;
// chains fold from the front, since a folded result is an attribute for the
// calls after it. Only calls whose result is bound to be that tensor: pure
// operators (nothing written, declared or hidden; no view or alias, as
// folding would turn a view into a copy: views of attributes the
// interpreter already computes once, Note [Views of attributes, computed
// once]; not random), one strided tensor returned, in a graph that writes
// no attribute. A result larger than the attributes it reads (an `expand`
// made real, `zeros_like` of a big buffer) is left to compute at run time:
// folding would trade time for memory, and grow the file. Attributes no
// longer read go.
#include "passes/inference.h"

#include "graph/hidden_writes.h"
#include "graph/operator_facts.h"

#include <torchcap/evaluator.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>

#include <string>
#include <vector>

namespace torchcap::detail {
namespace {

bool is_pure(const Node& n) {
  if (!n.is_operator()) return false;
  const c10::OperatorHandle& op = n.op_handle();
  const OperatorFacts& f = n.facts();
  if (f.returns_nothing || f.mutable_schema || f.any_alias || f.hidden != nullptr) return false;
  if (f.returns_data) return false;  // .item() and friends: not a tensor result
  for (const c10::Argument& a : op.schema().arguments()) {
    if (is_generator_argument(a)) return false;
  }
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  const auto& returns = op.schema().returns();
  return returns.size() == 1 && returns[0].real_type()->kind() == c10::TypeKind::TensorType;
}

// Whether every node `n` reads is a get_attr, and it reads at least one.
bool reads_attributes_only(const Node& n) {
  if (n.inputs().empty()) return false;
  for (const Node* in : n.inputs()) {
    if (in->op() != OpCode::GetAttr) return false;
  }
  return true;
}

}  // namespace

bool fold_constants(GraphModule& gm) {
  Graph& g = gm.graph();
  if (writes_an_attribute(g)) return false;
  bool changed = false;
  for (Node* n = g.first(); n != nullptr; n = n->next()) {
    if (n->op() != OpCode::CallFunction || !is_pure(*n) || !reads_attributes_only(*n)) continue;
    int64_t read_bytes = 0;
    bool real = true;
    for (const Node* in : n->inputs()) {
      const at::Tensor& t = gm.attribute(in->target()).value;
      real = real && t.defined() && !t.is_meta();
      read_bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
    }
    if (!real) continue;  // a weightless graph: nothing to compute with
    at::Tensor result;
    try {
      c10::NoGradGuard no_grad;
      std::vector<c10::IValue> stack = make_stack(
          bind_arguments(*n), [&gm](const Node* in) { return c10::IValue(gm.attribute(in->target()).value); });
      n->op_handle().callBoxed(&stack);
      result = stack.at(0).toTensor();
    } catch (const std::exception&) {
      continue;  // it fails at run time too, and says so there, with its node
    }
    if (!result.defined() || result.layout() != at::kStrided || !result.is_non_overlapping_and_dense() ||
        static_cast<int64_t>(result.nbytes()) > read_bytes) {
      continue;
    }
    const std::string name = fresh_attribute_name(gm, "_folded_" + n->name());
    gm.set_attribute(name, result, AttributeKind::Constant);
    Node* read = nullptr;
    {
      auto here = g.inserting_before(n);
      read = g.get_attr(name);
    }
    read->meta().val = ValueMeta::tensor(TensorMeta::of(gm.attribute(name).value));
    std::vector<Node*> inputs = n->inputs().vec();
    n->replace_all_uses_with(read);
    g.erase(n);
    for (Node* in : inputs) {
      if (in->users().empty()) g.erase(in);
    }
    n = read;
    changed = true;
  }
  if (changed) gm.remove_unused_attributes();
  return changed;
}

}  // namespace torchcap::detail
