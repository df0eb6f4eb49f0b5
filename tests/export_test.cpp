// export_program: trace, dead-code elimination, functionalized re-trace; the
// graph signature; writes applied through it.
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/interpreter.h>

#include "zoo.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

namespace torchcap {
namespace {

using IValues = std::vector<c10::IValue>;

GraphModule export_example(examples::Example& e, const TraceOptions& options = {}) {
  IValues inputs = e.make_inputs(0);
  if (e.module) return export_program(*e.module, e.forward, inputs, options);
  return export_program(e.forward, inputs, options);
}

class ExportZoo : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportZoo, IsFunctionalLintsAndRunsLikeEager) {
  const std::string name = GetParam();
  examples::Example traced = examples::make(name);
  GraphModule gm = export_example(traced);
  gm.lint();
  EXPECT_EQ(find_mutation_or_view(gm.graph()), std::nullopt) << name;

  examples::Example eager = examples::make(name);
  Interpreter interp(gm);
  for (uint64_t seed : {1, 2}) {
    IValues inputs = eager.make_inputs(seed);
    c10::IValue expected = eager.forward(inputs);
    EXPECT_LE(examples::max_abs_diff(interp.run(inputs), expected), 1e-5) << name;
  }
  // Buffers the program updates (BatchNorm's running stats in train mode)
  // are updated by the run, through the signature.
  for (const auto& [buffer, value] : examples::named_buffers(eager)) {
    if (!gm.has_attribute(buffer)) continue;
    EXPECT_TRUE(at::allclose(gm.attribute(buffer).value, value, 1e-5, 1e-6)) << name << " " << buffer;
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, ExportZoo, ::testing::ValuesIn(examples::names()),
                         [](const auto& info) { return info.param; });

TEST(Export, BatchNormInTrainModeReturnsItsRunningStats) {
  examples::Example e = examples::make("cnn_bn_train");
  GraphModule gm = export_example(e);
  std::vector<std::string> updated;
  for (const OutputSpec& s : gm.output_specs) {
    if (s.kind == OutputKind::BufferMutation) updated.push_back(s.target);
  }
  EXPECT_EQ(updated, (std::vector<std::string>{"bn1.num_batches_tracked", "bn1.running_mean",
                                               "bn1.running_var", "bn2.num_batches_tracked",
                                               "bn2.running_mean", "bn2.running_var"}));
  EXPECT_EQ(gm.num_user_outputs(), 1u);
  GraphSignature sig = gm.signature();
  EXPECT_EQ(sig.user_inputs, std::vector<std::string>{"ph_0"});
  EXPECT_EQ(sig.buffers.size(), 6u);
  EXPECT_EQ(sig.outputs.size(), 7u);
  EXPECT_NE(gm.str().find("# signature:\n#   output 0 "), std::string::npos) << gm.str();
  EXPECT_NE(gm.str().find(": buffer mutation -> bn1.running_mean"), std::string::npos);
}

c10::IValue writes_its_input(IValues in) {
  at::Tensor x = in[0].toTensor();
  x.mul_(2);
  x.view({-1}).add_(1);  // through a view, too
  return c10::IValue(x.sum(0));
}

TEST(Export, InPlaceUpdateOfAnInputIsAppliedThroughTheSignature) {
  at::Tensor example = at::randn({3, 2});
  at::Tensor kept = example.clone();
  GraphModule gm = export_program(writes_its_input, {example});
  EXPECT_TRUE(at::equal(example, kept));  // exporting does not touch the caller's tensor
  ASSERT_EQ(gm.output_specs.size(), 2u);
  EXPECT_EQ(gm.output_specs[1].kind, OutputKind::InputMutation);
  EXPECT_EQ(gm.output_specs[1].target, "ph_0");
  EXPECT_TRUE(is_functional(gm.graph()));

  at::Tensor a = at::randn({3, 2});
  at::Tensor b = a.clone();
  c10::IValue eager_result = writes_its_input({a});
  c10::IValue graph_result = Interpreter(gm).run({b});
  EXPECT_TRUE(at::allclose(graph_result.toTensor(), eager_result.toTensor()));
  EXPECT_TRUE(at::allclose(b, a));  // the input was updated like eager's
}

TEST(Export, StackTracesSurviveTheReTrace) {
  int line = 0;
  auto program = [&line](IValues in) {
    at::Tensor y = in[0].toTensor().clone();
    line = __LINE__ + 1;
    y.sigmoid_();
    return c10::IValue(y);
  };
  GraphModule first = trace(program, {at::randn({4})});
  GraphModule exported = export_program(program, {at::randn({4})});
  const Node* in_place = first.graph().find("sigmoid_");
  const Node* functional = exported.graph().find("sigmoid");
  ASSERT_TRUE(in_place && functional) << exported.str();
  auto names_line = [&](const Node* n) {
    for (const SourceFrame& f : n->meta().stack_trace.frames()) {
      if (f.file.find("export_test.cpp") != std::string::npos && f.line == line) return true;
    }
    return false;
  };
  EXPECT_TRUE(names_line(in_place)) << in_place->meta().stack_trace.str();
  EXPECT_TRUE(names_line(functional)) << functional->meta().stack_trace.str();
}

TEST(Export, ViewsBecomeCopies) {
  GraphModule gm = export_program([](IValues in) {
    at::Tensor x = in[0].toTensor();
    return c10::IValue(x.t().contiguous().view({-1}) + x.transpose(0, 1).reshape({-1}));
  }, {at::randn({2, 3})});
  size_t copies = 0;
  for (const Node* n : gm.graph()) {
    copies += n->target().find("_copy") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(copies, 2u) << gm.str();
  EXPECT_TRUE(is_functional(gm.graph()));
}

// A reshape that can view its argument decomposes to _reshape_alias with the
// argument's strides. Export's re-trace computes views as *_copy operators,
// which return contiguous tensors, where those strides read the wrong
// elements or, for a window cut out of a larger tensor (Swin, MaxViT, MViT),
// past the end of the storage: a crash inside LibTorch 1.13.
// Note [Reshape aliases are recorded as views]
TEST(Export, ReshapeOfAViewIsRecordedAsAView) {
  auto program = [](IValues in) {
    at::Tensor x = in[0].toTensor();
    at::Tensor permuted = x.permute({0, 2, 1, 3}).reshape({2, 2, 2, 3, 5});  // splits a strided dim
    at::Tensor window = in[1].toTensor().slice(1, 0, 6).slice(2, 0, 6).reshape({2, 3, 2, 6, 64});
    return c10::IValue(c10::ivalue::Tuple::create({permuted * 2, window + 1}));
  };
  IValues inputs = {at::randn({2, 3, 4, 5}), at::randn({2, 100, 100, 64})};
  GraphModule traced = trace(program, inputs);
  for (const Node* n : traced.graph()) EXPECT_NE(n->target(), "aten::_reshape_alias") << traced.str();

  GraphModule gm = export_program(program, inputs);
  EXPECT_TRUE(is_functional(gm.graph()));
  c10::IValue expected = program(inputs);
  EXPECT_EQ(examples::max_abs_diff(Interpreter(gm).run(inputs), expected), 0) << gm.str();
  EXPECT_EQ(examples::max_abs_diff(Interpreter(traced).run(inputs), expected), 0);
}

// Autograd's derivative of a multiplication by a number multiplies by a
// tensor made from it and passed through aten::lift_fresh, which
// functionalization asserts never sees a wrapped tensor (a training step's
// backward, say).
TEST(Export, TensorsMadeFromNumbersAreConstants) {
  auto program = [](IValues in) {
    at::AutoGradMode grad(true);
    at::Tensor w = at::ones({3}).requires_grad_();
    at::Tensor y = (in[0].toTensor() * w * 0.5).sum();
    return c10::IValue(torch::autograd::grad({y}, {w})[0]);
  };
  IValues inputs = {at::randn({3})};
  GraphModule traced = trace(program, inputs);
  bool lifted = false;
  for (const Node* n : traced.graph()) lifted = lifted || n->target() == "aten::lift_fresh";
  ASSERT_TRUE(lifted) << traced.str();
  GraphModule gm = export_program(program, inputs);
  EXPECT_TRUE(is_functional(gm.graph())) << gm.str();
  EXPECT_EQ(examples::max_abs_diff(Interpreter(gm).run(inputs), program(inputs)), 0);
}

TEST(Export, PreservedOperatorsStayWholeUnderInferenceMode) {
  auto program = [](IValues in) {
    return c10::IValue(at::layer_norm(at::linear(in[0].toTensor(), in[1].toTensor()), {4}));
  };
  TraceOptions options;
  options.inference_mode = true;
  GraphModule gm = export_program(program, {at::randn({2, 3}), at::randn({4, 3})}, options);
  bool linear = false, layer_norm = false;
  for (const Node* n : gm.graph()) {
    linear = linear || n->target() == "aten::linear";
    layer_norm = layer_norm || n->target() == "aten::layer_norm";
  }
  EXPECT_TRUE(linear && layer_norm) << gm.str();
}

// --- The checker ------------------------------------------------------------

// Note [Writes export cannot express]
TEST(Export, InPlaceChangesOfAnInputsShapeOrMemoryAreRefused) {
  std::vector<std::pair<std::string, std::function<at::Tensor(at::Tensor)>>> cases = {
      {"aten::t_", [](at::Tensor a) { return a.t_() * 1; }},
      {"aten::unsqueeze_", [](at::Tensor a) { return a.unsqueeze_(0) * 1; }},
      {"aten::resize_", [](at::Tensor a) { return a.resize_({6}) * 1; }},
      {"aten::set_.source_Tensor", [](at::Tensor a) { return a.set_(at::zeros({3})) * 1; }},
  };
  for (const auto& [op, body] : cases) {
    std::string message;
    try {
      export_program([&](IValues in) { return c10::IValue(body(in[0].toTensor())); },
                     {at::randn({2, 3})});
    } catch (const TraceError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("(" + op + ")"), std::string::npos) << op << ": " << message;
    EXPECT_NE(message.find("graph input %ph_0"), std::string::npos) << message;
    EXPECT_NE(message.find("export_test.cpp"), std::string::npos) << message;  // the line
  }
  // trace() with allow_input_mutation records the operator itself.
  TraceOptions mutable_inputs;
  mutable_inputs.allow_input_mutation = true;
  GraphModule gm = trace([](IValues in) { return c10::IValue(in[0].toTensor().t_() * 1); },
                         {at::randn({2, 3})}, mutable_inputs);
  at::Tensor a = at::randn({2, 3});
  at::Tensor expected = a.t() * 1;
  at::Tensor out = Interpreter(gm).run({a}).toTensor();
  EXPECT_TRUE(at::equal(out, expected));
  EXPECT_EQ(a.sizes(), c10::IntArrayRef({3, 2}));
}

TEST(Export, ResizeOfAnIntermediateIsRefusedNamingIt) {
  std::string message;
  try {
    export_program([](IValues in) { return c10::IValue(in[0].toTensor().clone().resize_({25, 5})); },
                   {at::randn({5, 5, 5})});
  } catch (const TraceError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("(aten::resize_) resizes %clone in place (f32[5, 5, 5] to f32[25, 5])"),
            std::string::npos) << message;
}

TEST(Export, WritesThroughAViewOfAnInputReachTheInput) {
  auto program = [](IValues in) {
    at::Tensor a = in[0].toTensor();
    a.select(0, 0).add_(1);
    return c10::IValue(a);
  };
  GraphModule gm = export_program(program, {at::randn({2, 3})});
  EXPECT_EQ(find_mutation_or_view(gm.graph()), std::nullopt) << gm.str();
  at::Tensor a = at::randn({2, 3});
  at::Tensor eager = a.clone();
  program({eager});
  at::Tensor out = Interpreter(gm).run({a}).toTensor();
  EXPECT_TRUE(at::equal(out, eager));
  EXPECT_TRUE(at::equal(a, eager));
}

TEST(Export, OutArgumentsIntoInputsAreRefusedWhenAsked) {
  auto program = [](IValues in) {
    at::Tensor a = in[0].toTensor();
    return c10::IValue(at::add_out(a, a, in[1].toTensor()));
  };
  // export: an input write, given back through the signature.
  GraphModule gm = export_program(program, {at::randn({3}), at::randn({3})});
  at::Tensor a = at::ones({3});
  Interpreter(gm).run({a, at::ones({3})});
  EXPECT_TRUE(at::equal(a, at::full({3}, 2.0)));
  // dispatch_trace's inputs: immutable to out= arguments.
  TraceOptions upstream;
  upstream.refuse_out_into_inputs = true;
  std::string message;
  try {
    export_program(program, {at::randn({3}), at::randn({3})}, upstream);
  } catch (const TraceError& e) {
    message = e.what();
  }
  EXPECT_EQ(message.rfind("Immutable tensor `out` is potentially getting modified by aten::add.out", 0),
            0u) << message;
}

TEST(IsFunctional, FindsMutationsViewsAndHiddenWrites) {
  {
    Graph g;
    Node* x = g.placeholder("x");
    Node* c = g.call_function("aten::clone", {x});
    g.call_function("aten::add_.Scalar", {c, 1});
    g.output({c});
    EXPECT_FALSE(is_functional(g));
    EXPECT_EQ(find_mutation_or_view(g), "%add_ (aten::add_.Scalar) writes its argument 'self'");
  }
  {
    Graph g;
    Node* x = g.placeholder("x");
    Node* v = g.call_function("aten::view", {x, ArgumentList{-1}});
    g.output({v});
    EXPECT_FALSE(is_functional(g));
    EXPECT_EQ(find_mutation_or_view(g), "%view (aten::view) returns a view of its argument");
  }
  {
    Graph g;
    Node* x = g.placeholder("x");
    Node* m = g.placeholder("m");
    Node* v = g.placeholder("v");
    Node* bn = g.call_function("aten::native_batch_norm",
                               {x, Argument(), Argument(), m, v, true, 0.1, 1e-5});
    g.output({g.getitem(bn, 0)});
    EXPECT_FALSE(is_functional(g));
    EXPECT_EQ(find_mutation_or_view(g), "%native_batch_norm (aten::native_batch_norm) updates running statistics in place");
  }
  {
    Graph g;
    Node* x = g.placeholder("x");
    Node* v = g.call_function("aten::view_copy", {x, ArgumentList{-1}});
    g.output({g.call_function("aten::relu", {v})});
    EXPECT_TRUE(is_functional(g));
  }
}

TEST(Signature, LintChecksOutputSpecs) {
  examples::Example e = examples::make("cnn_bn_train");
  GraphModule gm = export_example(e);
  gm.lint();
  GraphModule bad = gm.clone();
  bad.output_specs[2].target = "no.such.buffer";
  EXPECT_THROW(bad.lint(), LintError);
  GraphModule bad2 = gm.clone();
  std::swap(bad2.output_specs[0], bad2.output_specs[1]);
  try {
    bad2.lint();
    FAIL();
  } catch (const LintError& err) {
    EXPECT_NE(std::string(err.what()).find("comes after a mutation output"), std::string::npos);
  }
}

}  // namespace
}  // namespace torchcap
