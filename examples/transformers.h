// Transformer models for the meta-mode tests and benchmarks, written as a
// LibTorch C++ frontend user would write them: a Vision Transformer
// (torchvision's ViT architecture) and a GPT-2-style decoder.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace torchcap::examples {

struct ViTOptions {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t layers = 12;
  int64_t width = 768;
  int64_t heads = 12;
  int64_t mlp_width = 3072;
  int64_t num_classes = 1000;
};

// One pre-norm encoder block: x + attention(ln(x)), then x + mlp(ln(x)).
struct ViTBlock : torch::nn::Module {
  ViTBlock(int64_t width, int64_t heads, int64_t mlp_width);
  torch::Tensor forward(torch::Tensor x);
  int64_t heads;
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};

// ViT-B/16 by default: patch embedding, class token, position embedding,
// encoder blocks, head on the class token. Input N x 3 x image_size^2.
struct ViT : torch::nn::Module {
  explicit ViT(const ViTOptions& options = {});
  torch::Tensor forward(torch::Tensor images);
  ViTOptions options;
  torch::nn::Conv2d conv_proj{nullptr};
  torch::Tensor class_token, pos_embedding;
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};
};

// GPT-2 XL's shape by default: 48 layers, width 1600, 25 heads, about 1.56
// billion parameters.
struct DecoderOptions {
  int64_t layers = 48;
  int64_t width = 1600;
  int64_t heads = 25;
  int64_t vocab = 50257;
  int64_t context = 1024;
};

// The decoder's layers create their parameters directly on the device they
// are given: torch::nn's built-in layers allocate and initialise theirs on
// the CPU first, which for this size is 6 GB before anything can be moved
// to the meta device. On the meta device parameters have no memory at all.
struct DecoderLinear : torch::nn::Module {
  DecoderLinear(int64_t in, int64_t out, torch::Device device);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
};

struct DecoderLayerNorm : torch::nn::Module {
  DecoderLayerNorm(int64_t width, torch::Device device);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
};

struct DecoderBlock : torch::nn::Module {
  DecoderBlock(const DecoderOptions& options, torch::Device device);
  // `mask`: context x context, 0 on and below the diagonal, -inf above.
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask);
  int64_t heads;
  std::shared_ptr<DecoderLayerNorm> ln_1, ln_2;
  std::shared_ptr<DecoderLinear> c_attn, attn_proj, c_fc, mlp_proj;
};

// Token ids (N x T, int64) to next-token logits (N x T x vocab); the output
// projection is tied to the token embedding, as in GPT-2.
struct Decoder : torch::nn::Module {
  explicit Decoder(const DecoderOptions& options = {},
                   torch::Device device = torch::Device(torch::kCPU));
  torch::Tensor forward(torch::Tensor tokens);
  DecoderOptions options;
  torch::Tensor wte, wpe, mask;
  std::vector<std::shared_ptr<DecoderBlock>> blocks;
  std::shared_ptr<DecoderLayerNorm> ln_f;
};

}  // namespace torchcap::examples
