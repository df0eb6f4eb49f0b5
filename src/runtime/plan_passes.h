// The plan passes: what makes the interpreter's plan (plan.h) faster than one
// instruction per node run as recorded. Internal.
//
// Each is a free function over a plan built by build_plan (and the graph it
// was built from, for those that ask whether the graph is functional), one
// file each in plan_passes/, and returns whether it changed the plan
// (docs/STYLE.md 10). None changes the values a run computes: each one's
// Note says why. A pass asked to run on a plan it does not apply to (a
// planned interpreter's, a graph that is not functional) returns false and
// changes nothing. The interpreter runs them once each, in the order of
// kPlanPasses at the end of this file, which says why that order.
#pragma once

#include "passes/out_variants.h"
#include "runtime/plan.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchcap {

class Graph;

namespace detail {

// Note [Views for copies in functional graphs] (plan_passes/views_for_copies.cpp):
// in a functional graph of an unplanned interpreter, `*_copy` operators whose
// value is not an output run as the views they copy.
bool use_views_for_copies(InterpreterPlan& plan, const Graph& graph);

// Note [Views of attributes, computed once] (plan_passes/fold_views.cpp): an
// instruction that views attributes only is run now, and its result becomes
// an attribute of the plan.
bool fold_views_of_attributes(InterpreterPlan& plan);

// Note [Scalar operators as Tensor operators] (plan_passes/scalar_operators.cpp):
// add, sub, mul and div of a constant Scalar call their `.Tensor` overload
// with the Scalar made a tensor once. Not for a planned interpreter.
bool use_tensor_forms_of_scalar_operators(InterpreterPlan& plan);

// Note [Updates written in place] (plan_passes/updates_in_place.cpp): in a
// functional graph, the elementwise operator that makes an attribute's new
// value writes it into the attribute, and the copy after the run goes.
bool write_updates_in_place(InterpreterPlan& plan, const Graph& graph);

// Note [Freeing values after their last use] (plan_passes/frees.cpp): each
// instruction lists the values released after it.
bool free_values_after_last_use(InterpreterPlan& plan);

// Note [Results written over a dying argument] (plan_passes/overwrites.cpp):
// an elementwise instruction may write its result into an argument whose
// last use it is. Reads the frees of free_values_after_last_use.
bool write_results_over_dying_arguments(InterpreterPlan& plan);

// For the two passes that write a result into an existing tensor
// (plan_passes/elementwise.cpp): whether `op` is an elementwise operator, so
// that its out variant may be given one of its own arguments as `out` (each
// element is read before it is written, as in its in-place form).
bool is_elementwise(const c10::OperatorHandle& op);
// Whether an out variant computes into its out argument: one with a CPU
// kernel of its own, not a composite that computes into a new tensor and
// copies (Note [Out variants that write in place], memory_plan.cpp).
bool writes_in_place(const OutForm& form);

// The passes in the order the interpreter runs them (plan_for in
// interpreter.cpp), for the interpreter and for tests that run the passes
// before the one they test:
//   - views for copies before folding, which computes the views of
//     attributes it makes;
//   - folding before the frees, whose value indices it would leave stale;
//   - updates in place before the overwrites, which leave an instruction
//     that writes into an attribute as it is;
//   - the frees before the overwrites, which read them.
struct PlanPass {
  const char* name;
  bool (*run)(InterpreterPlan& plan, const Graph& graph);
};
inline constexpr PlanPass kPlanPasses[] = {
    {"use_views_for_copies", &use_views_for_copies},
    {"fold_views_of_attributes", [](InterpreterPlan& p, const Graph&) { return fold_views_of_attributes(p); }},
    {"use_tensor_forms_of_scalar_operators",
     [](InterpreterPlan& p, const Graph&) { return use_tensor_forms_of_scalar_operators(p); }},
    {"write_updates_in_place", &write_updates_in_place},
    {"free_values_after_last_use", [](InterpreterPlan& p, const Graph&) { return free_values_after_last_use(p); }},
    {"write_results_over_dying_arguments",
     [](InterpreterPlan& p, const Graph&) { return write_results_over_dying_arguments(p); }},
};

}  // namespace detail
}  // namespace torchcap
