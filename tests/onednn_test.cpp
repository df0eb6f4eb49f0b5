// torchcap's oneDNN operators (src/kernels/onednn.h): conv2d_prepack /
// conv2d_run (Note [torchcap's packed convolution]) equal to LibTorch's
// convolution (and the add and relu they fuse) within docs/optimize.md's
// tolerance, by Winograd and by the direct algorithm, from either layout and
// from several threads at once; linear_prepack / linear_run (Note
// [torchcap's packed linear layer]) equal to a linear layer and its relu;
// and a clear error for what they cannot take.
#include "kernels/onednn.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <thread>
#include <vector>

namespace torchcap {
namespace {

struct Case {
  const char* what;
  int64_t in_channels, out_channels, size, kernel, stride, padding, dilation, groups;
  bool bias;
};

// Winograd where the machine has it: 3x3, stride 1, as in ResNet's blocks.
const Case kCases[] = {
    {"3x3 stride 1 (Winograd)", 32, 32, 14, 3, 1, 1, 1, 1, true},
    {"3x3 stride 1, 16 to 48 channels, no bias", 16, 48, 9, 3, 1, 1, 1, 1, false},
    {"3x3 stride 1, 3 input channels", 3, 16, 12, 3, 1, 1, 1, 1, true},
    {"7x7 stride 2 (a stem)", 3, 16, 20, 7, 2, 3, 1, 1, true},
    {"1x1 stride 2 (a downsample)", 16, 32, 10, 1, 2, 0, 1, 1, false},
    {"3x3 grouped", 16, 16, 8, 3, 1, 1, 1, 4, true},
    {"3x3 depthwise stride 2", 16, 16, 9, 3, 2, 1, 1, 16, true},
    {"3x3 dilated", 8, 8, 11, 3, 1, 2, 2, 1, true},
};

c10::IValue call(const char* name, std::vector<c10::IValue> stack) {
  c10::Dispatcher::singleton().findSchemaOrThrow(name, "").callBoxed(&stack);
  return stack.at(0);
}

// A "hardtanh" post-op clamps to [-0.5, 1.5] unless bounds are given.
c10::IValue pack(const Case& c, const at::Tensor& weight, const at::Tensor& bias, int64_t batch,
                 const std::string& post_op, c10::IValue clamp_min = c10::IValue(),
                 c10::IValue clamp_max = c10::IValue()) {
  if (post_op == "hardtanh" && clamp_min.isNone() && clamp_max.isNone()) {
    clamp_min = -0.5;
    clamp_max = 1.5;
  }
  return call(detail::kConv2dPrepack,
              {weight, c.bias ? c10::IValue(bias) : c10::IValue(), std::vector<int64_t>{c.stride, c.stride},
               std::vector<int64_t>{c.padding, c.padding}, std::vector<int64_t>{c.dilation, c.dilation}, c.groups,
               std::vector<int64_t>{batch, c.in_channels, c.size, c.size}, post_op, clamp_min, clamp_max});
}

at::Tensor run(const at::Tensor& x, const c10::IValue& packed, const c10::IValue& residual = c10::IValue()) {
  return call(detail::kConv2dRun, {x, packed, residual}).toTensor();
}

// docs/optimize.md's tolerance.
void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double scale = std::max(1.0, want.abs().max().item<double>());
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5 * scale))
      << what << ": max difference " << (got - want).abs().max().item<double>();
}

TEST(OnednnConv, EqualsLibTorchsConvolutionWithEachPostOp) {
  at::manual_seed(0);
  for (const Case& c : kCases) {
    const at::Tensor weight = at::randn({c.out_channels, c.in_channels / c.groups, c.kernel, c.kernel}) * 0.2;
    const at::Tensor bias = at::randn({c.out_channels});
    for (const int64_t batch : {1, 2}) {
      const at::Tensor x = at::randn({batch, c.in_channels, c.size, c.size});
      const at::Tensor conv = at::conv2d(x, weight, c.bias ? bias : at::Tensor(), {c.stride, c.stride},
                                         {c.padding, c.padding}, {c.dilation, c.dilation}, c.groups);
      const at::Tensor residual = at::randn_like(conv);
      for (const std::string post_op : {"none", "relu", "hardtanh", "add", "add_relu"}) {
        const bool add = post_op.rfind("add", 0) == 0;
        at::Tensor want = add ? conv + residual : conv;
        if (post_op.find("relu") != std::string::npos) want = want.relu();
        if (post_op == "hardtanh") want = want.clamp(-0.5, 1.5);
        const c10::IValue packed = pack(c, weight, bias, batch, post_op);
        const std::string what = std::string(c.what) + ", batch " + std::to_string(batch) + ", " + post_op;
        // The input and the residual in either layout; the result channels-last.
        for (const at::MemoryFormat layout : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
          const at::Tensor got = run(x.contiguous(layout), packed, add ? c10::IValue(residual.contiguous(layout))
                                                                       : c10::IValue());
          expect_close(got, want, what);
          EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
        }
      }
    }
  }
}

// Winograd for 3x3 convolutions of stride 1 and 32 channels or more where
// oneDNN has it here (AVX-512), the direct algorithm for the others.
TEST(OnednnConv, TheAlgorithmPackingChooses) {
  const std::string three_by_three = detail::onednn_winograd_available() ? "winograd" : "direct";
  for (const Case& c : kCases) {
    const at::Tensor weight = at::randn({c.out_channels, c.in_channels / c.groups, c.kernel, c.kernel});
    const bool winograd_shape = c.kernel == 3 && c.stride == 1 && c.dilation == 1 && c.groups == 1;
    // Below 32 channels Winograd is slower (the Note).
    const bool expected_winograd = winograd_shape && std::min(c.in_channels, c.out_channels) >= 32;
    EXPECT_EQ(detail::onednn_conv_algorithm(pack(c, weight, at::zeros({c.out_channels}), 1, "none")),
              expected_winograd ? three_by_three : "direct")
        << c.what;
  }
}

// Each thread keeps its own buffers: calls at once give what calls in turn do.
TEST(OnednnConv, CallsFromSeveralThreadsAtOnce) {
  at::manual_seed(0);
  const Case& c = kCases[0];
  const at::Tensor weight = at::randn({c.out_channels, c.in_channels, 3, 3});
  const at::Tensor bias = at::randn({c.out_channels});
  const c10::IValue packed = pack(c, weight, bias, 1, "add_relu");
  std::vector<at::Tensor> inputs, residuals, want;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(at::randn({1, c.in_channels, c.size, c.size}));
    residuals.push_back(at::randn({1, c.out_channels, c.size, c.size}));
    want.push_back(run(inputs[i], packed, residuals[i]));
  }
  std::vector<at::Tensor> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 20; ++k) got[i] = run(inputs[i], packed, residuals[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << i;
}

void expect_error(const std::function<void()>& f, const std::string& expected) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << expected;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(OnednnConv, WhatItCannotTakeIsAnErrorThatSaysWhat) {
  const Case& c = kCases[0];
  const at::Tensor weight = at::randn({32, 32, 3, 3});
  const at::Tensor bias = at::randn({32});
  const c10::IValue plain = pack(c, weight, bias, 1, "none");
  const c10::IValue with_add = pack(c, weight, bias, 1, "add");
  const at::Tensor x = at::randn({1, 32, 14, 14});
  expect_error([&] { run(at::randn({2, 32, 14, 14}), plain); },
               "packed for a float32 CPU input of sizes [1, 32, 14, 14], got Float [2, 32, 14, 14]");
  expect_error([&] { run(x.to(at::kDouble), plain); }, "got Double [1, 32, 14, 14]");
  expect_error([&] { run(x, with_add); }, "packed with post_op 'add'; give the tensor to add");
  expect_error([&] { run(x, plain, at::randn({1, 32, 14, 14})); }, "a residual was given to a convolution packed without");
  expect_error([&] { run(x, with_add, at::randn({1, 32, 7, 7})); },
               "the residual must be a float32 CPU tensor of the result's sizes [1, 32, 14, 14], got Float [1, 32, 7, 7]");
  expect_error([&] { pack(c, weight, bias, 1, "gelu"); },
               "post_op must be 'none', 'relu', 'add', 'add_relu' or 'hardtanh', got 'gelu'");
  expect_error([&] { pack(c, weight, bias, 1, "relu", 0.0, 6.0); },
               "clamp_min and clamp_max are given with post_op 'hardtanh', and only then");
  expect_error([&] { pack(c, weight, bias, 1, "hardtanh", 0.0); },
               "clamp_min and clamp_max are given with post_op 'hardtanh', and only then");
  expect_error([&] { pack(c, weight, bias, 1, "hardtanh", 6.0, 0.0); }, "clamp_min 6 is above clamp_max 0");
  expect_error([&] { pack(c, at::randn({32, 32, 3}), bias, 1, "none"); }, "the weight must be a non-empty 4-D float32 CPU tensor, got sizes [32, 32, 3]");
  expect_error([&] { pack(c, weight, at::randn({31}), 1, "none"); }, "the bias must be a float32 CPU tensor of 32 elements");
  Case wrong_channels = c;
  wrong_channels.in_channels = 16;
  expect_error([&] { pack(wrong_channels, weight, bias, 1, "none"); },
               "input_size must be [N, C, H, W] with C = 32 for this weight and groups, got [1, 16, 14, 14]");
  Case too_small = c;
  too_small.size = 1;
  too_small.padding = 0;
  expect_error([&] { pack(too_small, weight, bias, 1, "none"); }, "no output for input_size [1, 32, 1, 1]");
}

TEST(OnednnLinear, EqualsALinearLayerAndItsRelu) {
  at::manual_seed(0);
  for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{1, 64, 64}, {10, 32, 48}, {3, 1280, 1000}}) {
    const at::Tensor weight = at::randn({n, k}) * 0.1;
    const at::Tensor bias = at::randn({n});
    const at::Tensor x = at::randn({k, m}).t();  // not contiguous
    for (const bool with_bias : {true, false}) {
      for (const std::string post_op : {"none", "relu"}) {
        const c10::IValue packed = call(detail::kLinearPrepack, {weight, with_bias ? c10::IValue(bias) : c10::IValue(),
                                                                std::vector<int64_t>{m, k}, post_op});
        at::Tensor want = at::linear(x, weight, with_bias ? bias : at::Tensor());
        if (post_op == "relu") want = want.relu();
        expect_close(call(detail::kLinearRun, {x, packed}).toTensor(), want,
                     std::to_string(m) + "x" + std::to_string(k) + "->" + std::to_string(n) + " " + post_op);
      }
    }
  }
}

// A call reuses the layer's memory objects when no other thread runs it,
// and makes its own when one does: both give what calls in turn do.
TEST(OnednnLinear, CallsFromSeveralThreadsAtOnce) {
  at::manual_seed(0);
  const c10::IValue packed = call(detail::kLinearPrepack, {at::randn({64, 64}), at::randn({64}),
                                                          std::vector<int64_t>{1, 64}, std::string("relu")});
  std::vector<at::Tensor> inputs, want;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(at::randn({1, 64}));
    want.push_back(call(detail::kLinearRun, {inputs[i], packed}).toTensor());
  }
  std::vector<char> same(4, 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 2000; ++k) {
        if (!at::equal(call(detail::kLinearRun, {inputs[i], packed}).toTensor(), want[i])) same[i] = 0;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(same[i]) << i;
}

TEST(OnednnLinear, WhatItCannotTakeIsAnErrorThatSaysWhat) {
  const at::Tensor weight = at::randn({8, 4});
  auto pack = [&](const at::Tensor& w, const c10::IValue& bias, std::vector<int64_t> size, const std::string& post_op) {
    return call(detail::kLinearPrepack, {w, bias, std::move(size), post_op});
  };
  const c10::IValue packed = pack(weight, c10::IValue(), {2, 4}, "none");
  expect_error([&] { call(detail::kLinearRun, {at::randn({3, 4}), packed}); },
               "packed for a float32 CPU input of sizes [2, 4], got Float [3, 4]");
  expect_error([&] { pack(weight, c10::IValue(), {2, 5}, "none"); }, "input_size must be [M, 4] for this weight, got [2, 5]");
  expect_error([&] { pack(weight, at::randn({7}), {2, 4}, "none"); }, "the bias must be a float32 CPU tensor of 8 elements");
  expect_error([&] { pack(weight, c10::IValue(), {2, 4}, "gelu"); }, "post_op must be 'none' or 'relu', got 'gelu'");
  expect_error([&] { pack(at::randn({8}), c10::IValue(), {2, 4}, "none"); },
               "the weight must be a non-empty 2-D float32 CPU tensor, got sizes [8]");
}

}  // namespace
}  // namespace torchcap
