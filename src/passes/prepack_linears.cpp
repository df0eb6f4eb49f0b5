// Note [Linear layers with packed weights]
// A traced nn.Linear on a 2-D input is `addmm(bias, x, t(weight))`, which
// OpenBLAS runs from the transposed weight at every call. XNNPACK's packed
// linear layer (prepacked::linear_clamp_prepack / linear_clamp_run, the
// operators PyTorch's optimize_for_mobile uses) packs the weight once and
// clamps its result as it writes it, which fuses a following relu (clamp
// at 0) or hardtanh:
//
//   %w = prepacked::linear_clamp_prepack(%weight, %bias, min, max)
//   %y = prepacked::linear_clamp_run(%x, %w)
//
// As for convolutions (Note [Convolutions with packed weights]), the
// interpreter packs once and the file keeps the weights unpacked. Measured
// per layer against addmm, XNNPACK's is faster on large layers (a 512 x 1000
// classifier at batch 1 takes a third of addmm's time, 1280 x 1000 a
// quarter) and slower on small ones, where a call's fixed cost dominates
// (64 x 64: several times addmm's); so only layers of at least
// kMinWeightElements weights are packed (docs/benchmarks.md has the
// figures). Rewritten: aten::addmm with beta and alpha 1 of a 2-D float32
// CPU input, a float32 attribute bias of one dimension and the `t` of a
// float32 2-D attribute weight, in a graph that writes no attribute, when
// XNNPACK runs here.
#include "passes/inference.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

namespace torchcap::detail {
namespace {

constexpr int64_t kMinWeightElements = 256 * 256;

bool is_one(const Argument& a) {
  return (a.is_int() && a.to_int() == 1) || (a.is_double() && a.to_double() == 1.0);
}

const Attribute* float_cpu_attribute(const GraphModule& gm, const Argument& a, int64_t dim) {
  const Attribute* attr = float_attribute_of(gm, a);
  return attr != nullptr && attr->value.scalar_type() == at::kFloat && attr->value.device().is_cpu() &&
                 attr->value.dim() == dim
             ? attr
             : nullptr;
}

// The weight node of `addmm(bias, x, t(weight))` when the Note's conditions
// hold, else nullptr.
Node* packable_weight(const GraphModule& gm, const Node* n) {
  if (!is_call_of(n, "aten::addmm") || n->args().size() != 3 || !n->args()[1].is_node() ||
      !n->args()[2].is_node()) {
    return nullptr;
  }
  for (const auto& [name, value] : n->kwargs()) {
    if ((name != "beta" && name != "alpha") || !is_one(value)) return nullptr;
  }
  const Node* t = n->args()[2].to_node();
  if (!is_call_of(t, "aten::t") || !t->args()[0].is_node()) return nullptr;
  const Attribute* weight = float_cpu_attribute(gm, t->args()[0], 2);
  const Attribute* bias = float_cpu_attribute(gm, n->args()[0], 1);
  if (weight == nullptr || bias == nullptr || weight->value.numel() < kMinWeightElements ||
      bias->value.size(0) != weight->value.size(0)) {
    return nullptr;
  }
  const ValueMeta& x = n->args()[1].to_node()->meta().val;
  if (x.kind != ValueKind::Tensor || x.tensors[0].dtype != at::kFloat || x.tensors[0].sizes.size() != 2 ||
      !x.tensors[0].device.is_cpu()) {
    return nullptr;
  }
  return t->args()[0].to_node();
}

}  // namespace

bool prepack_linears(GraphModule& gm) {
  if (!xnnpack_runs() || writes_an_attribute(gm.graph())) return false;
  Graph& g = gm.graph();
  std::vector<Node*> linears;
  for (Node* n : g) {
    if (packable_weight(gm, n) != nullptr) linears.push_back(n);
  }
  for (Node* n : linears) {
    Node* weight = packable_weight(gm, n);
    Node* t = n->args()[2].to_node();
    const FusableClamp fused = fusable_clamp(n);
    Node* clamp = fused.node;
    stop_requiring_grad(gm, weight);
    stop_requiring_grad(gm, n->args()[0]);
    Node* run = nullptr;
    {
      auto here = g.inserting_before(n);
      Node* pack = g.call_function("prepacked::linear_clamp_prepack", {weight, n->args()[0], fused.lo, fused.hi});
      pack->meta().stack_trace = n->meta().stack_trace;
      pack->meta().module_stack = n->meta().module_stack;
      run = g.call_function("prepacked::linear_clamp_run", {n->args()[1], pack});
    }
    run->meta() = (clamp != nullptr ? clamp : n)->meta();
    if (clamp != nullptr) {
      clamp->replace_all_uses_with(run);
      g.erase(clamp);
    }
    n->replace_all_uses_with(run);
    g.erase(n);
    if (t->users().empty()) g.erase(t);
  }
  return !linears.empty();
}

}  // namespace torchcap::detail
