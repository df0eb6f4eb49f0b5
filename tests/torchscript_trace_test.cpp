// Tracing TorchScript modules (torch::jit::load): the module's own operators
// are recorded, its parameters keep their qualified names.
#include <torchcap/interpreter.h>
#include <torchcap/tracer.h>

#include <gtest/gtest.h>
#include <torch/script.h>

#include <cstdio>
#include <filesystem>

namespace torchcap {
namespace {

size_t count_target(const GraphModule& gm, const std::string& target) {
  size_t n = 0;
  for (const Node* node : gm.graph()) n += node->target() == target ? 1 : 0;
  return n;
}

// A scripted model, saved and loaded back as users get them.
torch::jit::Module scripted_model() {
  torch::manual_seed(0);
  torch::jit::Module block("Block");
  block.register_parameter("weight", torch::randn({8, 8}) * 0.1, false);
  block.register_parameter("bias", torch::randn({8}), false);
  block.define(R"(
    def forward(self, x):
        return torch.relu(torch.linear(x, self.weight, self.bias))
  )");
  torch::jit::Module model("Model");
  model.register_module("block", block);
  model.register_parameter("norm_weight", torch::ones({8}), false);
  model.register_parameter("norm_bias", torch::zeros({8}), false);
  model.register_buffer("scale", torch::full({8}, 0.5));
  model.define(R"(
    def forward(self, x, extra: Dict[str, Tensor]):
        h = self.block.forward(x)
        h = torch.layer_norm(h, [8], self.norm_weight, self.norm_bias, 1e-5)
        return h * self.scale + extra["shift"], h.sum(dim=1)
  )");
  auto path = std::filesystem::temp_directory_path() /
              ("torchcap_ts_" + std::to_string(::getpid()) + ".pt");
  model.save(path.string());
  torch::jit::Module loaded = torch::jit::load(path.string());
  std::filesystem::remove(path);
  loaded.eval();
  return loaded;
}

std::vector<c10::IValue> inputs(uint64_t seed) {
  torch::manual_seed(seed);
  c10::Dict<std::string, at::Tensor> extra;
  extra.insert("shift", torch::randn({8}));
  return {torch::randn({3, 8}), extra};
}

TEST(TorchScript, TracesTheModulesOperatorsWithQualifiedNames) {
  torch::jit::Module m = scripted_model();
  auto [gm, traced_out] = trace_with_outputs(m, inputs(1));
  gm.lint();
  EXPECT_TRUE(gm.has_attribute("block.weight"));
  EXPECT_TRUE(gm.has_attribute("block.bias"));
  EXPECT_TRUE(gm.has_attribute("norm_weight"));
  EXPECT_EQ(gm.attribute("scale").kind, AttributeKind::Buffer);
  EXPECT_EQ(gm.attribute("block.weight").kind, AttributeKind::Parameter);
  EXPECT_EQ(count_target(gm, "aten::relu"), 1u);
  EXPECT_EQ(count_target(gm, "aten::native_layer_norm"), 1u);
  EXPECT_EQ(gm.in_spec.str(), "(*, {'shift': *})");

  c10::IValue expected = m.forward(inputs(2));
  c10::IValue actual = Interpreter(gm).run(inputs(2));
  auto e = expected.toTupleRef().elements();
  auto a = actual.toTupleRef().elements();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_TRUE(torch::allclose(a[0].toTensor(), e[0].toTensor(), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(a[1].toTensor(), e[1].toTensor(), 1e-5, 1e-5));
}

TEST(TorchScript, InferenceModeKeepsLinearAndLayerNorm) {
  torch::jit::Module m = scripted_model();
  TraceOptions options;
  options.inference_mode = true;
  GraphModule gm = trace(m, inputs(1), options);
  gm.lint();
  EXPECT_EQ(count_target(gm, "aten::linear"), 1u);
  EXPECT_EQ(count_target(gm, "aten::layer_norm"), 1u);
  EXPECT_EQ(count_target(gm, "aten::addmm"), 0u);
  c10::IValue expected = m.forward(inputs(3));
  c10::IValue actual = Interpreter(gm).run(inputs(3));
  EXPECT_TRUE(torch::allclose(actual.toTupleRef().elements()[0].toTensor(),
                              expected.toTupleRef().elements()[0].toTensor(), 1e-5, 1e-5));
}

TEST(TorchScript, ErrorsInsideScriptedCodePropagate) {
  torch::jit::Module m("Bad");
  m.define(R"(
    def forward(self, x):
        assert x.size(0) <= 1, "batch too large for this model"
        return x
  )");
  try {
    trace(m, {torch::ones({2, 2})});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("batch too large for this model"), std::string::npos)
        << e.what();
  }
  GraphModule ok = trace(m, {torch::ones({1, 2})});  // the next trace works
  ok.lint();
}

}  // namespace
}  // namespace torchcap
