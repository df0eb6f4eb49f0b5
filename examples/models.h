// The models and programs of the example zoo, written as a LibTorch C++
// frontend user would write them.
#pragma once

#include <torch/torch.h>

#include <tuple>
#include <vector>

namespace torchcap::examples {

struct MLP : torch::nn::Module {
  explicit MLP(const std::vector<int64_t>& widths);
  torch::Tensor forward(torch::Tensor x);
  std::vector<torch::nn::Linear> layers;
};

// depth x (Linear(width, width) + ReLU).
struct DeepMLP : torch::nn::Module {
  DeepMLP(int64_t depth, int64_t width);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Sequential body{nullptr};
};

struct SmallCNN : torch::nn::Module {
  SmallCNN();
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc{nullptr};
};

struct BasicBlock : torch::nn::Module {
  BasicBlock(int64_t in, int64_t out, int64_t stride);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};
};

// torchvision's resnet18 architecture, so its parameter names match.
struct ResNet18 : torch::nn::Module {
  ResNet18(int64_t num_classes = 1000);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};

struct Encoder : torch::nn::Module {
  Encoder();
  torch::Tensor forward(torch::Tensor x);
  torch::nn::TransformerEncoderLayer layer{nullptr};
};

struct LSTMNet : torch::nn::Module {
  LSTMNet();
  std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>> forward(torch::Tensor x);
  torch::nn::LSTM lstm{nullptr};
  torch::nn::Linear head{nullptr};
};

// An output projection that reuses another module's weight.
struct TiedProjection : torch::nn::Module {
  explicit TiedProjection(torch::Tensor shared_weight);
  torch::Tensor forward(torch::Tensor h);
  torch::Tensor weight, bias;
};

// A tiny language model whose output projection is tied to its embedding (one
// tensor, two names: embed.weight and proj.weight), with a parameter that is
// read three times.
struct TiedLM : torch::nn::Module {
  static constexpr int64_t kVocab = 11;
  TiedLM();
  torch::Tensor forward(torch::Tensor tokens);
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<TiedProjection> proj;
  torch::Tensor shift;
};

torch::Tensor inplace_program(torch::Tensor x);
c10::IValue multi_output_program(torch::Tensor x);
torch::Tensor factories_program(torch::Tensor x);
c10::IValue nested_program(std::vector<c10::IValue> in);

}  // namespace torchcap::examples
