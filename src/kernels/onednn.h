// Note [torchcap's packed convolution]
// LibTorch 1.13's packed oneDNN convolution (mkldnn_prepacked::conv2d_run)
// runs the direct algorithm and fuses a relu only. oneDNN can do more for a
// graph known ahead: Winograd's algorithm for 3x3 convolutions of stride 1,
// where the CPU has it (AVX-512), which on ResNet-18's convolutions takes
// 0.45 to 0.75 of the direct one's time; and a residual add fused into the
// convolution (oneDNN's "sum" post-op), followed by a relu, which saves two
// passes over the block's result; and a ReLU6 (oneDNN's clip), which
// LibTorch fuses into XNNPACK's convolution only. torchcap registers its
// own pair of operators for that, in the namespace torchcap, on the oneDNN
// LibTorch itself links (Debian's libdnnl):
//
//   %w = torchcap::conv2d_prepack(%weight, %bias, stride, padding, dilation,
//                                 groups, input_size, post_op)
//   %y = torchcap::conv2d_run(%x, %w, %residual)
//
// post_op is "none", "relu", "hardtanh" (with clamp_min and clamp_max: a
// ReLU6), "add" or "add_relu"; %residual is given with "add" and
// "add_relu" only, has the result's sizes, and the result is
// relu(conv(x) + residual) (or without the relu). The packing picks the
// algorithm when it runs, on the machine that runs the graph: Winograd where
// oneDNN offers it for this convolution and it has 32 channels or more in
// and out (below, measured, it is slower), else the direct algorithm on
// channels-last activations (the kernel LibTorch's packed convolution runs).
// Winograd's layout is oneDNN's blocked one (16 channels at a time), which a
// strided tensor cannot hold: the input and residual are reordered into it
// and the result back to channels-last inside the call, in buffers each
// thread keeps for its next call. Results are channels-last tensors.
//
// Winograd computes the convolution through transformed tiles, which rounds
// differently from the direct algorithm: on ResNet-18 (random weights) the
// outputs stay within docs/optimize.md's tolerance of eager's.
//
// The file format holds these nodes as any other: the weights are saved
// unpacked and the packing is a node, computed once when an interpreter is
// made (Note [Views of attributes, computed once]). The operators exist
// wherever libtorchcap is loaded (the command, the C++ library, Python's
// torchcap._C); a reader without it (the pure-Python loader alone) refuses
// such a file and says why.
// Note [torchcap's packed linear layer]
// A linear layer traced as addmm(bias, x, t(weight)) runs through OpenBLAS
// from the transposed weight at every call, and a relu after it is a second
// call. oneDNN's inner product packs the weight once and applies the relu
// as it writes the result:
//
//   %w = torchcap::linear_prepack(%weight, %bias, input_size, post_op)
//   %y = torchcap::linear_run(%x, %w)
//
// post_op is "none" or "relu"; x is 2-D, of the packed input_size. Measured
// per layer in C++, one thread, with its relu (docs/benchmarks.md): 64 x 64
// at batch 1, 1.5 us against addmm's 3.3 and XNNPACK's 2.1; 1280 x 1000,
// 67 us against 389 and 103; 768 x 3072 at batch 32, 0.80 ms against 2.0
// and 1.08. A call reuses the layer's oneDNN memory objects (making them
// cost more than a small layer's arithmetic: the MLP-200 took 0.55 ms
// instead of 0.32), unless another thread is running the layer at once.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace torchcap {
namespace detail {

inline constexpr const char* kConv2dPrepack = "torchcap::conv2d_prepack";
inline constexpr const char* kConv2dRun = "torchcap::conv2d_run";
inline constexpr const char* kLinearPrepack = "torchcap::linear_prepack";
inline constexpr const char* kLinearRun = "torchcap::linear_run";

// Whether this machine runs `torchcap::conv2d_run` by Winograd for a 3x3,
// stride-1 convolution of `channels` to `channels` (oneDNN offers it).
bool onednn_winograd_available(int channels = 64);

// The algorithm a packed convolution (conv2d_prepack's result) runs:
// "winograd" or "direct". Throws for any other value.
std::string onednn_conv_algorithm(const c10::IValue& packed);

}  // namespace detail
}  // namespace torchcap
