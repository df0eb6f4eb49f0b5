// Passes for inference graphs (src/passes/inference.h): each on a small
// graph, before and after, and on the torchvision-style ResNet-18 example.
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/passes.h>
#include <torchcap/serialize.h>
#include <torchcap/tracer.h>

#include "passes/inference.h"
#include "zoo.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace torchcap {
namespace {

// Values of a graph on the same inputs, for before/after comparisons.
at::Tensor run(const GraphModule& gm, const std::vector<c10::IValue>& inputs) {
  return Interpreter(gm).run(inputs).toTensor();
}

size_t count(const GraphModule& gm, const std::string& target) {
  size_t n = 0;
  for (const Node* node : gm.graph()) n += node->op() == OpCode::CallFunction && node->target() == target;
  return n;
}

// conv -> batch norm -> relu, the batch norm's statistics not the defaults.
struct ConvBnImpl : torch::nn::Module {
  torch::nn::Conv2d conv{torch::nn::Conv2dOptions(3, 4, 3).bias(false)};
  torch::nn::BatchNorm2d bn{4};
  ConvBnImpl() {
    register_module("0", conv);
    register_module("1", bn);
    torch::manual_seed(0);
    torch::NoGradGuard no_grad;
    bn->running_mean.uniform_(-1, 1);
    bn->running_var.uniform_(0.5, 2);
    bn->weight.uniform_(0.5, 1.5);
    bn->bias.uniform_(-1, 1);
  }
};

struct ConvBn {
  std::shared_ptr<ConvBnImpl> model = std::make_shared<ConvBnImpl>();
  // relu(bn(conv(x))), or with `also_read`, bn(conv(x)) + conv(x).
  GraphModule trace(bool training, bool also_read = false) {
    model->train(training);
    ModuleState state = ModuleState::of(*model);
    return torchcap::trace(state, [this, also_read](const std::vector<c10::IValue>& in) {
      at::Tensor y = model->conv->forward(in[0].toTensor());
      at::Tensor z = model->bn->forward(y);
      return c10::IValue(also_read ? z + y : torch::relu(z));
    }, {torch::randn({2, 3, 8, 8})});
  }
};

TEST(FoldBatchNorms, ConvolutionAndBatchNormBecomeOneConvolution) {
  ConvBn m;
  GraphModule gm = m.trace(/*training=*/false);
  GraphModule before = gm.clone();
  EXPECT_EQ(count(gm, "aten::native_batch_norm"), 1u);
  ASSERT_TRUE(detail::fold_batch_norms(gm));
  gm.lint();
  EXPECT_EQ(count(gm, "aten::native_batch_norm"), 0u);
  EXPECT_EQ(count(gm, "getitem"), 0u);
  EXPECT_EQ(count(gm, "aten::convolution"), 1u);
  // (%empty, unused, is the trace's: batch_norm's reserve; dce removes it.)
  EXPECT_EQ(gm.str(),
            "# parameter 0.weight_folded: f32[4, 3, 3, 3]\n"
            "# parameter 0.bias_folded: f32[4]\n"
            "# inputs: (*,)\n"
            "# outputs: *\n"
            "graph():\n"
            "    %ph_0 : f32[2, 3, 8, 8] [users=1] = placeholder[target=ph_0]\n"
            "    %_0_weight_folded : f32[4, 3, 3, 3] [users=1] = get_attr[target=0.weight_folded]\n"
            "    %_0_bias_folded : f32[4] [users=1] = get_attr[target=0.bias_folded]\n"
            "    %convolution : f32[2, 4, 6, 6] [users=1] = aten::convolution(%ph_0, %_0_weight_folded, "
            "%_0_bias_folded, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)\n"
            "    %empty : u8[0] [users=0] = aten::empty.memory_format([0], dtype=torch.uint8, "
            "layout=torch.strided, device=device(type='cpu'))\n"
            "    %relu : f32[2, 4, 6, 6] [users=1] = aten::relu(%convolution)\n"
            "    return (%relu,)\n");
  // Folding rounds the weights once: results agree to float rounding.
  at::Tensor x = torch::randn({2, 3, 8, 8});
  at::Tensor want = Interpreter(before).run({x}).toTensor();
  EXPECT_TRUE(at::allclose(Interpreter(gm).run({x}).toTensor(), want, 1e-5, 1e-5));
  // And the folded module is a file like any other.
  const std::string bytes = save_to_string(gm);
  EXPECT_TRUE(at::equal(Interpreter(load_from_buffer(bytes.data(), bytes.size())).run({x}).toTensor(),
                        Interpreter(gm).run({x}).toTensor()));
  EXPECT_FALSE(detail::fold_batch_norms(gm));  // nothing left to fold
}

TEST(FoldBatchNorms, NotATrainingBatchNorm) {
  ConvBn m;
  GraphModule gm = m.trace(/*training=*/true);
  const std::string listing = gm.str();
  EXPECT_FALSE(detail::fold_batch_norms(gm));
  EXPECT_EQ(gm.str(), listing);
}

TEST(FoldBatchNorms, NotWhenTheConvolutionsResultIsAlsoReadElsewhere) {
  ConvBn m;
  GraphModule gm = m.trace(/*training=*/false, /*also_read=*/true);
  const std::string listing = gm.str();
  EXPECT_FALSE(detail::fold_batch_norms(gm));
  EXPECT_EQ(gm.str(), listing);
}

// The torchvision-style ResNet-18 example through the passes `names`: a
// graph that lints, agrees with the traced one (docs/passes.md and
// docs/optimize.md give the tolerance), and runs the same planned (the
// memory planner composes with the passes). Returns (traced, result).
std::pair<GraphModule, GraphModule> resnet18_through(const std::vector<std::string>& names) {
  examples::Example e = examples::make("resnet18");
  GraphModule gm = examples::trace(e);
  GraphModule result = gm.clone();
  EXPECT_TRUE(passes_by_name(names).run(result));
  result.lint();
  InterpreterOptions planned;
  planned.plan_memory = true;
  Interpreter traced(gm), passed(result), passed_planned(result, planned);
  for (uint64_t seed : {1, 2}) {
    std::vector<c10::IValue> inputs = e.make_inputs(seed);
    at::Tensor want = traced.run(inputs).toTensor();
    at::Tensor got = passed.run(inputs).toTensor();
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5)) << seed;
    EXPECT_TRUE(at::equal(passed_planned.run(inputs).toTensor(), got)) << seed;
  }
  return {std::move(gm), std::move(result)};
}

TEST(FoldBatchNorms, ResNet18ByNameAgreesWithTheUnfoldedGraph) {
  auto [gm, folded] = resnet18_through({"fold_bn"});
  EXPECT_EQ(count(folded, "aten::native_batch_norm"), 0u);
  EXPECT_EQ(count(folded, "aten::convolution"), count(gm, "aten::convolution"));
  EXPECT_LT(folded.graph().size(), gm.graph().size());
}

// conv -> relu -> conv (stride 2, with bias), a 4-D input.
struct TwoConvsImpl : torch::nn::Module {
  torch::nn::Conv2d a{torch::nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)};
  torch::nn::Conv2d b{torch::nn::Conv2dOptions(8, 4, 3).stride(2)};
  TwoConvsImpl() {
    register_module("a", a);
    register_module("b", b);
  }
};

GraphModule trace_two_convs(const std::shared_ptr<TwoConvsImpl>& m, at::Tensor x) {
  ModuleState state = ModuleState::of(*m);
  return torchcap::trace(state, [&m](const std::vector<c10::IValue>& in) {
    return c10::IValue(m->b->forward(torch::relu(m->a->forward(in[0].toTensor()))));
  }, {std::move(x)});
}

// A rewritten graph against the graph before, on inputs of `sizes`: run
// plainly, with its memory planned, and loaded from its file (which holds the
// unpacked weights and the packing as a node).
void expect_runs_as_before(const GraphModule& gm, const GraphModule& before, std::vector<int64_t> sizes) {
  InterpreterOptions planned;
  planned.plan_memory = true;
  const std::string bytes = save_to_string(gm);
  Interpreter packed(gm), packed_planned(gm, planned), unpacked(before),
      loaded(load_from_buffer(bytes.data(), bytes.size()));
  for (uint64_t seed : {1, 2}) {
    torch::manual_seed(seed);
    at::Tensor x = torch::randn(sizes);
    at::Tensor got = packed.run({x}).toTensor();
    EXPECT_TRUE(at::allclose(got, unpacked.run({x}).toTensor(), 1e-5, 1e-5)) << seed;
    EXPECT_TRUE(at::equal(packed_planned.run({x}).toTensor(), got)) << seed;
    EXPECT_TRUE(at::equal(loaded.run({x}).toTensor(), got)) << seed;
  }
}

TEST(PrepackConvolutions, ConvolutionsRunPackedWithTheReluFused) {
  torch::manual_seed(0);
  auto m = std::make_shared<TwoConvsImpl>();
  GraphModule gm = trace_two_convs(m, torch::randn({2, 3, 8, 8}));
  GraphModule before = gm.clone();
  ASSERT_TRUE(detail::prepack_convolutions(gm));
  gm.lint();
  EXPECT_EQ(gm.str(),
            "# parameter a.weight: f32[8, 3, 3, 3]\n"
            "# parameter b.weight: f32[4, 8, 3, 3]\n"
            "# parameter b.bias: f32[4]\n"
            "# inputs: (*,)\n"
            "# outputs: *\n"
            "graph():\n"
            "    %ph_0 : f32[2, 3, 8, 8] [users=1] = placeholder[target=ph_0]\n"
            "    %a_weight : f32[8, 3, 3, 3] [users=1] = get_attr[target=a.weight]\n"
            "    %conv2d_prepack : [users=1] = torchcap::conv2d_prepack(%a_weight, None, [1, 1], [1, 1], "
            "[1, 1], 1, [2, 3, 8, 8], 'relu')\n"
            "    %clone : f32[2, 3, 8, 8] [users=1] = aten::clone(%ph_0, memory_format=torch.channels_last)\n"
            "    %conv2d_run : f32[2, 8, 8, 8] [users=1] = torchcap::conv2d_run(%clone, %conv2d_prepack)\n"
            "    %b_weight : f32[4, 8, 3, 3] [users=1] = get_attr[target=b.weight]\n"
            "    %b_bias : f32[4] [users=1] = get_attr[target=b.bias]\n"
            "    %conv2d_prepack_1 : [users=1] = torchcap::conv2d_prepack(%b_weight, %b_bias, [2, 2], "
            "[0, 0], [1, 1], 1, [2, 8, 8, 8], 'none')\n"
            "    %conv2d_run_1 : f32[2, 4, 3, 3] [users=1] = torchcap::conv2d_run(%conv2d_run, "
            "%conv2d_prepack_1)\n"
            "    return (%conv2d_run_1,)\n");
  // Activations are channels-last from the clone on, and the graph says so.
  for (const Node* n : gm.graph()) {
    if (n->target() == "torchcap::conv2d_run") {
      const TensorMeta& t = n->meta().val.tensors[0];
      EXPECT_EQ(t.strides[1], 1) << n->name();
    }
  }
  expect_runs_as_before(gm, before, {2, 3, 8, 8});
  EXPECT_FALSE(detail::prepack_convolutions(gm));  // nothing left to pack
}

// A residual block's tail: conv, then the shortcut added, then a relu; the
// shortcut is computed after the convolution, so the fused call goes where
// the add was.
TEST(PrepackConvolutions, AResidualAddAndItsReluRunInsideTheConvolution) {
  torch::manual_seed(0);
  auto m = std::make_shared<TwoConvsImpl>();
  torch::nn::Conv2d shortcut{torch::nn::Conv2dOptions(3, 8, 1).bias(false)};
  m->register_module("shortcut", shortcut);
  ModuleState state = ModuleState::of(*m);
  GraphModule gm = torchcap::trace(state, [&](const std::vector<c10::IValue>& in) {
    const at::Tensor& x = in[0].toTensor();
    at::Tensor y = m->a->forward(x);
    return c10::IValue(torch::relu(y.add_(shortcut->forward(x))));
  }, {torch::randn({1, 3, 8, 8})});
  GraphModule before = gm.clone();
  ASSERT_TRUE(detail::prepack_convolutions(gm));
  gm.lint();
  EXPECT_EQ(gm.str(),
            "# parameter a.weight: f32[8, 3, 3, 3]\n"
            "# parameter shortcut.weight: f32[8, 3, 1, 1]\n"
            "# inputs: (*,)\n"
            "# outputs: *\n"
            "graph():\n"
            "    %ph_0 : f32[1, 3, 8, 8] [users=2] = placeholder[target=ph_0]\n"
            "    %a_weight : f32[8, 3, 3, 3] [users=1] = get_attr[target=a.weight]\n"
            "    %shortcut_weight : f32[8, 3, 1, 1] [users=1] = get_attr[target=shortcut.weight]\n"
            "    %conv2d_prepack_1 : [users=1] = torchcap::conv2d_prepack(%shortcut_weight, None, [1, 1], [0, 0], "
            "[1, 1], 1, [1, 3, 8, 8], 'none')\n"
            "    %clone : f32[1, 3, 8, 8] [users=1] = aten::clone(%ph_0, memory_format=torch.channels_last)\n"
            "    %conv2d_run_1 : f32[1, 8, 8, 8] [users=1] = torchcap::conv2d_run(%clone, %conv2d_prepack_1)\n"
            "    %conv2d_prepack : [users=1] = torchcap::conv2d_prepack(%a_weight, None, [1, 1], [1, 1], "
            "[1, 1], 1, [1, 3, 8, 8], 'add_relu')\n"
            "    %clone_1 : f32[1, 3, 8, 8] [users=1] = aten::clone(%ph_0, memory_format=torch.channels_last)\n"
            "    %conv2d_run : f32[1, 8, 8, 8] [users=1] = torchcap::conv2d_run(%clone_1, %conv2d_prepack, "
            "%conv2d_run_1)\n"
            "    return (%conv2d_run,)\n");
  expect_runs_as_before(gm, before, {1, 3, 8, 8});
}

// An add that writes over its other operand (the shortcut), or adds the
// convolution's result with alpha 2, keeps its add.
TEST(PrepackConvolutions, AnAddOverTheShortcutOrWithAlphaIsLeft) {
  torch::manual_seed(0);
  auto m = std::make_shared<TwoConvsImpl>();
  ModuleState state = ModuleState::of(*m);
  for (int variant : {0, 1}) {
    GraphModule gm = torchcap::trace(state, [&](const std::vector<c10::IValue>& in) {
      at::Tensor shortcut = in[1].toTensor().clone();
      at::Tensor y = m->a->forward(in[0].toTensor());
      return c10::IValue(variant == 0 ? shortcut.add_(y) : torch::add(shortcut, y, 2));
    }, {torch::randn({1, 3, 8, 8}), torch::randn({1, 8, 8, 8})});
    GraphModule before = gm.clone();
    ASSERT_TRUE(detail::prepack_convolutions(gm));
    gm.lint();
    EXPECT_EQ(count(gm, variant == 0 ? "aten::add_.Tensor" : "aten::add.Tensor"), 1u) << variant;
    at::Tensor x = torch::randn({1, 3, 8, 8});
    at::Tensor r = torch::randn({1, 8, 8, 8});
    EXPECT_TRUE(at::allclose(run(gm, {x, r}), run(before, {x, r}), 1e-5, 1e-5)) << variant;
  }
}

TEST(PrepackConvolutions, NotWhenTheGraphWritesAnAttributeOrIsDynamic) {
  ConvBn m;
  GraphModule training = m.trace(/*training=*/true);  // batch norm updates its statistics
  const std::string listing = training.str();
  EXPECT_FALSE(detail::prepack_convolutions(training));
  EXPECT_EQ(training.str(), listing);

  auto two = std::make_shared<TwoConvsImpl>();
  ModuleState state = ModuleState::of(*two);
  TraceOptions options;
  options.dynamic = {DynamicDim{.input = 0, .dim = 0, .name = "batch"}};
  GraphModule dynamic = torchcap::trace(state, [&two](const std::vector<c10::IValue>& in) {
    return c10::IValue(two->b->forward(torch::relu(two->a->forward(in[0].toTensor()))));
  }, {torch::randn({2, 3, 8, 8})}, options);
  const std::string dynamic_listing = dynamic.str();
  EXPECT_FALSE(detail::prepack_convolutions(dynamic));
  EXPECT_EQ(dynamic.str(), dynamic_listing);
}

TEST(FoldBatchNorms, LinearAndBatchNorm1dBecomeOneLinear) {
  torch::manual_seed(0);
  torch::nn::Linear fc(8, 6);
  torch::nn::BatchNorm1d bn(6);
  {
    torch::NoGradGuard no_grad;
    bn->running_mean.uniform_(-1, 1);
    bn->running_var.uniform_(0.5, 2);
  }
  bn->eval();
  torch::nn::Sequential net(fc, bn, torch::nn::ReLU());
  net->eval();
  ModuleState state = ModuleState::of(*net);
  GraphModule gm = torchcap::trace(state, [&net](const std::vector<c10::IValue>& in) {
    return c10::IValue(net->forward(in[0].toTensor()));
  }, {torch::randn({4, 8})});
  GraphModule before = gm.clone();
  ASSERT_TRUE(detail::fold_batch_norms(gm));
  gm.lint();
  EXPECT_EQ(count(gm, "aten::native_batch_norm"), 0u);
  EXPECT_EQ(count(gm, "aten::addmm"), 1u);
  EXPECT_TRUE(gm.has_attribute("0.weight_folded"));
  at::Tensor x = torch::randn({4, 8});
  EXPECT_TRUE(at::allclose(run(gm, {x}), run(before, {x}), 1e-5, 1e-5));
}

// w * 2 + b from attributes alone, then used with the input; and what must
// stay: a random tensor, and a result larger than what it reads.
struct ConstantsImpl : torch::nn::Module {
  at::Tensor w = register_buffer("w", torch::randn({4}));
  at::Tensor b = register_buffer("b", torch::randn({4}));
};

TEST(FoldConstants, WhatAttributesAloneComputeBecomesAnAttribute) {
  torch::manual_seed(0);
  auto m = std::make_shared<ConstantsImpl>();
  ModuleState state = ModuleState::of(*m);
  GraphModule gm = torchcap::trace(state, [&m](const std::vector<c10::IValue>& in) {
    at::Tensor x = in[0].toTensor();
    at::Tensor folded = m->w * 2 + m->b;      // folds: mul, then add
    at::Tensor big = m->w.repeat({64});       // larger than w: stays
    at::Tensor noise = torch::rand_like(m->b);  // random: stays
    return c10::IValue(c10::ivalue::Tuple::create({x * folded, big.sum() + x, noise}));
  }, {torch::randn({4})});
  GraphModule before = gm.clone();
  ASSERT_TRUE(detail::fold_constants(gm));
  gm.lint();
  EXPECT_EQ(count(gm, "aten::add.Tensor"), 1u);  // big.sum() + x
  EXPECT_EQ(count(gm, "aten::mul.Tensor"), 1u);  // x * folded
  EXPECT_EQ(count(gm, "aten::repeat"), 1u);
  EXPECT_EQ(count(gm, "aten::rand_like"), 1u);
  EXPECT_TRUE(gm.has_attribute("_folded_add"));
  EXPECT_FALSE(gm.has_attribute("_folded_mul"));  // an intermediate, read by nothing now
  EXPECT_TRUE(at::equal(gm.attribute("_folded_add").value, m->w * 2 + m->b));
  at::Tensor x = torch::randn({4});
  auto want = Interpreter(before).run({x}).toTupleRef().elements();
  auto got = Interpreter(gm).run({x}).toTupleRef().elements();
  EXPECT_TRUE(at::equal(got[0].toTensor(), want[0].toTensor()));
  EXPECT_TRUE(at::equal(got[1].toTensor(), want[1].toTensor()));
  EXPECT_FALSE(detail::fold_constants(gm));
}

TEST(RemoveNoOps, CallsThatGiveBackTheirInputGoInAGraphThatWritesNothing) {
  GraphModule gm = torchcap::trace([](const std::vector<c10::IValue>& in) {
    at::Tensor x = in[0].toTensor();
    at::Tensor y = torch::dropout(x.detach().clone().view({2, 3}), 0.5, /*train=*/false);
    at::Tensor t = x.t().clone();  // contiguous where t is not: kept
    return c10::IValue(c10::ivalue::Tuple::create({torch::relu(y) + 1, t, x.clone()}));
  }, {torch::randn({2, 3})});
  GraphModule before = gm.clone();
  const size_t clones = count(gm, "aten::clone");
  ASSERT_TRUE(detail::remove_no_ops(gm));
  gm.lint();
  EXPECT_EQ(count(gm, "aten::detach"), 0u);
  EXPECT_EQ(count(gm, "aten::view"), 0u);
  // The clone of t changed strides; the returned clone is the caller's own.
  EXPECT_EQ(count(gm, "aten::clone"), clones - 1);
  at::Tensor x = torch::randn({2, 3});
  auto want = Interpreter(before).run({x}).toTupleRef().elements();
  auto got = Interpreter(gm).run({x}).toTupleRef().elements();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(at::equal(got[i].toTensor(), want[i].toTensor())) << i;
  EXPECT_FALSE(detail::remove_no_ops(gm));

  GraphModule writes = torchcap::trace([](const std::vector<c10::IValue>& in) {
    at::Tensor y = in[0].toTensor().clone();
    return c10::IValue(y.relu_() + 1);
  }, {torch::randn({3})});
  const std::string listing = writes.str();
  EXPECT_FALSE(detail::remove_no_ops(writes));  // relu_ writes the clone
  EXPECT_EQ(writes.str(), listing);
}

TEST(PrepackLinears, LinearLayersRunPackedWithTheReluFused) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(256, 300), torch::nn::ReLU(), torch::nn::Linear(300, 10));
  net->eval();
  ModuleState state = ModuleState::of(*net);
  auto forward = [&net](const std::vector<c10::IValue>& in) { return c10::IValue(net->forward(in[0].toTensor())); };
  GraphModule gm = torchcap::trace(state, forward, {torch::randn({2, 256})});
  GraphModule before = gm.clone();
  ASSERT_TRUE(detail::prepack_linears(gm));
  gm.lint();
  EXPECT_EQ(gm.str(),
            "# parameter 0.weight: f32[300, 256]\n"
            "# parameter 0.bias: f32[300]\n"
            "# parameter 2.weight: f32[10, 300]\n"
            "# parameter 2.bias: f32[10]\n"
            "# inputs: (*,)\n"
            "# outputs: *\n"
            "graph():\n"
            "    %ph_0 : f32[2, 256] [users=1] = placeholder[target=ph_0]\n"
            "    %_0_weight : f32[300, 256] [users=1] = get_attr[target=0.weight]\n"
            "    %_0_bias : f32[300] [users=1] = get_attr[target=0.bias]\n"
            "    %linear_prepack : [users=1] = torchcap::linear_prepack(%_0_weight, %_0_bias, [2, 256], 'relu')\n"
            "    %linear_run : f32[2, 300] [users=1] = torchcap::linear_run(%ph_0, %linear_prepack)\n"
            "    %_2_weight : f32[10, 300] [users=1] = get_attr[target=2.weight]\n"
            "    %_2_bias : f32[10] [users=1] = get_attr[target=2.bias]\n"
            "    %linear_prepack_1 : [users=1] = torchcap::linear_prepack(%_2_weight, %_2_bias, [2, 300], 'none')\n"
            "    %linear_run_1 : f32[2, 10] [users=1] = torchcap::linear_run(%linear_run, %linear_prepack_1)\n"
            "    return (%linear_run_1,)\n");
  at::Tensor x = torch::randn({2, 256});
  EXPECT_TRUE(at::allclose(run(gm, {x}), run(before, {x}), 1e-5, 1e-5));
  const std::string bytes = save_to_string(gm);
  EXPECT_TRUE(at::equal(run(load_from_buffer(bytes.data(), bytes.size()), {x}), run(gm, {x})));

  // A dynamic graph: oneDNN's packing takes the batch; XNNPACK's does not,
  // for the large layer; the small one stays addmm.
  TraceOptions options;
  options.dynamic = {DynamicDim{.input = 0, .dim = 0, .name = "batch"}};
  GraphModule dynamic = torchcap::trace(state, forward, {torch::randn({2, 256})}, options);
  GraphModule dynamic_before = dynamic.clone();
  if (!detail::xnnpack_runs()) {
    EXPECT_FALSE(detail::prepack_linears(dynamic));
    return;
  }
  ASSERT_TRUE(detail::prepack_linears(dynamic));
  dynamic.lint();
  EXPECT_EQ(count(dynamic, "prepacked::linear_clamp_run"), 1u);  // 256 x 300; 300 x 10 is too small to gain
  EXPECT_EQ(count(dynamic, "aten::addmm"), 1u);
  EXPECT_EQ(count(dynamic, "aten::relu"), 0u);
  for (int64_t batch : {3, 5}) {
    at::Tensor y = torch::randn({batch, 256});
    EXPECT_TRUE(at::allclose(run(dynamic, {y}), run(dynamic_before, {y}), 1e-5, 1e-5)) << batch;
  }
}

TEST(PrepackConvolutions, AHardtanhAfterAConvolutionRunsInsideIt) {
  torch::manual_seed(0);
  auto m = std::make_shared<TwoConvsImpl>();
  ModuleState state = ModuleState::of(*m);
  GraphModule gm = torchcap::trace(state, [&m](const std::vector<c10::IValue>& in) {
    return c10::IValue(m->b->forward(torch::hardtanh(m->a->forward(in[0].toTensor()), 0, 6)));
  }, {torch::randn({1, 3, 8, 8})});
  GraphModule before = gm.clone();
  ASSERT_TRUE(detail::prepack_convolutions(gm));
  gm.lint();
  EXPECT_EQ(count(gm, "aten::hardtanh"), 0u);
  EXPECT_EQ(count(gm, "torchcap::conv2d_run"), 2u);
  EXPECT_NE(gm.str().find("torchcap::conv2d_prepack(%a_weight, None, [1, 1], [1, 1], [1, 1], 1, [1, 3, 8, 8], "
                          "'hardtanh', 0.0, 6.0)"),
            std::string::npos)
      << gm.str();
  expect_runs_as_before(gm, before, {1, 3, 8, 8});
}

TEST(OptimizeForInference, RefusesAGraphThatUpdatesItsBuffers) {
  ConvBn m;
  GraphModule training = m.trace(/*training=*/true);
  const std::string listing = training.str();
  try {
    optimize_for_inference(training);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("writes one of the graph's attributes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("eval mode"), std::string::npos) << e.what();
  }
  EXPECT_EQ(training.str(), listing);
  m.model->train();
  GraphModule exported = export_program(*m.model, [&m](const std::vector<c10::IValue>& in) {
    return c10::IValue(m.model->bn->forward(m.model->conv->forward(in[0].toTensor())));
  }, {torch::randn({2, 3, 8, 8})});
  try {
    optimize_for_inference(exported);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("updates the buffer '1.num_batches_tracked'"), std::string::npos) << e.what();
  }
}

// Every example of the zoo that is an inference graph, optimized: lint-clean,
// equal to its traced graph within the tolerance of docs/optimize.md, and a
// file that loads and gives the same.
TEST(OptimizeForInference, TheExampleZoo) {
  for (const std::string& name : examples::names()) {
    examples::Example e = examples::make(name);
    if (e.module != nullptr) e.module->eval();
    GraphModule gm = examples::trace(e);
    GraphModule optimized = gm.clone();
    try {
      optimize_for_inference(optimized);
    } catch (const Error& err) {
      // Only graphs that update what they hold are refused.
      EXPECT_NE(std::string(err.what()).find("optimize_for_inference: "), std::string::npos) << name;
      EXPECT_EQ(optimized.str(), gm.str()) << name;
      continue;
    }
    optimized.lint();
    std::vector<c10::IValue> inputs = e.make_inputs(1);
    c10::IValue want = Interpreter(gm).run(inputs);
    const std::string bytes = save_to_string(optimized);
    GraphModule loaded = load_from_buffer(bytes.data(), bytes.size());
    for (const GraphModule* g : {&optimized, &loaded}) {
      EXPECT_LE(examples::max_abs_diff(Interpreter(*g).run(inputs), want), 5e-4) << name;
    }
  }
}

TEST(OptimizePipeline, ResNet18AgreesWithTheTracedGraph) {
  auto [gm, optimized] = resnet18_through({"optimize"});
  EXPECT_EQ(count(optimized, "aten::convolution"), 0u);
  EXPECT_EQ(count(optimized, "aten::native_batch_norm"), 0u);
  EXPECT_EQ(count(optimized, "torchcap::conv2d_run"), count(gm, "aten::convolution"));
  // Each block's residual add and the relu after it run inside its second convolution.
  auto adds = [](const GraphModule& g) { return count(g, "aten::add.Tensor") + count(g, "aten::add_.Tensor"); };
  auto relus = [](const GraphModule& g) { return count(g, "aten::relu") + count(g, "aten::relu_"); };
  EXPECT_EQ(adds(gm), 8u);
  EXPECT_EQ(adds(optimized) + relus(optimized), 0u);
}

}  // namespace
}  // namespace torchcap
