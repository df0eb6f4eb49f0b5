// Meta mode (TraceOptions::meta): the graph equals the one a real trace
// records, node for node, while nothing is computed; what meta mode cannot
// do is an error naming the operator.
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/tracer.h>

#include "models.h"
#include "trace/tracing_tensor.h"
#include "transformers.h"
#include "zoo.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <fstream>
#include <sstream>

namespace torchcap {
namespace {

TraceOptions meta_options(TraceOptions options = {}) {
  options.meta = true;
  return options;
}

// Inputs as shapes only: every tensor becomes a meta tensor.
c10::IValue to_meta(const c10::IValue& v) {
  auto [leaves, spec] = tree_flatten(v);
  std::vector<c10::IValue> out;
  for (const at::Tensor& t : leaves) out.emplace_back(t.to(c10::kMeta));
  return spec.unflatten(out);
}

std::vector<c10::IValue> to_meta(const std::vector<c10::IValue>& in) {
  std::vector<c10::IValue> out;
  for (const c10::IValue& v : in) out.push_back(to_meta(v));
  return out;
}

bool same_tensor(const at::Tensor& a, const at::Tensor& b) {
  if (a.is_same(b)) return true;
  // Two instances of one example, or a buffer the real trace snapshotted.
  return TensorMeta::of(a) == TensorMeta::of(b) && (a.is_meta() || at::equal(a, b));
}

// A node's frames up to the test's own (the two traces are made on
// different lines of a test).
std::string program_frames(const StackTrace& st) {
  std::string out;
  for (const SourceFrame& f : st.frames()) {
    if (f.file.find("meta_trace_test.cpp") != std::string::npos) break;
    out += f.file + ":" + std::to_string(f.line) + " " + f.function + " " + f.code + "\n";
  }
  return out;
}

// The graphs are the same: listing (operators, arguments, names, types,
// sources), every node's metadata (dtype, shape, strides, device, stack
// trace, module stack), the attributes and the specs.
void expect_same_graph(const GraphModule& real, const GraphModule& meta, const std::string& what) {
  ASSERT_EQ(real.str(/*with_source=*/true), meta.str(/*with_source=*/true)) << what;
  auto r = real.graph().begin();
  auto m = meta.graph().begin();
  for (; r != real.graph().end() && m != meta.graph().end(); ++r, ++m) {
    const Node& a = **r;
    const Node& b = **m;
    EXPECT_EQ(a.meta().val, b.meta().val) << what << ": %" << a.name() << " real "
                                          << a.meta().val.str() << " meta " << b.meta().val.str();
    for (size_t i = 0; i < a.meta().val.tensors.size() && i < b.meta().val.tensors.size(); ++i) {
      EXPECT_EQ(a.meta().val.tensors[i].device, b.meta().val.tensors[i].device)
          << what << ": %" << a.name();
    }
    EXPECT_EQ(program_frames(a.meta().stack_trace), program_frames(b.meta().stack_trace))
        << what << ": %" << a.name();
    EXPECT_EQ(a.meta().module_stack, b.meta().module_stack) << what << ": %" << a.name();
  }
  ASSERT_EQ(real.attributes().size(), meta.attributes().size()) << what;
  for (size_t i = 0; i < real.attributes().size(); ++i) {
    const Attribute& a = real.attributes()[i];
    const Attribute& b = meta.attributes()[i];
    EXPECT_EQ(a.name, b.name) << what;
    EXPECT_EQ(a.kind, b.kind) << what << ": " << a.name;
    EXPECT_FALSE(b.value.is_meta() && !a.value.is_meta()) << what << ": " << a.name;
    EXPECT_TRUE(same_tensor(a.value, b.value)) << what << ": attribute " << a.name;
  }
  EXPECT_EQ(real.in_spec.str(), meta.in_spec.str()) << what;
  EXPECT_EQ(real.out_spec.str(), meta.out_spec.str()) << what;
}

// Both modes through one call site, so that C++ stack traces match.
TraceResult trace_example(examples::Example& e, const TraceOptions& options,
                          std::vector<c10::IValue> inputs) {
  return examples::trace_with_outputs(e, options, std::move(inputs));
}

GraphModule export_example(examples::Example& e, const TraceOptions& options,
                           const std::vector<c10::IValue>& inputs) {
  return e.module ? export_program(*e.module, e.forward, inputs, options)
                  : export_program(e.forward, inputs, options);
}

class MetaZoo : public ::testing::TestWithParam<std::string> {};

TEST_P(MetaZoo, GraphEqualsTheRealTrace) {
  // Two instances: a real trace of a model in train mode updates its buffers.
  examples::Example real_model = examples::make(GetParam());
  examples::Example meta_model = examples::make(GetParam());
  GraphModule real = trace_example(real_model, {}, real_model.make_inputs(0)).module;
  TraceResult meta = trace_example(meta_model, meta_options(), meta_model.make_inputs(0));
  expect_same_graph(real, meta.module, GetParam());
  auto [outputs, spec] = tree_flatten(meta.outputs);
  for (const at::Tensor& t : outputs) EXPECT_TRUE(t.is_meta()) << GetParam();
}

TEST_P(MetaZoo, ShapesOnlyInputsGiveTheSameGraph) {
  examples::Example real_model = examples::make(GetParam());
  examples::Example meta_model = examples::make(GetParam());
  GraphModule real = trace_example(real_model, {}, real_model.make_inputs(0)).module;
  GraphModule meta = trace_example(meta_model, meta_options(), to_meta(meta_model.make_inputs(0))).module;
  expect_same_graph(real, meta, GetParam() + " (meta inputs)");
}

TEST_P(MetaZoo, ExportEqualsTheRealExport) {
  examples::Example real_model = examples::make(GetParam());
  examples::Example meta_model = examples::make(GetParam());
  GraphModule real = export_example(real_model, {}, real_model.make_inputs(0));
  GraphModule meta = export_example(meta_model, meta_options(), meta_model.make_inputs(0));
  expect_same_graph(real, meta, GetParam() + " (exported)");
}

INSTANTIATE_TEST_SUITE_P(Examples, MetaZoo, ::testing::ValuesIn(examples::names()),
                         [](const auto& info) { return info.param; });

// A torch::nn module traced in both modes through one call site.
template <typename Model>
GraphModule trace_module(std::shared_ptr<Model> model, const std::vector<c10::IValue>& inputs,
                         bool meta) {
  TracedFunction forward = [model](std::vector<c10::IValue> in) {
    return c10::IValue(model->forward(in[0].toTensor()));
  };
  return trace(ModuleState::of(*model), forward, inputs, meta ? meta_options() : TraceOptions{});
}

TEST(MetaMode, VisionTransformerEqualsTheRealTrace) {
  examples::ViTOptions o;
  o.image_size = 32;
  o.patch_size = 8;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  o.mlp_width = 64;
  o.num_classes = 10;
  torch::manual_seed(0);
  auto model = std::make_shared<examples::ViT>(o);
  model->eval();
  std::vector<c10::IValue> in = {at::randn({2, 3, 32, 32})};
  expect_same_graph(trace_module(model, in, false), trace_module(model, in, true), "vit");
}

TEST(MetaMode, DecoderEqualsTheRealTrace) {
  examples::DecoderOptions o;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  o.vocab = 50;
  o.context = 16;
  torch::manual_seed(0);
  auto model = std::make_shared<examples::Decoder>(o);
  std::vector<c10::IValue> in = {at::randint(0, 50, {2, 8})};
  expect_same_graph(trace_module(model, in, false), trace_module(model, in, true), "decoder");
}

TEST(MetaMode, ModelOnTheMetaDeviceTracesWithShapesOnly) {
  examples::DecoderOptions o;
  o.layers = 2;
  o.width = 64;
  o.heads = 4;
  o.vocab = 100;
  o.context = 16;
  auto model = std::make_shared<examples::Decoder>(o, torch::Device(torch::kMeta));
  TraceResult r = trace_with_outputs(
      ModuleState::of(*model), [&](std::vector<c10::IValue> in) {
        return c10::IValue(model->forward(in[0].toTensor()));
      },
      {at::empty({1, 8}, at::TensorOptions().dtype(at::kLong).device(at::kMeta))}, meta_options());
  EXPECT_TRUE(r.module.has_attribute("h1.c_fc.weight"));
  EXPECT_TRUE(r.module.attribute("wte").value.is_meta());
  EXPECT_EQ(r.outputs.toTensor().sizes(), (std::vector<int64_t>{1, 8, 100}));
  // The input stands for a CPU tensor.
  EXPECT_EQ(r.module.graph().find("ph_0")->meta().val.tensors[0].device, c10::Device(c10::kCPU));
}

TEST(MetaMode, NothingIsComputedOrAllocated) {
  // 40 GB each: a real kernel, or a real allocation, could not run.
  at::Tensor x = at::empty({100000, 100000}, at::TensorOptions().device(at::kMeta));
  TraceResult r = trace_with_outputs(
      ModuleState{}, [](std::vector<c10::IValue> in) {
        at::Tensor a = in[0].toTensor();
        return c10::IValue(at::relu(a.matmul(a)).sum(1) + at::ones({100000}));
      },
      {x}, meta_options());
  EXPECT_TRUE(r.outputs.toTensor().is_meta());
  EXPECT_EQ(r.outputs.toTensor().sizes(), (std::vector<int64_t>{100000}));
  const Node* out = r.module.graph().output_node()->args()[0].to_list()[0].to_node();
  EXPECT_EQ(out->meta().val.str(), "f32[100000]");
  EXPECT_EQ(out->meta().val.tensors[0].device, c10::Device(c10::kCPU));
}

TEST(MetaMode, TheProgramSeesTheDeviceOfARealRun) {
  auto fn = [](std::vector<c10::IValue> in) {
    at::Tensor x = in[0].toTensor();
    if (!x.device().is_cpu() || x.is_meta()) throw std::runtime_error("not a CPU tensor");
    at::Tensor y = x * 2;
    if (!y.device().is_cpu()) throw std::runtime_error("result not on the CPU");
    return c10::IValue(y + at::zeros({3}, x.options()));
  };
  GraphModule gm = trace(fn, {at::empty({3}, at::TensorOptions().device(at::kMeta))}, meta_options());
  const Node* zeros = gm.graph().find("zeros");
  ASSERT_NE(zeros, nullptr);
  EXPECT_EQ(zeros->meta().val.tensors[0].device, c10::Device(c10::kCPU));
}

TEST(MetaMode, ParametersAndBuffersAreTheModulesOwnAndUnchanged) {
  examples::Example e = examples::make("cnn_bn_train");
  std::vector<std::pair<std::string, at::Tensor>> before;
  for (const auto& [name, t] : examples::named_buffers(e)) before.emplace_back(name, t.clone());
  GraphModule gm = examples::trace(e, meta_options());
  for (const auto& [name, t] : examples::named_buffers(e)) {
    for (const auto& [n, old] : before) {
      if (n == name) {
        EXPECT_TRUE(at::equal(t, old)) << name << " was written";
      }
    }
    if (gm.has_attribute(name)) {
      EXPECT_TRUE(gm.attribute(name).value.is_same(t)) << name;
    }
  }
  for (const auto& p : e.module->named_parameters()) {
    ASSERT_TRUE(gm.has_attribute(p.key())) << p.key();
    EXPECT_TRUE(gm.attribute(p.key()).value.is_same(p.value())) << p.key();
  }
}

// --- Errors -------------------------------------------------------------------

std::string meta_trace_error(const TracedFunction& fn, TraceOptions options = meta_options()) {
  try {
    trace(fn, {at::randn({4, 4})}, options);
  } catch (const TraceError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MetaModeErrors, ItemIsAnErrorEvenWhereRealModeAllowsIt) {
  auto fn = [](std::vector<c10::IValue> in) {
    at::Tensor x = in[0].toTensor();
    return c10::IValue(x * x.sum().item<float>());
  };
  TraceOptions allowed = meta_options();
  allowed.allow_data_dependent_values = true;
  for (const TraceOptions& options : {meta_options(), allowed}) {
    std::string message = meta_trace_error(fn, options);
    EXPECT_NE(message.find("aten::_local_scalar_dense"), std::string::npos) << message;
    EXPECT_NE(message.find("in meta mode tensors have no values"), std::string::npos) << message;
  }
}

TEST(MetaModeErrors, DataDependentShapesAreAnError) {
  std::string message = meta_trace_error([](std::vector<c10::IValue> in) {
    return c10::IValue(at::nonzero(in[0].toTensor()));
  });
  EXPECT_NE(message.find("aten::nonzero"), std::string::npos) << message;
  EXPECT_NE(message.find("depends on tensor values"), std::string::npos) << message;

  message = meta_trace_error([](std::vector<c10::IValue> in) {
    at::Tensor x = in[0].toTensor();
    return c10::IValue(at::masked_select(x, x > 0));
  });
  EXPECT_NE(message.find("aten::masked_select"), std::string::npos) << message;
  EXPECT_NE(message.find("depends on tensor values"), std::string::npos) << message;
}

TEST(MetaModeErrors, AnOperatorWithoutAMetaKernelIsNamed) {
  std::string message = meta_trace_error([](std::vector<c10::IValue> in) {
    return c10::IValue(at::histc(in[0].toTensor(), 10));
  });
  EXPECT_NE(message.find("aten::histc has no meta kernel"), std::string::npos) << message;
  EXPECT_NE(message.find("Trace without meta mode"), std::string::npos) << message;
  EXPECT_EQ(message.find("report"), std::string::npos) << message;
}

TEST(MetaModeErrors, ATraceThatFailsLeavesNothingBehind) {
  meta_trace_error([](std::vector<c10::IValue> in) {
    return c10::IValue(at::nonzero(in[0].toTensor()));
  });
  // The next trace, real, works as usual.
  GraphModule gm = trace([](std::vector<c10::IValue> in) { return c10::IValue(in[0].toTensor() + 1); },
                         {at::ones({2})});
  EXPECT_NE(gm.graph().find("add"), nullptr);
}

// --- TorchScript ----------------------------------------------------------------

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream s(text);
  std::string dim;
  while (std::getline(s, dim, 'x')) shape.push_back(std::stoll(dim));
  return shape;
}

// Both modes through one call site (TorchScript frames are the model's, but
// keep it symmetric).
GraphModule trace_script(torch::jit::Module& m, const std::vector<c10::IValue>& in,
                         const TraceOptions& options) {
  return trace(m, in, options);
}

class MetaTorchvision : public ::testing::TestWithParam<std::string> {};

TEST_P(MetaTorchvision, ScriptedGraphEqualsTheRealTrace) {
  const std::string base = std::string(TORCHCAP_META_FIXTURES) + "/" + GetParam();
  torch::jit::Module m = torch::jit::load(base + ".pt");
  m.eval();
  torch::manual_seed(0);
  at::Tensor x = at::randn(parse_shape(read_text(base + ".shape")));
  GraphModule real = trace_script(m, {x}, {});
  GraphModule meta = trace_script(m, {x.to(at::kMeta)}, meta_options());
  expect_same_graph(real, meta, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Torchvision, MetaTorchvision,
                         ::testing::Values("resnet18", "mobilenet_v3_small", "vit", "swin_t"),
                         [](const auto& info) { return info.param; });

class MetaTorchScriptFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(MetaTorchScriptFixtures, GraphEqualsTheRealTrace) {
  torch::jit::Module m = torch::jit::load(std::string(TORCHCAP_TS_FIXTURES) + "/" + GetParam() + ".pt");
  m.eval();
  torch::manual_seed(0);
  std::vector<c10::IValue> in = {at::randn({2, 3, 8, 8})};
  if (GetParam() == "tensor_literal") in = {at::randn({2, 3})};
  if (GetParam() == "defaults") in = {at::randn({2, 3})};
  expect_same_graph(trace_script(m, in, {}), trace_script(m, in, meta_options()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MetaTorchScriptFixtures,
                         ::testing::Values("located", "defaults", "tensor_literal"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace torchcap
