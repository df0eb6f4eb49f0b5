// fold_views_of_attributes (plan_passes.h).
#include "runtime/plan_passes.h"

#include "graph/operator_facts.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/jit_type.h>

#include <algorithm>
#include <vector>

namespace torchcap {
namespace detail {
namespace {

// Whether `ins` computes, from attributes and constants only, a view of
// them or packed weights (an object); if so, its result, computed now: a
// slot of plan.attributes for a view, a constant slot for an object. Else a
// Value slot.
Slot fold(InterpreterPlan& plan, const Instruction& ins) {
  Slot folded;
  folded.kind = Slot::Kind::Value;
  const c10::FunctionSchema& schema = ins.op.schema();
  if (ins.num_outputs != 1 || ins.explode || ins.planned >= 0 || schema.returns().size() != 1) return folded;
  const c10::TypeKind returns = schema.returns()[0].real_type()->kind();
  const OperatorFacts& facts = operator_facts(ins.op);
  if (facts.writes_any()) return folded;
  const bool view = returns == c10::TypeKind::TensorType && facts.viewed_argument[0] >= 0;
  if (!view && returns != c10::TypeKind::ClassType) return folded;
  bool reads_attribute = false;
  for (const Slot& s : ins.args) {
    if (s.kind == Slot::Kind::Attribute) {
      reads_attribute = true;
    } else if (s.kind != Slot::Kind::Constant) {
      return folded;
    }
  }
  if (!reads_attribute) return folded;
  std::vector<c10::IValue> stack;
  for (const Slot& s : ins.args) {
    if (s.kind != Slot::Kind::Attribute) {
      stack.push_back(s.constant);
    } else {
      // XNNPACK refuses to pack a weight that requires grad, whatever the
      // grad mode; packed weights are for runs without autograd anyway.
      const at::Tensor& t = plan.attributes[s.index];
      stack.emplace_back(view ? t : t.detach());
    }
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;  // as a run calls it
  ins.op.callBoxed(&stack);
  if (view) {
    plan.attributes.push_back(stack.at(0).toTensor());
    folded.kind = Slot::Kind::Attribute;
    folded.index = static_cast<int32_t>(plan.attributes.size() - 1);
  } else {
    folded.kind = Slot::Kind::Constant;
    folded.constant = std::move(stack.at(0));
  }
  return folded;
}

// Rewrites the Value slots of `s` (and of its elements) by `to`: a slot
// becomes `to[index]`.
void rewrite(Slot& s, const std::vector<Slot>& to) {
  if (s.kind == Slot::Kind::Value) {
    const Slot& t = to[s.index];
    s.kind = t.kind;
    s.index = t.index;
    s.constant = t.constant;
  }
  for (Slot& e : s.elements) rewrite(e, to);  // one level: list elements are plain slots
}

}  // namespace

// Note [Views of attributes, computed once]
// A view of attributes only (`t(weight)`, or a `t_copy` run as one, Note
// [Views for copies in functional graphs] in views_for_copies.cpp) computes
// the same tensor at every run: it is computed once, here, and becomes an
// attribute of the plan, and its instruction goes. It aliases the
// attribute's memory, so it stays right even when the graph updates the
// attribute in place. Packed weights (an operator that makes an object from
// attributes, Note [Convolutions with packed weights] in
// passes/prepack_convolutions.cpp) are computed once too and become a
// constant argument of their readers; they are a copy, so an interpreter
// made before the weights change keeps the old ones, as TorchScript's
// frozen modules do (docs/optimize.md). The instructions after it are renumbered, so the value
// table has no hole; frees are not, so this pass runs before
// free_values_after_last_use.
bool fold_views_of_attributes(InterpreterPlan& plan) {
  // A view computed now would be no part of a run's autograd history.
  if (plan.autograd) return false;
  // Each value's slot from now on: itself, or the attribute it was folded into.
  std::vector<Slot> to(plan.num_values);
  for (int32_t v = 0; v < plan.num_values; ++v) {
    to[v].kind = Slot::Kind::Value;
    to[v].index = v;
  }
  std::vector<Instruction>& instructions = plan.instructions;
  size_t kept = 0;
  for (size_t k = 0; k < instructions.size(); ++k) {
    Instruction& ins = instructions[k];
    for (Slot& a : ins.args) rewrite(a, to);
    if (Slot folded = fold(plan, ins); folded.kind != Slot::Kind::Value) {
      TORCH_INTERNAL_ASSERT(ins.frees.empty(), "views are folded before frees are planned");
      to[ins.out] = std::move(folded);
      continue;
    }
    if (kept != k) instructions[kept] = std::move(ins);
    ++kept;
  }
  if (kept == instructions.size()) return false;
  instructions.erase(instructions.begin() + static_cast<std::ptrdiff_t>(kept), instructions.end());
  for (Slot& o : plan.outputs) rewrite(o, to);

  // The values that remain, numbered in order; node infos likewise.
  std::vector<Slot> renumbered(plan.num_values);
  std::vector<NodeInfo> infos;
  infos.reserve(instructions.size());
  int32_t next = 0;
  plan.max_args = 0;
  for (Instruction& ins : instructions) {
    for (int32_t o = 0; o < ins.num_outputs; ++o) {
      renumbered[ins.out + o].kind = Slot::Kind::Value;
      renumbered[ins.out + o].index = next + o;
    }
    if (ins.out >= 0) ins.out = next;
    next += ins.num_outputs;
    for (Slot& a : ins.args) rewrite(a, renumbered);
    infos.push_back(std::move(plan.node_infos[ins.node_info]));
    ins.node_info = static_cast<int32_t>(infos.size() - 1);
    plan.max_args = std::max(plan.max_args, ins.args.size());
  }
  for (Slot& o : plan.outputs) rewrite(o, renumbered);
  plan.node_infos = std::move(infos);
  plan.num_values = next;
  return true;
}

}  // namespace detail
}  // namespace torchcap
