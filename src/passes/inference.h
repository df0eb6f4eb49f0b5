// Passes for inference graphs (eval mode, no gradients), each in a file of
// its own in src/passes/ and named in named_passes() (pass_manager.cpp), the
// way the command's --passes and Python's passes= reach them. Internal.
#pragma once

#include <torchcap/graph_module.h>

namespace torchcap::detail {

// Note [Batch norms folded into convolutions] (fold_batch_norms.cpp):
// convolution + eval batch norm becomes one convolution with new weights.
bool fold_batch_norms(GraphModule& gm);

}  // namespace torchcap::detail
