// The example zoo: small models covering what a tracer must get right.
#include "zoo.h"

#include "models.h"

#include <torchcap/error.h>

#include <torch/torch.h>

#include <map>

namespace torchcap::examples {
namespace {

using IValues = std::vector<c10::IValue>;

struct Entry {
  std::string description;
  std::function<Example()> build;
};

// Inputs of fixed shapes, random from `seed`.
std::function<IValues(uint64_t)> randn_inputs(std::vector<std::vector<int64_t>> shapes) {
  return [shapes](uint64_t seed) {
    torch::manual_seed(1000 + seed);
    IValues out;
    for (const auto& s : shapes) out.emplace_back(torch::randn(s));
    return out;
  };
}

template <typename M>
Example module_example(std::shared_ptr<M> m, std::function<IValues(uint64_t)> inputs,
                       std::function<c10::IValue(M&, IValues)> call) {
  Example e;
  e.module = m;
  e.forward = [m, call](IValues in) { return call(*m, std::move(in)); };
  e.make_inputs = std::move(inputs);
  return e;
}

template <typename M>
Example tensor_module(std::shared_ptr<M> m, std::vector<std::vector<int64_t>> shapes) {
  return module_example<M>(m, randn_inputs(std::move(shapes)),
                           [](M& mod, IValues in) { return c10::IValue(mod.forward(in[0].toTensor())); });
}

const std::map<std::string, Entry>& registry() {
  static const std::map<std::string, Entry> entries = {
      {"mlp",
       {"Linear(16, 32) + ReLU + Linear(32, 10), input 4x16",
        [] { return tensor_module(std::make_shared<MLP>(std::vector<int64_t>{16, 32, 10}), {{4, 16}}); }}},
      {"mlp200",
       {"200 x (Linear(64, 64) + ReLU), batch 1 (the tracing benchmark)",
        [] { return tensor_module(std::make_shared<DeepMLP>(200, 64), {{1, 64}}); }}},
      {"cnn_bn_eval",
       {"Conv + BatchNorm (eval) + ReLU + pooling + Linear, input 2x3x16x16",
        [] {
          auto m = std::make_shared<SmallCNN>();
          m->eval();
          return tensor_module(m, {{2, 3, 16, 16}});
        }}},
      {"cnn_bn_train",
       {"the same CNN in train mode: BatchNorm updates its running stats in place",
        [] {
          auto m = std::make_shared<SmallCNN>();
          m->train();
          return tensor_module(m, {{2, 3, 16, 16}});
        }}},
      {"resnet18",
       {"ResNet-18 (torchvision's architecture, random weights), eval, input 1x3x224x224",
        [] {
          auto m = std::make_shared<ResNet18>();
          m->eval();
          return tensor_module(m, {{1, 3, 224, 224}});
        }}},
      {"transformer_encoder",
       {"TransformerEncoderLayer(d_model 32, 4 heads, ff 64), eval, input 5x2x32",
        [] {
          auto m = std::make_shared<Encoder>();
          m->eval();
          return tensor_module(m, {{5, 2, 32}});
        }}},
      {"lstm",
       {"2-layer LSTM(8, 16) + Linear, returns (output, (h, c)), input 3x5x8",
        [] {
          auto m = std::make_shared<LSTMNet>();
          return module_example<LSTMNet>(m, randn_inputs({{3, 5, 8}}), [](LSTMNet& mod, IValues in) {
            auto [out, state] = mod.forward(in[0].toTensor());
            return c10::IValue(c10::ivalue::Tuple::create(
                {out, c10::ivalue::Tuple::create({std::get<0>(state), std::get<1>(state)})}));
          });
        }}},
      {"tied_weights",
       {"embedding and output projection sharing one weight, plus a bias used three times",
        [] {
          auto m = std::make_shared<TiedLM>();
          return module_example<TiedLM>(
              m,
              [](uint64_t seed) {
                torch::manual_seed(2000 + seed);
                return IValues{torch::randint(0, TiedLM::kVocab, {2, 6})};
              },
              [](TiedLM& mod, IValues in) { return c10::IValue(mod.forward(in[0].toTensor())); });
        }}},
      {"inplace_ops",
       {"in-place and out= operators on intermediates (clone, add_, mul_, relu_, mul out=)",
        [] {
          Example e;
          e.forward = [](IValues in) { return c10::IValue(inplace_program(in[0].toTensor())); };
          e.make_inputs = randn_inputs({{3, 4}});
          return e;
        }}},
      {"multi_output",
       {"operators with several outputs: topk, max with indices, split, unbind",
        [] {
          Example e;
          e.forward = [](IValues in) { return multi_output_program(in[0].toTensor()); };
          e.make_inputs = randn_inputs({{4, 6}});
          return e;
        }}},
      {"factories",
       {"tensors created inside forward: ones, zeros, arange, full, eye, linspace",
        [] {
          Example e;
          e.forward = [](IValues in) { return c10::IValue(factories_program(in[0].toTensor())); };
          e.make_inputs = randn_inputs({{3, 3}});
          return e;
        }}},
      {"nested_io",
       {"nested input (x, {'a': y, 'b': [z, w]}, 2) and output {'sum', 'pair': (..), 'none'}",
        [] {
          Example e;
          e.forward = [](IValues in) { return nested_program(in); };
          e.make_inputs = [](uint64_t seed) {
            torch::manual_seed(3000 + seed);
            c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
            d.insert("a", torch::randn({2, 3}));
            d.insert("b", c10::List<at::Tensor>({torch::randn({2, 3}), torch::randn({3})}));
            return IValues{torch::randn({2, 3}), d, c10::IValue(int64_t(2))};
          };
          return e;
        }}},
  };
  return entries;
}

c10::IValue flat_diff_check(const c10::IValue& a, const c10::IValue& b, double& worst) {
  if (a.isTensor() && b.isTensor()) {
    const at::Tensor& x = a.toTensor();
    const at::Tensor& y = b.toTensor();
    if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type()) {
      throw Error("results differ in shape or dtype: " + TensorMeta::of(x).str() + " vs " +
                  TensorMeta::of(y).str());
    }
    if (x.numel() > 0) {
      double d = (x.to(torch::kDouble) - y.to(torch::kDouble)).abs().max().item<double>();
      if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
      worst = std::max(worst, d);
    }
    return {};
  }
  if (a.isNone() && b.isNone()) return {};
  auto elems = [](const c10::IValue& v) -> std::vector<c10::IValue> {
    if (v.isTuple()) return v.toTupleRef().elements().vec();
    if (v.isList()) return v.toListRef().vec();
    if (v.isGenericDict()) {
      std::vector<c10::IValue> out;
      for (const auto& kv : v.toGenericDict()) out.push_back(kv.value());
      return out;
    }
    return {};
  };
  if (a.tagKind() != b.tagKind()) {
    throw Error("results differ in structure: " + a.tagKind() + " vs " + b.tagKind());
  }
  auto ea = elems(a), eb = elems(b);
  if (ea.size() != eb.size()) throw Error("results differ in length");
  for (size_t i = 0; i < ea.size(); ++i) flat_diff_check(ea[i], eb[i], worst);
  return {};
}

}  // namespace

const std::vector<std::string>& names() {
  static const std::vector<std::string> out = [] {
    std::vector<std::string> v;
    for (const auto& kv : registry()) v.push_back(kv.first);
    return v;
  }();
  return out;
}

std::string describe(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? "" : it->second.description;
}

Example make(const std::string& name) {
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const std::string& n : names()) known += (known.empty() ? "" : ", ") + n;
    throw Error("no example named '" + name + "'; known examples: " + known);
  }
  torch::manual_seed(0);
  Example e = it->second.build();
  e.name = name;
  e.description = it->second.description;
  return e;
}

TraceResult trace_with_outputs(Example& e, const TraceOptions& options, std::vector<c10::IValue> inputs) {
  if (inputs.empty()) inputs = e.make_inputs(0);
  ModuleState state = e.module ? ModuleState::of(*e.module) : ModuleState{};
  return torchcap::trace_with_outputs(state, e.forward, inputs, options);
}

GraphModule trace(Example& e, const TraceOptions& options, std::vector<c10::IValue> inputs) {
  return trace_with_outputs(e, options, std::move(inputs)).module;
}

void freeze(Example& e) {
  if (!e.module) return;
  for (auto& p : e.module->parameters()) p.set_requires_grad(false);
}

std::vector<std::pair<std::string, at::Tensor>> named_buffers(const Example& e) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (!e.module) return out;
  for (const auto& b : e.module->named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

double max_abs_diff(const c10::IValue& a, const c10::IValue& b) {
  double worst = 0;
  flat_diff_check(a, b, worst);
  return worst;
}

}  // namespace torchcap::examples
