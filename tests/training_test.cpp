// export_training: a captured training step, run by the Interpreter, against
// eager LibTorch training with torch::optim, step by step.
#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/serialize.h>
#include <torchcap/training.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <memory>

namespace torchcap {
namespace {

using IValues = std::vector<c10::IValue>;

// A model the tests train twice: eagerly and as a captured step.
struct Case {
  std::string name;
  std::function<torch::nn::Sequential()> make;
  std::vector<int64_t> input_shape;
  LossFunction loss;
  std::function<at::Tensor(int64_t step)> target;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  all.push_back({"mlp",
                 [] {
                   return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                                                torch::nn::Linear(16, 3));
                 },
                 {8, 6}, losses::mse(),
                 [](int64_t step) { return at::randn({8, 3}); }});
  all.push_back({"cnn_bn",
                 [] {
                   return torch::nn::Sequential(
                       torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),
                       torch::nn::BatchNorm2d(4), torch::nn::ReLU(), torch::nn::Flatten(),
                       torch::nn::Linear(4 * 5 * 5, 5));
                 },
                 {4, 3, 5, 5}, losses::cross_entropy(),
                 [](int64_t step) { return at::randint(0, 5, {4}, at::kLong); }});
  all.push_back({"transformer_layer",
                 [] {
                   return torch::nn::Sequential(
                       torch::nn::TransformerEncoderLayer(
                           torch::nn::TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0)),
                       torch::nn::Flatten(), torch::nn::Linear(2 * 8, 2));
                 },
                 {4, 2, 8}, losses::mse(),
                 [](int64_t step) { return at::randn({4, 2}); }});
  return all;
}

// Copies every parameter and buffer of `from` into `to` (same structure).
void copy_state(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters();
  for (auto& p : to.named_parameters()) p.value().copy_(src[p.key()]);
  auto src_buffers = from.named_buffers();
  for (auto& b : to.named_buffers()) b.value().copy_(src_buffers[b.key()]);
}

std::unique_ptr<torch::optim::Optimizer> eager_optimizer(const Optimizer& o,
                                                         std::vector<at::Tensor> params) {
  if (const auto* s = std::get_if<SGD>(&o)) {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(s->lr).momentum(s->momentum).dampening(s->dampening)
                    .weight_decay(s->weight_decay).nesterov(s->nesterov));
  }
  if (const auto* a = std::get_if<Adam>(&o)) {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(a->lr).betas({a->beta1, a->beta2}).eps(a->eps)
                    .weight_decay(a->weight_decay).amsgrad(a->amsgrad));
  }
  const auto& w = std::get<AdamW>(o);
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(w.lr).betas({w.beta1, w.beta2}).eps(w.eps)
                  .weight_decay(w.weight_decay).amsgrad(w.amsgrad));
}

TrainingOptions with(Optimizer optimizer) {
  TrainingOptions options;
  options.optimizer = std::move(optimizer);
  return options;
}

at::Tensor loss_of(const c10::IValue& out) { return out.toGenericDict().at("loss").toTensor(); }

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct Optimizers {
  std::string name;
  Optimizer optimizer;
};

class TrainingSteps
    : public ::testing::TestWithParam<std::tuple<size_t, Optimizers>> {};

// 20 steps of the captured graph equal 20 steps of eager training, bit for
// bit: the loss of every step, then every parameter (Note [Optimizer updates
// in the graph]), and the buffers.
TEST_P(TrainingSteps, EqualTorchOptimStepByStep) {
  const Case c = cases()[std::get<0>(GetParam())];
  const Optimizers opt = std::get<1>(GetParam());
  torch::manual_seed(0);
  torch::nn::Sequential model = c.make();
  torch::nn::Sequential eager = c.make();
  copy_state(*model, *eager);
  model->train();
  eager->train();

  std::vector<at::Tensor> xs, ys;
  for (int64_t s = 0; s < 20; ++s) {
    xs.push_back(at::randn(c.input_shape));
    ys.push_back(c.target(s));
  }
  GraphModule step = export_training(model, c.loss, {xs[0]}, {ys[0]}, with(opt.optimizer));
  step.lint();
  Interpreter interp(step);
  // Note [Updates written in place] (src/runtime/plan_passes/updates_in_place.cpp):
  // no parameter or optimizer state is copied in after the run.
  std::vector<std::string> in_place = interp.updated_in_place();
  for (const StepOutput& o : training_signature(step).outputs) {
    if (o.role == StepRole::ParameterUpdate || o.role == StepRole::OptimizerState) {
      EXPECT_NE(std::find(in_place.begin(), in_place.end(), o.target), in_place.end())
          << c.name << " " << opt.name << " " << o.target;
    }
  }

  auto eager_opt = eager_optimizer(opt.optimizer, eager->parameters());
  for (int64_t s = 0; s < 20; ++s) {
    eager_opt->zero_grad();
    at::Tensor expected = c.loss(eager->forward(xs[s]), {ys[s]});
    expected.backward();
    eager_opt->step();
    at::Tensor actual = loss_of(interp.run({xs[s], ys[s]}));
    ASSERT_LE(max_diff(actual, expected.detach()), 0.0) << c.name << " " << opt.name << " step " << s;
  }
  for (const auto& p : eager->named_parameters()) {
    EXPECT_LE(max_diff(step.attribute(p.key()).value, p.value().detach()), 0.0)
        << c.name << " " << opt.name << " " << p.key();
  }
  // Running statistics come from export's functional BatchNorm, which rounds
  // the variance's update differently (one float ulp).
  for (const auto& b : eager->named_buffers()) {
    EXPECT_LE(max_diff(step.attribute(b.key()).value, b.value()), 1e-6)
        << c.name << " " << opt.name << " " << b.key();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, TrainingSteps,
    ::testing::Combine(::testing::Values(0, 1, 2),
                       ::testing::Values(Optimizers{"sgd", SGD{.lr = 0.05}},
                                         Optimizers{"sgd_momentum",
                                                    SGD{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3}},
                                         Optimizers{"sgd_dampening_nesterov",
                                                    SGD{.lr = 0.05, .momentum = 0.9, .dampening = 0.1}},
                                         Optimizers{"adam", Adam{.lr = 1e-2, .weight_decay = 1e-3}},
                                         Optimizers{"adam_amsgrad", Adam{.lr = 1e-2, .amsgrad = true}},
                                         Optimizers{"adamw", AdamW{.lr = 1e-2}})),
    [](const auto& info) {
      return cases()[std::get<0>(info.param)].name + "_" + std::get<1>(info.param).name;
    });

TEST(Training, WithoutOptimizerReturnsEveryGradient) {
  torch::manual_seed(2);
  torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::Tanh(), torch::nn::Linear(4, 2));
  at::Tensor x = at::randn({5, 3}), y = at::randn({5, 2});
  GraphModule step = export_training(model, losses::mse(), {x}, {y});
  EXPECT_FALSE(step.has_mutation_outputs());
  c10::IValue out = Interpreter(step).run({x, y});

  at::Tensor loss = torch::mse_loss(model->forward(x), y);
  loss.backward();
  auto grads = out.toGenericDict().at("gradients").toGenericDict();
  EXPECT_EQ(grads.size(), model->parameters().size());
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(at::allclose(grads.at(p.key()).toTensor(), p.value().grad())) << p.key();
  }
  EXPECT_TRUE(at::allclose(loss_of(out), loss.detach()));
}

TEST(Training, CapturingLeavesTheModelAsItWas) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3));
  std::vector<at::Tensor> before;
  for (const auto& t : model->parameters()) before.push_back(t.detach().clone());
  for (const auto& t : model->buffers()) before.push_back(t.detach().clone());
  at::Tensor x = at::randn({4, 3});
  GraphModule step = export_training(model, losses::mse(), {x}, {at::randn({4, 3})},
                                     with(Adam{.lr = 0.1}));
  size_t i = 0;
  for (const auto& t : model->parameters()) EXPECT_TRUE(at::equal(t, before[i++]));
  for (const auto& t : model->buffers()) EXPECT_TRUE(at::equal(t, before[i++]));
  EXPECT_FALSE(model->parameters()[0].grad().defined());
  // The step holds the optimizer's state as buffers, updated by each run.
  EXPECT_TRUE(step.has_attribute(optimizer_state_name("exp_avg", "0.weight")));
  EXPECT_TRUE(step.has_attribute("optimizer.step"));
  Interpreter interp(step);
  interp.run({x, at::randn({4, 3})});
  interp.run({x, at::randn({4, 3})});
  EXPECT_EQ(step.attribute("optimizer.step").value.item<double>(), 2.0);
}

TEST(Training, SavedStepContinuesWhereItStopped) {
  torch::manual_seed(4);
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  std::vector<at::Tensor> xs, ys;
  for (int s = 0; s < 10; ++s) {
    xs.push_back(at::randn({3, 4}));
    ys.push_back(at::randn({3, 2}));
  }
  TrainingOptions options = with(Adam{.lr = 0.05});
  GraphModule straight = export_training(model, losses::mse(), {xs[0]}, {ys[0]}, options);
  GraphModule halves = export_training(model, losses::mse(), {xs[0]}, {ys[0]}, options);
  Interpreter all(straight);
  std::vector<at::Tensor> straight_losses;
  for (int s = 0; s < 10; ++s) straight_losses.push_back(loss_of(all.run({xs[s], ys[s]})));

  {
    Interpreter first(halves);
    for (int s = 0; s < 5; ++s) first.run({xs[s], ys[s]});
  }
  auto path = std::filesystem::temp_directory_path() / "torchcap_training_step.tcg";
  save(halves, path.string());
  GraphModule loaded = load(path.string());
  std::filesystem::remove(path);
  Interpreter second(loaded);
  for (int s = 5; s < 10; ++s) {
    EXPECT_TRUE(at::equal(loss_of(second.run({xs[s], ys[s]})), straight_losses[s])) << "step " << s;
  }
  for (const Attribute& a : straight.attributes()) {
    EXPECT_TRUE(at::equal(loaded.attribute(a.name).value, a.value)) << a.name;
  }
}

// A TorchScript module (here compiled from source) trains like its eager
// twin; its parameters are found by name.
TEST(Training, TorchScriptModuleEqualsEagerTraining) {
  torch::manual_seed(5);
  at::Tensor w = at::randn({3, 4}), b = at::randn({3});
  torch::jit::Module script("Affine");
  script.register_parameter("weight", w.clone().requires_grad_(), false);
  script.register_parameter("bias", b.clone().requires_grad_(), false);
  script.define(R"(
def forward(self, x):
    return torch.tanh(torch.addmm(self.bias, x, self.weight.t()))
)");
  script.train();
  torch::nn::Linear eager(4, 3);
  {
    torch::NoGradGuard no_grad;
    eager->weight.copy_(w);
    eager->bias.copy_(b);
  }
  SGD sgd{.lr = 0.1, .momentum = 0.5};
  at::Tensor x = at::randn({2, 4}), y = at::randn({2, 3});
  GraphModule step = export_training(script, losses::mse(), {x}, {y}, with(sgd));
  Interpreter interp(step);
  auto eager_opt = eager_optimizer(sgd, eager->parameters());
  for (int s = 0; s < 5; ++s) {
    eager_opt->zero_grad();
    at::Tensor loss = torch::mse_loss(torch::tanh(eager->forward(x)), y);
    loss.backward();
    eager_opt->step();
    EXPECT_TRUE(at::equal(loss_of(interp.run({x, y})), loss.detach())) << "step " << s;
  }
  EXPECT_TRUE(at::equal(step.attribute("weight").value, eager->weight.detach()));
}

TEST(Training, RefusesAModelInEvalMode) {
  torch::nn::Sequential model(torch::nn::Linear(2, 2));
  model->eval();
  try {
    export_training(model, losses::mse(), {at::randn({1, 2})}, {at::randn({1, 2})});
    FAIL() << "expected a TraceError";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("eval mode"), std::string::npos) << e.what();
  }
}

TEST(Training, RefusesALossThatIsNotAScalar) {
  torch::nn::Sequential model(torch::nn::Linear(2, 2));
  LossFunction per_element = [](const c10::IValue& out, const IValues& targets) {
    return (out.toTensor() - targets[0].toTensor()).pow(2);
  };
  try {
    export_training(model, per_element, {at::randn({3, 2})}, {at::randn({3, 2})});
    FAIL() << "expected a TraceError";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("one element"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
  }
}

// A module with a parameter forward never uses.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    used = register_module("used", torch::nn::Linear(2, 2));
    unused = register_module("unused", torch::nn::Linear(2, 2));
  }
  at::Tensor forward(at::Tensor x) { return used->forward(x); }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};
TORCH_MODULE(TwoHeads);

TEST(Training, NamesParametersThatGetNoGradient) {
  TwoHeads model;
  try {
    export_training(model, losses::mse(), {at::randn({1, 2})}, {at::randn({1, 2})});
    FAIL() << "expected a TraceError";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("unused.weight, unused.bias"), std::string::npos) << e.what();
  }
  // Frozen, they are simply not trained.
  model->unused->weight.set_requires_grad(false);
  model->unused->bias.set_requires_grad(false);
  GraphModule step = export_training(model, losses::mse(), {at::randn({1, 2})}, {at::randn({1, 2})},
                                     with(SGD{.lr = 0.1}));
  for (const OutputSpec& s : step.output_specs) EXPECT_NE(s.target, "unused.weight");
}

TEST(Training, RefusesInferenceMode) {
  torch::nn::Sequential model(torch::nn::Linear(2, 2));
  TrainingOptions options;
  options.trace.inference_mode = true;
  EXPECT_THROW(export_training(model, losses::mse(), {at::randn({1, 2})}, {at::randn({1, 2})}, options),
               TraceError);
}

TEST(Training, RefusesMetaMode) {
  torch::nn::Sequential model(torch::nn::Linear(2, 2));
  TrainingOptions options;
  options.trace.meta = true;
  try {
    export_training(model, losses::mse(), {at::randn({1, 2})}, {at::randn({1, 2})}, options);
    FAIL() << "meta mode was accepted";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("TraceOptions::meta is set"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace torchcap

namespace torchcap {
namespace {

// The signature says what every output of a step is, also once loaded.
TEST(Training, SignatureNamesEveryOutput) {
  torch::manual_seed(6);
  torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 2));
  at::Tensor x = at::randn({5, 3}), y = at::randn({5, 2});
  GraphModule step = export_training(model, losses::mse(), {x}, {y}, with(SGD{.lr = 0.1, .momentum = 0.9}));
  auto check = [](const GraphModule& gm) {
    TrainingSignature sig = training_signature(gm);
    ASSERT_EQ(sig.outputs.size(), gm.output_specs.size());
    EXPECT_EQ(sig.loss, 0u);
    EXPECT_EQ(sig.outputs[0].role, StepRole::Loss);
    EXPECT_EQ(sig.count(StepRole::ParameterUpdate), 6u);
    EXPECT_EQ(sig.count(StepRole::OptimizerState), 6u);
    EXPECT_EQ(sig.count(StepRole::BufferUpdate), 3u);  // running mean, variance, batch count
    EXPECT_EQ(sig.parameters, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                                         "2.weight", "2.bias"}));
    bool found = false;
    for (const StepOutput& o : sig.outputs) {
      if (o.role == StepRole::OptimizerState && o.parameter == "2.weight") {
        EXPECT_EQ(o.state, "momentum_buffer");
        EXPECT_EQ(o.target, optimizer_state_name("momentum_buffer", "2.weight"));
        found = true;
      }
    }
    EXPECT_TRUE(found) << sig.str();
  };
  check(step);
  auto path = std::filesystem::temp_directory_path() / "torchcap_signature_step.tcg";
  save(step, path.string());
  GraphModule loaded = load(path.string());
  std::filesystem::remove(path);
  check(loaded);

  GraphModule grads = export_training(model, losses::mse(), {x}, {y});
  TrainingSignature sig = training_signature(grads);
  EXPECT_EQ(sig.count(StepRole::Gradient), 6u);
  EXPECT_EQ(sig.count(StepRole::ParameterUpdate), 0u);
  EXPECT_EQ(sig.str().substr(0, 8), "0  loss\n");

  GraphModule inference = trace(model, {x});
  EXPECT_FALSE(is_training_step(inference));
  EXPECT_THROW(training_signature(inference), Error);
}

// igamma has no derivative for its first argument in LibTorch 1.13.
struct IgammaHeadImpl : torch::nn::Module {
  IgammaHeadImpl() { fc = register_module("fc", torch::nn::Linear(2, 2)); }
  at::Tensor forward(at::Tensor x) { return at::igamma(torch::sigmoid(fc->forward(x)) + 0.5, at::ones({2})); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(IgammaHead);

TEST(Training, NamesAnOperatorWithoutDerivative) {
  IgammaHead model;
  try {
    export_training(model, losses::mse(), {at::randn({3, 2})}, {at::randn({3, 2})});
    FAIL() << "expected a TraceError";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("the operator aten::igamma has no derivative in LibTorch "
                                         "(the derivative for 'igamma: input' is not implemented)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace torchcap
