// Note [Batch norms folded into convolutions]
// In an inference graph a batch norm after a convolution is an affine map
// per output channel with constant coefficients: y = (x - mean) * s + beta,
// s = gamma / sqrt(var + eps). Applied to a convolution's result it is the
// same convolution with weight W * s (each output channel's filter scaled)
// and bias (b - mean) * s + beta, computed once here instead of at every run
// (TorchScript's freeze folds it the same way). A linear layer before a
// BatchNorm1d, `addmm(b, x, t(W))`, folds the same way (W's rows are its
// output features). Only where nothing else can
// tell: the batch norm is aten::native_batch_norm with training=false on the
// result of a non-transposed aten::convolution (or such an addmm, whose `t`
// nothing else reads either) that nothing else reads, every
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

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace torchcap::detail {
namespace {

// A layer a batch norm folds into: `result` (its convolution or addmm) and
// where it reads its weight and bias (the convolution itself; for a linear
// layer, `addmm(bias, x, t(weight))`, the `t` and the addmm).
struct Layer {
  Node* result = nullptr;
  Node* weight_reader = nullptr;
  size_t weight_index = 0;
  size_t bias_index = 0;  // in `result`; a convolution's may be none
};

std::optional<Layer> foldable_layer(Node* n) {
  if (n->users().size() != 1 || !n->kwargs().empty()) return std::nullopt;
  const ArgumentList& a = n->args();
  if (is_call_of(n, "aten::convolution") && a.size() == 9 && a[6].is_bool() && !a[6].to_bool()) {
    return Layer{n, n, 1, 2};  // not transposed
  }
  if (is_call_of(n, "aten::addmm") && a.size() == 3 && a[0].is_node() && a[2].is_node()) {
    Node* t = a[2].to_node();
    if (is_call_of(t, "aten::t") && t->users().size() == 1 && t->args().size() == 1) return Layer{n, t, 0, 0};
  }
  return std::nullopt;
}

}  // namespace

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
    const std::optional<Layer> layer = foldable_layer(b[0].to_node());
    if (!layer) continue;
    Node* conv = layer->result;
    const Argument weight_arg = layer->weight_reader->args()[layer->weight_index];
    const Argument bias_arg = conv->args()[layer->bias_index];
    const Attribute* weight = float_attribute_of(gm, weight_arg);
    const Attribute* conv_bias = bias_arg.is_none() ? nullptr : float_attribute_of(gm, bias_arg);
    const Attribute* gamma = b[1].is_none() ? nullptr : float_attribute_of(gm, b[1]);
    const Attribute* beta = b[2].is_none() ? nullptr : float_attribute_of(gm, b[2]);
    const Attribute* mean = float_attribute_of(gm, b[3]);
    const Attribute* var = float_attribute_of(gm, b[4]);
    if (weight == nullptr || (!bias_arg.is_none() && conv_bias == nullptr) || (!b[1].is_none() && gamma == nullptr) ||
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
    Node* old_weight = weight_arg.to_node();
    Node* old_bias = bias_arg.is_node() ? bias_arg.to_node() : nullptr;
    for (auto [reader, index, name, value] :
         {std::tuple{layer->weight_reader, layer->weight_index, &weight_name, &folded_weight},
          std::tuple{conv, layer->bias_index, &bias_name, &folded_bias}}) {
      auto here = g.inserting_before(reader);
      Node* read = g.get_attr(*name);
      read->meta().val = ValueMeta::tensor(TensorMeta::of(*value));
      reader->set_arg(index, read);
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
