// write_results_over_dying_arguments (plan_passes.h).
#include "runtime/plan_passes.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

namespace torchcap {
namespace detail {

// Note [Results written over a dying argument]
// Most intermediate results are the size of an argument that dies where
// they are made: relu of a batch norm's output, relu's backward of the
// incoming gradient, each step of an optimizer's update. Written through
// the out variant into that argument's buffer, such a result needs no
// allocation: for a large tensor that is memory the system maps afresh
// (page faults) at every run once the heap has shrunk, for a small one a
// malloc and a free. Only elementwise operators (each element is read
// before it is written, as in their in-place forms), only arguments whose
// last use this is (Note [Freeing values after their last use] in
// frees.cpp: this pass runs after that one), and only when at run time the
// argument's tensor and storage are held by nothing else (not a view of an
// input, an attribute or a value still live) and it has the result's
// recorded sizes, strides and dtype, so that the result is laid out as the
// operator lays it out (can_overwrite in interpreter.cpp). The out variant
// runs the functional operator's kernel: the same bits. Not for instructions
// that already write elsewhere: into the arena of a planned run, or into an
// attribute (Note [Updates written in place] in updates_in_place.cpp).
bool write_results_over_dying_arguments(InterpreterPlan& plan) {
  if (plan.autograd) return false;  // out variants do not record autograd history
  bool changed = false;
  for (Instruction& ins : plan.instructions) {
    const std::optional<TensorMeta>& result = plan.node_infos[ins.node_info].result;
    if (ins.num_outputs != 1 || ins.explode || ins.planned >= 0 || ins.into.defined() || ins.overwrite ||
        !result || !is_elementwise(ins.op)) {
      continue;
    }
    std::vector<int32_t> candidates;
    for (size_t a = 0; a < ins.args.size(); ++a) {
      const Slot& s = ins.args[a];
      if (s.kind != Slot::Kind::Value ||
          std::find(ins.frees.begin(), ins.frees.end(), s.index) == ins.frees.end()) {
        continue;
      }
      size_t uses = 0;
      for (const Slot& other : ins.args) {
        uses += other.kind == Slot::Kind::Value && other.index == s.index ? 1 : 0;
      }
      if (uses == 1) candidates.push_back(static_cast<int32_t>(a));
    }
    if (candidates.empty()) continue;
    std::optional<OutForm> form = out_form(ins.op);
    if (!form || !writes_in_place(*form)) continue;
    ins.overwrite = std::make_shared<const Instruction::Overwrite>(
        Instruction::Overwrite{std::move(candidates), form->op, form->extra, *result});
    changed = true;
  }
  return changed;
}

}  // namespace detail
}  // namespace torchcap
