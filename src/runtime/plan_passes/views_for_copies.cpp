// use_views_for_copies (plan_passes.h).
#include "runtime/plan_passes.h"

#include <torchcap/passes.h>

#include "graph/operator_name.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <vector>

namespace torchcap {
namespace detail {

// Note [Views for copies in functional graphs]
// Export replaces views by `*_copy` operators (t_copy, view_copy, ...) so
// that the graph has no aliasing. When the graph is functional nothing
// writes a value while the run lasts (attributes and inputs are written
// back only after it), so a view computes the same values as the copy,
// without the copy: the unplanned interpreter runs the view instead, and a
// view of attributes is then computed once (Note [Views of attributes,
// computed once] in fold_views.cpp, the pass after this one). A training
// step's backward transposes its weights and gradients several times per
// layer; eager autograd runs those as views, and the BLAS calls then take the
// same transposed operands as eager ones. An instruction whose value is an
// output keeps its copy, so no output aliases an attribute, an input or
// another output. Planned runs keep the copies: the memory plan's lifetimes
// assume that no value aliases another.
bool use_views_for_copies(InterpreterPlan& plan, const Graph& graph) {
  static const std::pair<const char*, const char*> kViewOfCopy[] = {
      {"aten::t_copy", "aten::t"},
      {"aten::transpose_copy.int", "aten::transpose.int"},
      {"aten::permute_copy", "aten::permute"},
      {"aten::view_copy", "aten::view"},
      {"aten::expand_copy", "aten::expand"},
      {"aten::unsqueeze_copy", "aten::unsqueeze"},
      {"aten::squeeze_copy", "aten::squeeze"},
      {"aten::squeeze_copy.dim", "aten::squeeze.dim"},
      {"aten::slice_copy.Tensor", "aten::slice.Tensor"},
      {"aten::select_copy.int", "aten::select.int"},
      {"aten::alias_copy", "aten::alias"},
  };
  if (plan.memory || !is_functional(graph)) return false;
  // Resolved per plan, not kept: each pair is looked up once here.
  struct Pair {
    c10::OperatorName copy;
    c10::OperatorHandle view;
  };
  std::vector<Pair> pairs;
  for (const auto& [copy, view] : kViewOfCopy) {
    c10::optional<c10::OperatorHandle> handle =
        c10::Dispatcher::singleton().findSchema(parse_operator_name(view));
    if (handle) pairs.push_back({parse_operator_name(copy), *handle});
  }
  std::vector<bool> is_output(plan.num_values, false);
  for (const Slot& o : plan.outputs) {
    if (o.kind == Slot::Kind::Value) is_output[o.index] = true;
  }
  bool changed = false;
  for (Instruction& ins : plan.instructions) {
    if (ins.num_outputs != 1 || ins.explode || is_output[ins.out]) continue;
    const c10::OperatorName& name = ins.op.operator_name();
    for (const Pair& p : pairs) {
      if (name == p.copy) {
        ins.op = p.view;
        changed = true;
        break;
      }
    }
  }
  return changed;
}

}  // namespace detail
}  // namespace torchcap
