// Passes for inference graphs (src/passes/inference.h): each on a small
// graph, before and after, and on the torchvision-style ResNet-18 example.
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

TEST(FoldBatchNorms, ResNet18ByNameAgreesWithTheUnfoldedGraph) {
  examples::Example e = examples::make("resnet18");
  GraphModule gm = examples::trace(e);
  GraphModule folded = gm.clone();
  ASSERT_TRUE(passes_by_name({"fold_bn"}).run(folded));
  folded.lint();
  EXPECT_EQ(count(folded, "aten::native_batch_norm"), 0u);
  EXPECT_EQ(count(folded, "aten::convolution"), count(gm, "aten::convolution"));
  EXPECT_LT(folded.graph().size(), gm.graph().size());
  InterpreterOptions planned;  // and the memory planner composes with it
  planned.plan_memory = true;
  Interpreter folded_planned(folded, planned);
  for (uint64_t seed : {1, 2}) {
    std::vector<c10::IValue> inputs = e.make_inputs(seed);
    at::Tensor want = Interpreter(gm).run(inputs).toTensor();
    at::Tensor got = Interpreter(folded).run(inputs).toTensor();
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5)) << seed;
    EXPECT_TRUE(at::equal(folded_planned.run(inputs).toTensor(), got)) << seed;
  }
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
            "    %conv2d_prepack : [users=1] = mkldnn_prepacked::conv2d_prepack(%a_weight, None, [1, 1], [1, 1], "
            "[1, 1], 1, [2, 3, 8, 8], 'relu')\n"
            "    %clone : f32[2, 3, 8, 8] [users=1] = aten::clone(%ph_0, memory_format=torch.channels_last)\n"
            "    %conv2d_run : f32[2, 8, 8, 8] [users=1] = mkldnn_prepacked::conv2d_run(%clone, %conv2d_prepack)\n"
            "    %b_weight : f32[4, 8, 3, 3] [users=1] = get_attr[target=b.weight]\n"
            "    %b_bias : f32[4] [users=1] = get_attr[target=b.bias]\n"
            "    %conv2d_prepack_1 : [users=1] = mkldnn_prepacked::conv2d_prepack(%b_weight, %b_bias, [2, 2], "
            "[0, 0], [1, 1], 1, [2, 8, 8, 8], 'none')\n"
            "    %conv2d_run_1 : f32[2, 4, 3, 3] [users=1] = mkldnn_prepacked::conv2d_run(%conv2d_run, "
            "%conv2d_prepack_1)\n"
            "    return (%conv2d_run_1,)\n");
  // Activations are channels-last from the clone on, and the graph says so.
  for (const Node* n : gm.graph()) {
    if (n->target() == "mkldnn_prepacked::conv2d_run") {
      const TensorMeta& t = n->meta().val.tensors[0];
      EXPECT_EQ(t.strides[1], 1) << n->name();
    }
  }
  InterpreterOptions planned;
  planned.plan_memory = true;
  Interpreter packed(gm), packed_planned(gm, planned), unpacked(before);
  for (uint64_t seed : {1, 2}) {
    torch::manual_seed(seed);
    at::Tensor x = torch::randn({2, 3, 8, 8});
    at::Tensor want = unpacked.run({x}).toTensor();
    at::Tensor got = packed.run({x}).toTensor();
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << seed;
    EXPECT_TRUE(at::equal(packed_planned.run({x}).toTensor(), got)) << seed;
    // The file holds the unpacked weights and the two operators.
    const std::string bytes = save_to_string(gm);
    EXPECT_TRUE(at::equal(Interpreter(load_from_buffer(bytes.data(), bytes.size())).run({x}).toTensor(), got));
  }
  EXPECT_FALSE(detail::prepack_convolutions(gm));  // nothing left to pack
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

TEST(OptimizePipeline, ResNet18AgreesWithTheTracedGraph) {
  examples::Example e = examples::make("resnet18");
  GraphModule gm = examples::trace(e);
  GraphModule optimized = gm.clone();
  ASSERT_TRUE(passes_by_name({"optimize"}).run(optimized));
  optimized.lint();
  EXPECT_EQ(count(optimized, "aten::convolution"), 0u);
  EXPECT_EQ(count(optimized, "aten::native_batch_norm"), 0u);
  EXPECT_EQ(count(optimized, "mkldnn_prepacked::conv2d_run"), count(gm, "aten::convolution"));
  InterpreterOptions planned;
  planned.plan_memory = true;
  Interpreter plain(gm), fast(optimized), fast_planned(optimized, planned);
  for (uint64_t seed : {1, 2}) {
    std::vector<c10::IValue> inputs = e.make_inputs(seed);
    at::Tensor want = plain.run(inputs).toTensor();
    at::Tensor got = fast.run(inputs).toTensor();
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5)) << seed;
    EXPECT_TRUE(at::equal(fast_planned.run(inputs).toTensor(), got)) << seed;
  }
}

}  // namespace
}  // namespace torchcap
