#include "transformers.h"

#include <cmath>
#include <limits>

namespace torchcap::examples {

namespace nn = torch::nn;

namespace {

// Scaled dot-product attention over `heads` heads: q, k, v are N x T x C.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        int64_t heads, const torch::Tensor& mask = {}) {
  const int64_t n = q.size(0), t = q.size(1), c = q.size(2), d = c / heads;
  auto split = [&](const torch::Tensor& x) { return x.view({n, t, heads, d}).transpose(1, 2); };
  torch::Tensor scores = split(q).matmul(split(k).transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));
  if (mask.defined()) scores = scores + mask.slice(0, 0, t).slice(1, 0, t);
  torch::Tensor y = torch::softmax(scores, -1).matmul(split(v));
  return y.transpose(1, 2).contiguous().view({n, t, c});
}

}  // namespace

ViTBlock::ViTBlock(int64_t width, int64_t heads, int64_t mlp_width) : heads(heads) {
  ln_1 = register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({width}).eps(1e-6)));
  qkv = register_module("qkv", nn::Linear(width, 3 * width));
  proj = register_module("proj", nn::Linear(width, width));
  ln_2 = register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({width}).eps(1e-6)));
  fc1 = register_module("fc1", nn::Linear(width, mlp_width));
  fc2 = register_module("fc2", nn::Linear(mlp_width, width));
}

torch::Tensor ViTBlock::forward(torch::Tensor x) {
  std::vector<torch::Tensor> qkv_parts = qkv(ln_1(x)).chunk(3, -1);
  x = x + proj(attention(qkv_parts[0], qkv_parts[1], qkv_parts[2], heads));
  return x + fc2(torch::gelu(fc1(ln_2(x))));
}

ViT::ViT(const ViTOptions& o) : options(o) {
  conv_proj = register_module(
      "conv_proj", nn::Conv2d(nn::Conv2dOptions(3, o.width, o.patch_size).stride(o.patch_size)));
  const int64_t tokens = (o.image_size / o.patch_size) * (o.image_size / o.patch_size) + 1;
  class_token = register_parameter("class_token", torch::zeros({1, 1, o.width}));
  pos_embedding = register_parameter("pos_embedding", torch::randn({1, tokens, o.width}) * 0.02);
  blocks = register_module("blocks", nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i) blocks->push_back(ViTBlock(o.width, o.heads, o.mlp_width));
  ln = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({o.width}).eps(1e-6)));
  head = register_module("head", nn::Linear(o.width, o.num_classes));
}

torch::Tensor ViT::forward(torch::Tensor images) {
  torch::Tensor x = conv_proj(images).flatten(2).transpose(1, 2);
  x = torch::cat({class_token.expand({x.size(0), -1, -1}), x}, 1) + pos_embedding;
  for (const auto& block : *blocks) x = block->as<ViTBlock>()->forward(x);
  return head(ln(x).select(1, 0));
}

DecoderLinear::DecoderLinear(int64_t in, int64_t out, torch::Device device) {
  auto options = torch::TensorOptions().device(device);
  weight = register_parameter("weight", torch::empty({out, in}, options));
  bias = register_parameter("bias", torch::zeros({out}, options));
  if (!device.is_meta()) {
    torch::NoGradGuard no_grad;
    weight.normal_(0, 0.02);
  }
}

torch::Tensor DecoderLinear::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(x, weight, bias);
}

DecoderLayerNorm::DecoderLayerNorm(int64_t width, torch::Device device) {
  auto options = torch::TensorOptions().device(device);
  weight = register_parameter("weight", torch::ones({width}, options));
  bias = register_parameter("bias", torch::zeros({width}, options));
}

torch::Tensor DecoderLayerNorm::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {weight.size(0)}, weight, bias, 1e-5);
}

DecoderBlock::DecoderBlock(const DecoderOptions& o, torch::Device device) : heads(o.heads) {
  ln_1 = register_module("ln_1", std::make_shared<DecoderLayerNorm>(o.width, device));
  c_attn = register_module("c_attn", std::make_shared<DecoderLinear>(o.width, 3 * o.width, device));
  attn_proj = register_module("attn_proj", std::make_shared<DecoderLinear>(o.width, o.width, device));
  ln_2 = register_module("ln_2", std::make_shared<DecoderLayerNorm>(o.width, device));
  c_fc = register_module("c_fc", std::make_shared<DecoderLinear>(o.width, 4 * o.width, device));
  mlp_proj = register_module("mlp_proj", std::make_shared<DecoderLinear>(4 * o.width, o.width, device));
}

torch::Tensor DecoderBlock::forward(torch::Tensor x, const torch::Tensor& mask) {
  std::vector<torch::Tensor> qkv = c_attn->forward(ln_1->forward(x)).split(x.size(-1), -1);
  x = x + attn_proj->forward(attention(qkv[0], qkv[1], qkv[2], heads, mask));
  return x + mlp_proj->forward(torch::gelu(c_fc->forward(ln_2->forward(x)), "tanh"));
}

Decoder::Decoder(const DecoderOptions& o, torch::Device device) : options(o) {
  auto on_device = torch::TensorOptions().device(device);
  wte = register_parameter("wte", torch::empty({o.vocab, o.width}, on_device));
  wpe = register_parameter("wpe", torch::empty({o.context, o.width}, on_device));
  if (!device.is_meta()) {
    torch::NoGradGuard no_grad;
    wte.normal_(0, 0.02);
    wpe.normal_(0, 0.01);
  }
  mask = register_buffer(
      "mask", torch::full({o.context, o.context}, -std::numeric_limits<float>::infinity(), on_device)
                  .triu(1));
  for (int64_t i = 0; i < o.layers; ++i) {
    blocks.push_back(register_module("h" + std::to_string(i), std::make_shared<DecoderBlock>(o, device)));
  }
  ln_f = register_module("ln_f", std::make_shared<DecoderLayerNorm>(o.width, device));
}

torch::Tensor Decoder::forward(torch::Tensor tokens) {
  torch::Tensor positions = torch::arange(tokens.size(1), tokens.options());
  torch::Tensor x = torch::embedding(wte, tokens) + torch::embedding(wpe, positions);
  for (const auto& block : blocks) x = block->forward(x, mask);
  return torch::nn::functional::linear(ln_f->forward(x), wte);
}

}  // namespace torchcap::examples
