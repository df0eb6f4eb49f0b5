// free_values_after_last_use (plan_passes.h).
#include "runtime/plan_passes.h"

#include <vector>

namespace torchcap {
namespace detail {

// Note [Freeing values after their last use]
// One reverse walk: the first time a value is seen (from the end), that
// instruction is its last use, so the value is released right after it.
// Values never read are released right after they are produced. Values the
// output returns are never released. The frees replace any found before, so
// running the pass again changes nothing.
bool free_values_after_last_use(InterpreterPlan& plan) {
  std::vector<bool> seen(plan.num_values, false);
  for (const Slot& s : plan.outputs) {
    if (s.kind == Slot::Kind::Value) seen[s.index] = true;
  }
  std::vector<int32_t> frees;
  auto visit = [&](const Slot& s, auto&& self) -> void {
    if (s.kind == Slot::Kind::Value && !seen[s.index]) {
      seen[s.index] = true;
      frees.push_back(s.index);
    }
    for (const Slot& e : s.elements) self(e, self);
  };
  bool changed = false;
  for (size_t k = plan.instructions.size(); k-- > 0;) {
    Instruction& ins = plan.instructions[k];
    frees.clear();
    for (const Slot& s : ins.args) visit(s, visit);
    for (int32_t o = ins.out; o >= 0 && o < ins.out + ins.num_outputs; ++o) {
      if (!seen[o]) {
        seen[o] = true;
        frees.push_back(o);  // produced, never read
      }
    }
    if (frees != ins.frees) {
      ins.frees = frees;
      changed = true;
    }
  }
  return changed;
}

}  // namespace detail
}  // namespace torchcap
