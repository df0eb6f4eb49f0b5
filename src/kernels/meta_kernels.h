// Note [Meta kernels LibTorch 1.13 lacks]
// Shape propagation and meta-mode tracing (TraceOptions::meta) run operators
// on meta tensors, but LibTorch 1.13 has no meta implementation for a few
// common operators (relu, native_batch_norm, index_select, var.correction,
// where.self;
// convolution's composite kernel picks a backend that fails on meta; the
// inference fast paths of nn.MultiheadAttention and nn.TransformerEncoderLayer,
// _native_multi_head_attention and _transformer_encoder_layer_fwd). torchcap
// registers meta kernels for them, one set for both users, and only where
// LibTorch has none of its own (in a Python process, torch's Python meta
// registrations may already cover some): before, such calls failed with
// "Could not run ... with arguments from the 'Meta' backend". Internal.
#pragma once

namespace torchcap {
namespace detail {

// Registers the missing meta kernels, once per process.
void ensure_meta_kernels();

}  // namespace detail
}  // namespace torchcap
