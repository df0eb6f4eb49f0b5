#include "models.h"

namespace torchcap::examples {

namespace nn = torch::nn;

MLP::MLP(const std::vector<int64_t>& widths) {
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    layers.push_back(register_module("fc" + std::to_string(i + 1), nn::Linear(widths[i], widths[i + 1])));
  }
}

torch::Tensor MLP::forward(torch::Tensor x) {
  for (size_t i = 0; i < layers.size(); ++i) {
    x = layers[i](x);
    if (i + 1 < layers.size()) x = torch::relu(x);
  }
  return x;
}

DeepMLP::DeepMLP(int64_t depth, int64_t width) {
  nn::Sequential seq;
  for (int64_t i = 0; i < depth; ++i) {
    seq->push_back(nn::Linear(width, width));
    seq->push_back(nn::ReLU());
  }
  body = register_module("body", seq);
}

torch::Tensor DeepMLP::forward(torch::Tensor x) { return body->forward(x); }

SmallCNN::SmallCNN() {
  conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)));
  bn1 = register_module("bn1", nn::BatchNorm2d(8));
  conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(8, 16, 3)));
  bn2 = register_module("bn2", nn::BatchNorm2d(16));
  fc = register_module("fc", nn::Linear(16, 10));
}

torch::Tensor SmallCNN::forward(torch::Tensor x) {
  x = torch::relu(bn1(conv1(x)));
  x = torch::max_pool2d(x, 2);
  x = torch::relu(bn2(conv2(x)));
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc(x);
}

BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t stride) {
  conv1 = register_module(
      "conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
  bn1 = register_module("bn1", nn::BatchNorm2d(out));
  conv2 = register_module("conv2",
                          nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
  bn2 = register_module("bn2", nn::BatchNorm2d(out));
  if (stride != 1 || in != out) {
    downsample = register_module(
        "downsample",
        nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                       nn::BatchNorm2d(out)));
  }
}

torch::Tensor BasicBlock::forward(torch::Tensor x) {
  torch::Tensor identity = downsample ? downsample->forward(x) : x;
  torch::Tensor y = torch::relu(bn1(conv1(x)));
  y = bn2(conv2(y));
  return torch::relu(y + identity);
}

namespace {

nn::Sequential make_layer(int64_t in, int64_t out, int64_t stride) {
  nn::Sequential s;
  s->push_back(std::make_shared<BasicBlock>(in, out, stride));
  s->push_back(std::make_shared<BasicBlock>(out, out, 1));
  return s;
}

}  // namespace

ResNet18::ResNet18(int64_t num_classes) {
  conv1 = register_module(
      "conv1", nn::Conv2d(nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)));
  bn1 = register_module("bn1", nn::BatchNorm2d(64));
  layer1 = register_module("layer1", make_layer(64, 64, 1));
  layer2 = register_module("layer2", make_layer(64, 128, 2));
  layer3 = register_module("layer3", make_layer(128, 256, 2));
  layer4 = register_module("layer4", make_layer(256, 512, 2));
  fc = register_module("fc", nn::Linear(512, num_classes));
}

torch::Tensor ResNet18::forward(torch::Tensor x) {
  x = torch::relu(bn1(conv1(x)));
  x = torch::max_pool2d(x, 3, 2, 1);
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc(x);
}

Encoder::Encoder() {
  layer = register_module(
      "layer",
      nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(32, 4).dim_feedforward(64).dropout(0.0)));
}

torch::Tensor Encoder::forward(torch::Tensor x) { return layer(x); }

LSTMNet::LSTMNet() {
  lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(8, 16).num_layers(2).batch_first(true)));
  head = register_module("head", nn::Linear(16, 4));
}

std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>> LSTMNet::forward(torch::Tensor x) {
  auto [out, state] = lstm(x);
  return {head(out), state};
}

TiedProjection::TiedProjection(torch::Tensor shared_weight) {
  weight = register_parameter("weight", shared_weight);
  bias = register_parameter("bias", torch::zeros({shared_weight.size(0)}));
}

torch::Tensor TiedProjection::forward(torch::Tensor h) { return torch::nn::functional::linear(h, weight, bias); }

TiedLM::TiedLM() {
  embed = register_module("embed", nn::Embedding(kVocab, 8));
  proj = register_module("proj", std::make_shared<TiedProjection>(embed->weight));
  shift = register_parameter("shift", torch::randn({8}));
}

torch::Tensor TiedLM::forward(torch::Tensor tokens) {
  torch::Tensor h = embed(tokens) + shift;  // shift: first use
  h = torch::tanh(h) * shift;               // second
  h = h - shift;                            // third
  return proj->forward(h);
}

torch::Tensor inplace_program(torch::Tensor x) {
  torch::Tensor y = x.clone();
  y.add_(1.0);
  y.mul_(torch::full({4}, 2.0));
  torch::Tensor z = y.view({-1});
  z.sub_(0.5);  // through a view of an intermediate
  torch::relu_(y);
  torch::Tensor buf = torch::empty_like(y);
  torch::mul_out(buf, y, x);  // out= into an intermediate
  return buf + y;
}

c10::IValue multi_output_program(torch::Tensor x) {
  auto [values, indices] = torch::topk(x, 3, /*dim=*/1);
  auto [maxima, argmax] = torch::max(x, /*dim=*/0);
  std::vector<torch::Tensor> parts = torch::split(x, 2, /*dim=*/1);
  std::vector<torch::Tensor> rows = torch::unbind(x, 0);
  torch::Tensor combined = values.sum(1) + rows[1].sum() + parts[2].mean();
  return c10::ivalue::Tuple::create({combined, indices, maxima, argmax, parts[0], rows[3]});
}

torch::Tensor factories_program(torch::Tensor x) {
  torch::Tensor ones = torch::ones({3, 3});
  torch::Tensor eye = torch::eye(3);
  torch::Tensor ramp = torch::arange(3, torch::kFloat);
  torch::Tensor fill = torch::full({3}, 0.25);
  torch::Tensor lin = torch::linspace(0, 1, 3);
  torch::Tensor zeros = torch::zeros_like(x);
  return (x + ones) * eye + ramp + fill * lin + zeros;
}

c10::IValue nested_program(std::vector<c10::IValue> in) {
  torch::Tensor x = in[0].toTensor();
  auto d = in[1].toGenericDict();
  torch::Tensor a = d.at("a").toTensor();
  auto b = d.at("b").toTensorList();
  int64_t k = in[2].toInt();
  torch::Tensor s = x + a * k;
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("sum", s + b.get(1));
  out.insert("pair", c10::ivalue::Tuple::create({b.get(0) - x, torch::sigmoid(a)}));
  out.insert("none", c10::IValue());
  return out;
}

}  // namespace torchcap::examples
