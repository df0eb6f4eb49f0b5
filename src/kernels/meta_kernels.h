// Note [Meta kernels LibTorch 1.13 lacks]
// Shape propagation runs graphs on meta tensors, but LibTorch 1.13 has no
// meta implementation for a few common operators (relu, native_batch_norm,
// index_select, var.correction; convolution's composite kernel picks a
// backend that fails on meta). torchcap registers meta kernels for them, and
// only where LibTorch has none of its own: before, such calls failed with
// "Could not run ... with arguments from the 'Meta' backend". Internal.
#pragma once

namespace torchcap {
namespace detail {

// Registers the missing meta kernels, once per process.
void ensure_meta_kernels();

}  // namespace detail
}  // namespace torchcap
