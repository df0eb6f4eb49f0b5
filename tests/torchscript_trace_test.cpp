// Tracing TorchScript modules (torch::jit::load): the module's own operators
// are recorded, its parameters keep their qualified names.
#include <torchcap/export.h>
#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/library.h>
#include <torchcap/printer.h>
#include <torchcap/tracer.h>

#include <gtest/gtest.h>
#include <torch/script.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

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

// Scripted models written by tests/python/make_torchscript_fixtures.py (the
// torchscript_fixtures test) from Python source in fixture_models.py.
std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(TORCHCAP_TS_FIXTURES) / name;
}

torch::jit::Module load_fixture(const std::string& name) {
  auto path = fixture(name + ".pt");
  if (!std::filesystem::exists(path)) {
    throw std::runtime_error(path.string() + " is missing: run the tests through ctest, whose "
                                              "torchscript_fixtures test writes it");
  }
  torch::jit::Module m = torch::jit::load(path.string());
  m.eval();
  return m;
}

// The 1-based number of the line of fixture_models.py holding `text`.
int fixture_line(const std::string& text) {
  std::ifstream in(fixture("fixture_models.py"));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find(text) != std::string::npos) return n;
  }
  return -1;
}

const Node* first_call(const GraphModule& gm, const std::string& target, int skip = 0) {
  for (const Node* n : gm.graph()) {
    if (n->target() == target && skip-- == 0) return n;
  }
  return nullptr;
}

TEST(TorchScriptSource, NodesCarryTheModelsPythonFramesAndModules) {
  torch::jit::Module m = load_fixture("located");
  GraphModule gm = trace(m, {torch::randn({1, 3, 5, 5})});
  const Node* relu = first_call(gm, "aten::relu", /*skip=*/1);  // the second block's
  ASSERT_NE(relu, nullptr);

  const std::vector<SourceFrame>& frames = relu->meta().stack_trace.frames();
  ASSERT_GE(frames.size(), 3u) << relu->meta().stack_trace.str();
  const SourceFrame& inner = frames.front();  // innermost first, as for C++ frames
  EXPECT_EQ(std::filesystem::path(inner.file).filename(), "fixture_models.py");
  EXPECT_EQ(inner.line, fixture_line("# the block's activation"));
  EXPECT_EQ(inner.function, "forward");
  EXPECT_EQ(inner.code, "return torch.relu(self.conv(x))  # the block's activation");
  const SourceFrame& outer = frames.back();
  EXPECT_EQ(outer.line, fixture_line("return self.features(self.stem(x)).sum(dim=1)"));

  std::vector<ModuleFrame> expected = {{"", "fixture_models.Located"},
                                       {"features", "torch.nn.modules.container.Sequential"},
                                       {"features.1", "fixture_models.Block"}};
  EXPECT_EQ(relu->meta().module_stack.frames(), expected);

  const Node* conv = first_call(gm, "aten::convolution", /*skip=*/2);
  ASSERT_NE(conv, nullptr);
  ASSERT_FALSE(conv->meta().module_stack.empty());
  EXPECT_EQ(conv->meta().module_stack.frames().back(),
            (ModuleFrame{"features.1.conv", "torch.nn.modules.conv.Conv2d"}));
  EXPECT_EQ(conv->meta().stack_trace.frames().front().file.find("conv.py") != std::string::npos, true)
      << conv->meta().stack_trace.str();

  // The listing shows where each operator came from.
  PrintOptions with_source;
  with_source.source = true;
  std::string listing = format_graph(gm.graph(), with_source);
  EXPECT_NE(listing.find("    # features.1 (Block), File: "), std::string::npos) << listing;
  EXPECT_NE(listing.find("code: return torch.relu(self.conv(x))"), std::string::npos) << listing;
  // Nothing points into the C++ program that traced it.
  EXPECT_EQ(listing.find(".cpp"), std::string::npos) << listing;
}

TEST(TorchScriptSource, OneLocationIsSharedByTheNodesOfOneModuleCall) {
  torch::jit::Module m = load_fixture("located");
  GraphModule gm = trace(m, {torch::randn({1, 3, 5, 5})});
  const Node* first = first_call(gm, "aten::relu", 0);
  const Node* second = first_call(gm, "aten::relu", 1);
  ASSERT_TRUE(first && second);
  // The same line, two module instances: the stacks differ by path only.
  EXPECT_EQ(first->meta().stack_trace.frames(), second->meta().stack_trace.frames());
  EXPECT_EQ(first->meta().module_stack.frames().back().path, "features.0");
  EXPECT_EQ(second->meta().module_stack.frames().back().path, "features.1");
}

TEST(TorchScriptSource, ExportKeepsTheLocations) {
  torch::jit::Module m = load_fixture("located");
  GraphModule gm = export_program(m, {torch::randn({1, 3, 5, 5})});
  const Node* relu = first_call(gm, "aten::relu", 1);
  ASSERT_NE(relu, nullptr);
  EXPECT_EQ(relu->meta().module_stack.frames().back().path, "features.1");
  ASSERT_FALSE(relu->meta().stack_trace.frames().empty());
  EXPECT_EQ(relu->meta().stack_trace.frames().front().line, fixture_line("# the block's activation"));
}

TEST(TorchScriptSource, AnExplicitLocatorWins) {
  torch::jit::Module m = load_fixture("located");
  TraceOptions options;
  int calls = 0;
  options.locate_source = [&calls](NodeMeta& meta) {
    ++calls;
    meta.module_stack = ModuleStack(std::vector<ModuleFrame>{{"mine", "Mine"}});
  };
  GraphModule gm = trace(m, {torch::randn({1, 3, 5, 5})}, options);
  EXPECT_GT(calls, 0);
  EXPECT_EQ(first_call(gm, "aten::relu")->meta().module_stack.frames().back().path, "mine");
}

TEST(TorchScriptInputs, OmittedTrailingArgumentsTakeTheirDefaults) {
  torch::jit::Module m = load_fixture("defaults");
  at::Tensor x = torch::randn({2, 3});
  GraphModule gm = trace(m, {x});  // mask=None, scale=2.0, steps=3
  gm.lint();
  EXPECT_EQ(count_target(gm, "aten::mul.Scalar"), 3u);
  EXPECT_EQ(count_target(gm, "aten::add.Tensor"), 0u);
  EXPECT_TRUE(torch::allclose(Interpreter(gm).run({x}).toTensor(), x * 8));

  GraphModule given = trace(m, {x, x, 0.5, int64_t{1}});
  EXPECT_EQ(count_target(given, "aten::mul.Scalar"), 1u);
  EXPECT_EQ(count_target(given, "aten::add.Tensor"), 1u);
}

TEST(TorchScriptTensorLiterals, ListsTurnedIntoTensorsBecomeConstants) {
  // torch.tensor([...]) and torch.as_tensor(list) write an empty tensor's
  // memory directly (Note [Raw writes into a fresh tensor]).
  torch::jit::Module m = load_fixture("tensor_literal");
  at::Tensor x = torch::randn({2, 3});
  auto [gm, out] = trace_with_outputs(m, {x});
  gm.lint();
  at::Tensor expected = m.forward({x}).toTensor();
  EXPECT_TRUE(torch::allclose(out.toTensor(), expected));
  at::Tensor other = torch::randn({2, 3});
  EXPECT_TRUE(torch::allclose(Interpreter(gm).run({other}).toTensor(), m.forward({other}).toTensor()));
  ASSERT_TRUE(gm.has_attribute("_tensor_constant0"));
  EXPECT_TRUE(torch::equal(gm.attribute("_tensor_constant0").value, torch::tensor({1.0f, 2.0f, 3.0f})));
  GraphModule exported = export_program(m, {x});
  EXPECT_TRUE(torch::allclose(Interpreter(exported).run({other}).toTensor(), m.forward({other}).toTensor()));
}

TEST(TorchScriptTensorLiterals, OtherTracedTensorsStillRefuseRawAccess) {
  at::Tensor x = torch::randn({3});
  try {
    trace([](std::vector<c10::IValue> in) {
      at::Tensor y = in[0].toTensor() + 1;
      (void)y.data_ptr();
      return c10::IValue(y);
    }, {x});
    FAIL() << "expected an error";
  } catch (const TraceError& e) {
    // Note [Raw reads of traced tensors]
    EXPECT_NE(std::string(e.what()).find("reads the memory of traced tensor %add"), std::string::npos)
        << e.what();
  }
}

TEST(TorchScriptErrors, TheSummaryThenTheModelsFrames) {
  torch::jit::Module m = load_fixture("located");
  try {
    trace(m, {torch::randn({1, 2, 5, 5})});  // two channels where the stem takes three
    FAIL() << "expected an error";
  } catch (const ModelError& e) {
    EXPECT_EQ(e.summary().find("the model failed: "), 0u) << e.summary();
    EXPECT_NE(e.summary().find("expected input[1, 2, 5, 5] to have 3 channels"), std::string::npos)
        << e.summary();
    EXPECT_EQ(e.summary().find('\n'), std::string::npos);
    EXPECT_NE(e.traceback().find("fixture_models.py\", line " +
                                 std::to_string(fixture_line("return self.features(self.stem(x))"))),
              std::string::npos)
        << e.traceback();
    EXPECT_NE(e.traceback().find("\n    return self.features(self.stem(x)).sum(dim=1)"),
              std::string::npos)
        << e.traceback();
    EXPECT_EQ(std::string(e.what()), e.summary() + "\n" + e.traceback());
  }
}

TEST(CustomOperators, RecordedByNameAndRunByTheInterpreter) {
  EXPECT_THROW(load_library("/nonexistent/libops.so"), Error);
  load_library(TORCHCAP_TEST_OPS);
  load_library(TORCHCAP_TEST_OPS);  // twice: nothing happens
  torch::jit::Module m = load_fixture("custom_op");  // needs the library loaded
  at::Tensor x = torch::randn({4}), y = torch::randn({4});
  GraphModule gm = trace(m, {x, y});
  gm.lint();
  EXPECT_EQ(count_target(gm, "torchcap_test::scale_add"), 1u);
  EXPECT_TRUE(torch::allclose(Interpreter(gm).run({x, y}).toTensor(), x.relu() + y * 0.5));
  GraphModule exported = export_program(m, {x, y});
  EXPECT_EQ(count_target(exported, "torchcap_test::scale_add"), 1u);
}

TEST(CustomOperators, ALibraryThatCannotLoadIsNamed) {
  auto junk = std::filesystem::temp_directory_path() / ("torchcap_junk_" + std::to_string(::getpid()) + ".so");
  std::ofstream(junk) << "not a shared object";
  try {
    load_library(junk.string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_EQ(what.find("cannot load operator library '" + junk.string() + "': "), 0u) << what;
  }
  std::filesystem::remove(junk);
}

}  // namespace
}  // namespace torchcap
