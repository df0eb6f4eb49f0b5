// Note [Linear layers with packed weights]
// A traced nn.Linear on a 2-D input is `addmm(bias, x, t(weight))`, which
// OpenBLAS runs from the transposed weight at every call. In a graph of
// fixed sizes, each becomes torchcap's packed linear layer (Note [torchcap's
// packed linear layer] in kernels/onednn.h), a following relu fused:
//
//   %w = torchcap::linear_prepack(%weight, %bias, input_size, "relu")
//   %y = torchcap::linear_run(%x, %w)
//
// It is faster than addmm and than XNNPACK's packed layer at every size
// measured, 64 x 64 to 768 x 3072. Its packing takes the input's sizes,
// though; in a dynamic graph, the large layers (kMinWeightElements weights
// or more) run as XNNPACK's (prepacked::linear_clamp_prepack /
// linear_clamp_run, the operators PyTorch's optimize_for_mobile uses), which
// take any batch and clamp as they write, fusing a relu or hardtanh; small
// ones stay addmm, XNNPACK's fixed cost being more than addmm's from Python.
//
// As for convolutions (Note [Convolutions with packed weights]), the
// interpreter packs once and the file keeps the weights unpacked.
// Rewritten: aten::addmm with beta and alpha 1 of a 2-D float32 CPU input, a
// float32 attribute bias of one dimension and the `t` of a float32 2-D
// attribute weight, in a graph that writes no attribute.
#include "passes/inference.h"

#include "kernels/onednn.h"

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
Node* packable_weight(const GraphModule& gm, const Node* n, int64_t min_weight_elements) {
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
  if (weight == nullptr || bias == nullptr || weight->value.numel() < min_weight_elements ||
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
  const bool dynamic = gm.is_dynamic();
  if ((dynamic && !xnnpack_runs()) || writes_an_attribute(gm.graph())) return false;
  const int64_t min_weight_elements = dynamic ? kMinWeightElements : 0;
  Graph& g = gm.graph();
  std::vector<Node*> linears;
  for (Node* n : g) {
    if (packable_weight(gm, n, min_weight_elements) != nullptr) linears.push_back(n);
  }
  for (Node* n : linears) {
    Node* weight = packable_weight(gm, n, min_weight_elements);
    Node* t = n->args()[2].to_node();
    const FusableClamp fused = fusable_clamp(n);
    // XNNPACK clamps to any bounds; oneDNN's layer here fuses a relu only.
    Node* clamp = dynamic || fused.relu ? fused.node : nullptr;
    stop_requiring_grad(gm, weight);
    stop_requiring_grad(gm, n->args()[0]);
    Node* run = nullptr;
    {
      auto here = g.inserting_before(n);
      Node* pack = nullptr;
      if (dynamic) {
        pack = g.call_function("prepacked::linear_clamp_prepack", {weight, n->args()[0], fused.lo, fused.hi});
        run = g.call_function("prepacked::linear_clamp_run", {n->args()[1], pack});
      } else {
        ArgumentList input_size;
        for (int64_t s : n->args()[1].to_node()->meta().val.tensors[0].sizes) input_size.emplace_back(s);
        pack = g.call_function(kLinearPrepack, {weight, n->args()[0], Argument(std::move(input_size)),
                                                clamp != nullptr ? "relu" : "none"});
        run = g.call_function(kLinearRun, {n->args()[1], pack});
      }
      pack->meta().stack_trace = n->meta().stack_trace;
      pack->meta().module_stack = n->meta().module_stack;
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
