// Note [Batch norms folded into convolutions]
// In an inference graph a batch norm after a convolution is an affine map
// per output channel with constant coefficients: y = (x - mean) * s + beta,
// s = gamma / sqrt(var + eps). Applied to a convolution's result it is the
// same convolution with weight W * s (each output channel's filter scaled)
// and bias (b - mean) * s + beta, computed once here instead of at every run
// (TorchScript's freeze folds it the same way). Only where nothing else can
// tell: the batch norm is aten::native_batch_norm with training=false on the
// result of a non-transposed aten::convolution that nothing else reads, every
// coefficient is an attribute of a floating dtype, the convolution's weight
// and bias too, and of the batch norm's three results only the first is read
// (getitem 0; in eval the other two are empty). The new weight and bias are
// new attributes (the old ones go if nothing else reads them); the folded
// values are computed in double and rounded once to the weight's dtype, so
// results differ from the unfolded graph's by rounding only
// (docs/passes.md gives the tolerance the tests hold them to).
#include "passes/inference.h"

#include <torchcap/graph_module.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <string>
#include <tuple>
#include <vector>

namespace torchcap::detail {

bool fold_batch_norms(GraphModule& gm) {
  Graph& g = gm.graph();
  bool changed = false;
  std::vector<Node*> batch_norms;  // collected first: folding erases nodes
  for (Node* n : g) {
    if (is_call_of(n, "aten::native_batch_norm")) batch_norms.push_back(n);
  }
  for (Node* bn : batch_norms) {
    if (bn->args().size() != 8 || !bn->kwargs().empty()) continue;
    const ArgumentList& b = bn->args();
    if (!b[5].is_bool() || b[5].to_bool() || !b[7].is_double() || !b[0].is_node()) continue;
    Node* conv = b[0].to_node();
    if (!is_call_of(conv, "aten::convolution") || conv->users().size() != 1 || conv->args().size() != 9 ||
        !conv->kwargs().empty()) {
      continue;
    }
    const ArgumentList& c = conv->args();
    if (!c[6].is_bool() || c[6].to_bool()) continue;  // transposed
    const Attribute* weight = float_attribute_of(gm, c[1]);
    const Attribute* conv_bias = c[2].is_none() ? nullptr : float_attribute_of(gm, c[2]);
    const Attribute* gamma = b[1].is_none() ? nullptr : float_attribute_of(gm, b[1]);
    const Attribute* beta = b[2].is_none() ? nullptr : float_attribute_of(gm, b[2]);
    const Attribute* mean = float_attribute_of(gm, b[3]);
    const Attribute* var = float_attribute_of(gm, b[4]);
    if (weight == nullptr || (!c[2].is_none() && conv_bias == nullptr) || (!b[1].is_none() && gamma == nullptr) ||
        (!b[2].is_none() && beta == nullptr) || mean == nullptr || var == nullptr) {
      continue;
    }
    Node* result = nullptr;
    bool only_first = true;
    for (Node* u : bn->users()) {
      if (!u->is_getitem() || u->args().size() != 2 || !u->args()[1].is_int()) {
        only_first = false;
      } else if (u->args()[1].to_int() == 0) {
        result = result == nullptr ? u : nullptr;  // two getitem 0: leave it
        only_first = only_first && result != nullptr;
      } else if (!u->users().empty()) {
        only_first = false;
      }
    }
    if (!only_first || result == nullptr) continue;

    at::Tensor folded_weight, folded_bias;
    {
      c10::NoGradGuard no_grad;
      const at::Tensor w = weight->value.to(at::kDouble);
      const int64_t channels = w.size(0);
      if (mean->value.numel() != channels || var->value.numel() != channels) continue;
      at::Tensor scale = at::rsqrt(var->value.to(at::kDouble) + b[7].to_double());
      if (gamma != nullptr) scale = scale * gamma->value.to(at::kDouble);
      std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
      shape[0] = channels;
      at::Tensor bias = conv_bias != nullptr ? conv_bias->value.to(at::kDouble) : at::zeros({channels}, w.options());
      bias = (bias - mean->value.to(at::kDouble)) * scale;
      if (beta != nullptr) bias = bias + beta->value.to(at::kDouble);
      folded_weight = (w * scale.reshape(shape)).to(weight->value.scalar_type()).contiguous();
      folded_bias = bias.to(weight->value.scalar_type()).contiguous();
    }
    const std::string weight_name = fresh_attribute_name(gm, weight->name + "_folded");
    gm.set_attribute(weight_name, folded_weight, AttributeKind::Parameter);
    const std::string bias_name = fresh_attribute_name(gm, weight_name.substr(0, weight_name.rfind('.') + 1) + "bias_folded");
    gm.set_attribute(bias_name, folded_bias, AttributeKind::Parameter);
    Node* old_weight = c[1].to_node();
    Node* old_bias = c[2].is_node() ? c[2].to_node() : nullptr;
    {
      auto at_conv = g.inserting_before(conv);
      for (auto [index, name, value] : {std::tuple{1, &weight_name, &folded_weight},
                                        std::tuple{2, &bias_name, &folded_bias}}) {
        Node* read = g.get_attr(*name);
        read->meta().val = ValueMeta::tensor(TensorMeta::of(*value));
        conv->set_arg(static_cast<size_t>(index), read);
      }
    }
    result->replace_all_uses_with(conv);
    for (Node* u : bn->users().vec()) g.erase(u);
    std::vector<Node*> inputs = bn->inputs().vec();
    g.erase(bn);
    inputs.push_back(old_weight);
    if (old_bias != nullptr) inputs.push_back(old_bias);
    for (Node* n : inputs) {
      if (n != conv && n->op() == OpCode::GetAttr && n->users().empty()) g.erase(n);
    }
    changed = true;
  }
  if (changed) gm.remove_unused_attributes();
  return changed;
}

}  // namespace torchcap::detail
