// Passes for inference graphs (eval mode, no gradients), each in a file of
// its own in src/passes/ and named in named_passes() (pass_manager.cpp), the
// way the command's --passes and Python's passes= reach them, and the
// helpers they share. Internal.
#pragma once

#include <torchcap/graph_module.h>

#include <string>

namespace torchcap::detail {

// Note [Batch norms folded into convolutions] (fold_batch_norms.cpp):
// convolution + eval batch norm becomes one convolution with new weights.
bool fold_batch_norms(GraphModule& gm);

// Note [Constants folded] (fold_constants.cpp): what is computed from
// attributes alone is computed once and becomes an attribute.
bool fold_constants(GraphModule& gm);

// Note [Operators that do nothing] (remove_no_ops.cpp): detach, alias,
// clones and views that give back their input's values, in a graph that
// writes nothing.
bool remove_no_ops(GraphModule& gm);

// Note [Convolutions with packed weights] (prepack_convolutions.cpp): 2-D
// convolutions run by oneDNN with weights packed once and a following relu
// fused, on channels-last activations.
bool prepack_convolutions(GraphModule& gm);

// Note [Linear layers with packed weights] (prepack_linears.cpp): large
// linear layers run by XNNPACK with weights packed once and a following
// relu or hardtanh fused.
bool prepack_linears(GraphModule& gm);

// --- Shared by the passes above ---------------------------------------------

// Whether `n` calls the operator `name` ("aten::relu"), overload `overload`.
bool is_call_of(const Node* n, const char* name, const char* overload = "");

// The attribute a get_attr argument reads when it holds floating-point
// values (not meta), else nullptr (also for none and for other arguments).
const Attribute* float_attribute_of(const GraphModule& gm, const Argument& a);

// An attribute name not yet taken: `base`, else `base_1`, `base_2`, ...
std::string fresh_attribute_name(const GraphModule& gm, const std::string& base);

// The attribute a get_attr node reads, made not to require grad (its
// value detached, the same memory): XNNPACK refuses to pack a weight that
// requires grad, also when torch.fx runs the packing under no_grad.
void stop_requiring_grad(GraphModule& gm, const Argument& get_attr);

// The only reader of `n` when it is an activation a packed kernel applies as
// it writes its result: a relu (in place or not; bounds 0 and none) or a
// hardtanh with constant bounds (ReLU6). `node` is nullptr for any other.
struct FusableClamp {
  Node* node = nullptr;
  bool relu = false;
  Argument lo, hi;
};
FusableClamp fusable_clamp(Node* n);

// Whether LibTorch was built with XNNPACK and it runs on this CPU: its
// packing operators are registered either way, and throw without.
bool xnnpack_runs();

// Whether some node of `gm` writes a tensor (an argument, declared or
// hidden): passes that drop copies or share values hold only without.
bool writes_any_tensor(const Graph& g);

// The first node that writes an attribute, or a view of one, or nullptr:
// passes that compute from attributes once hold only without.
const Node* writes_an_attribute(const Graph& g);

}  // namespace torchcap::detail
