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

}  // namespace
}  // namespace torchcap
