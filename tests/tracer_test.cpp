// The tracer: the example zoo end to end, immutability, the parameter cache,
// the preserve policy, stack traces, threads, and bad input.
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/printer.h>
#include <torchcap/serialize.h>
#include <torchcap/tracer.h>

#include "counting_allocator.h"
#include "golden.h"
#include "trace/tracing_tensor.h"
#include "zoo.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

namespace torchcap {
namespace {

using IValues = std::vector<c10::IValue>;

size_t count_target(const GraphModule& gm, const std::string& target) {
  size_t n = 0;
  for (const Node* node : gm.graph()) n += node->target() == target ? 1 : 0;
  return n;
}

std::string trace_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const TraceError& e) {
    return e.what();
  } catch (const TypeError& e) {
    return std::string("TypeError: ") + e.what();
  }
  return "";
}

// --- The zoo --------------------------------------------------------------

class Zoo : public ::testing::TestWithParam<std::string> {};

TEST_P(Zoo, TracesLintsAndReRunsLikeEager) {
  const std::string name = GetParam();
  examples::Example traced = examples::make(name);
  examples::Example eager = examples::make(name);  // same weights, untouched by the trace

  auto [gm, trace_outputs] = examples::trace_with_outputs(traced);
  gm.lint();
  // What the trace computed is what the program computes.
  EXPECT_LE(examples::max_abs_diff(trace_outputs, eager.forward(eager.make_inputs(0))), 1e-5);

  // Re-running the graph on the trace's inputs gives the trace's result.
  // (interpreter_test runs every graph on fresh inputs.)
  c10::IValue again = Interpreter(gm).run(traced.make_inputs(0));
  EXPECT_LE(examples::max_abs_diff(again, trace_outputs), 1e-5) << name;
}

// Tracing runs the program for real and holds no value longer than the
// program does: a trace allocates what an eager run allocates, and holds as
// much at its peak, plus the copies the graph keeps of the buffers the
// program writes (Note [Attributes written during a trace]).
TEST_P(Zoo, HoldsNoValueLongerThanTheProgram) {
  examples::Example e = examples::make(GetParam());
  {
    // Kernels allocate caches on their first runs.
    at::NoGradGuard no_grad;
    e.forward(e.make_inputs(0));
  }
  examples::trace(e);
  examples::LiveBytesAllocator counting;
  {
    at::NoGradGuard no_grad;
    e.forward(e.make_inputs(0));
  }
  const examples::LiveBytesAllocator::Usage eager = counting.take();
  GraphModule gm = examples::trace(e);
  const examples::LiveBytesAllocator::Usage traced = counting.take();

  size_t copies = 0, copied_bytes = 0;
  for (const auto& [name, buffer] : examples::named_buffers(e)) {
    if (!gm.has_attribute(name)) continue;
    const at::Tensor& held = gm.attribute(name).value;
    if (!held.is_same(buffer)) {
      ++copies;
      copied_bytes += held.nbytes();
    }
  }
  EXPECT_GT(eager.allocations, 0u);
  EXPECT_EQ(traced.allocations, eager.allocations + copies);
  EXPECT_GE(traced.peak_bytes, eager.peak_bytes);
  EXPECT_LE(traced.peak_bytes, eager.peak_bytes + copied_bytes);
}

INSTANTIATE_TEST_SUITE_P(Examples, Zoo, ::testing::ValuesIn(examples::names()),
                         [](const auto& info) { return info.param; });

class SmallGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(SmallGraphs, MatchGolden) {
  examples::Example e = examples::make(GetParam());
  GraphModule gm = examples::trace(e);
  testing::expect_golden("trace_" + GetParam() + ".txt", gm.str());
}

INSTANTIATE_TEST_SUITE_P(Examples, SmallGraphs,
                         ::testing::Values("mlp", "cnn_bn_train", "tied_weights", "inplace_ops",
                                           "multi_output", "factories", "nested_io"),
                         [](const auto& info) { return info.param; });

// --- Immutability and in-place operators ------------------------------------

TEST(Immutability, InPlaceWriteToAnInputIsRefusedBeforeItRuns) {
  at::Tensor x = at::ones({2, 2});
  std::string message = trace_error([&] {
    trace([](IValues in) { return c10::IValue(in[0].toTensor().add_(1)); }, {x});
  });
  EXPECT_EQ(message,
            "Immutable tensor `self` is potentially getting modified by aten::add_.Scalar(Tensor(a!) "
            "self, Scalar other, Scalar alpha=1) -> Tensor(a!): it is graph input %ph_0, which a "
            "graph may not modify. Clone it first, or let the program write to its inputs "
            "(TraceOptions::allow_input_mutation, or torchcap::export).");
  EXPECT_TRUE(at::equal(x, at::ones({2, 2})));  // untouched
}

// What the tracer knows of an operator (which arguments it writes) is looked
// up by its schema's address (Note [Operator facts, looked up once]): an
// operator removed and defined again with another schema, which may well sit
// where the old one did, is traced by the new one.
// Boxed kernels and calls: LibTorch 1.13 keeps a removed operator's C++
// signature and would refuse typed kernels of the new one.
void doubled(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  at::Tensor x = torch::jit::pop(*stack).toTensor();
  torch::jit::push(*stack, x * 2);
}
void doubled_in_place(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  at::Tensor x = torch::jit::pop(*stack).toTensor();
  x.mul_(2);
  torch::jit::push(*stack, x);
}
c10::IValue call_scale(IValues in) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("torchcap_redefined::scale", "");
  torch::jit::Stack stack{in[0]};
  op.callBoxed(&stack);
  return stack.back();
}

TEST(Immutability, AnOperatorDefinedAgainIsTracedByItsNewSchema) {
  {
    torch::Library lib(torch::Library::DEF, "torchcap_redefined", c10::nullopt, __FILE__, __LINE__);
    lib.def("scale(Tensor x) -> Tensor",
            torch::dispatch(c10::DispatchKey::CPU, torch::CppFunction::makeFromBoxedFunction<&doubled>()));
    GraphModule gm = trace(call_scale, {at::ones({2})});
    EXPECT_EQ(count_target(gm, "torchcap_redefined::scale"), 1u);
    EXPECT_TRUE(at::equal(Interpreter(gm).run({at::ones({2})}).toTensor(), at::full({2}, 2.0)));
  }
  torch::Library lib(torch::Library::DEF, "torchcap_redefined", c10::nullopt, __FILE__, __LINE__);
  lib.def("scale(Tensor(a!) x) -> Tensor(a!)",
          torch::dispatch(c10::DispatchKey::CPU,
                          torch::CppFunction::makeFromBoxedFunction<&doubled_in_place>()));
  at::Tensor x = at::ones({2});
  std::string message = trace_error([&] { trace(call_scale, {x}); });
  EXPECT_EQ(message,
            "Immutable tensor `x` is potentially getting modified by torchcap_redefined::scale("
            "Tensor(a!) x) -> Tensor(a!): it is graph input %ph_0, which a graph may not modify. "
            "Clone it first, or let the program write to its inputs "
            "(TraceOptions::allow_input_mutation, or torchcap::export).");
  EXPECT_TRUE(at::equal(x, at::ones({2})));
}

TEST(Immutability, OutArgumentThatIsAnInputIsRefused) {
  at::Tensor x = at::ones({3});
  at::Tensor out = at::zeros({3});
  std::string message = trace_error([&] {
    trace([](IValues in) {
      at::Tensor o = in[1].toTensor();
      at::neg_out(o, in[0].toTensor());
      return c10::IValue(o);
    }, {x, out});
  });
  EXPECT_EQ(message,
            "Immutable tensor `out` is potentially getting modified by aten::neg.out(Tensor self, *, "
            "Tensor(a!) out) -> Tensor(a!): it is graph input %ph_1, which a graph may not modify. "
            "Clone it first, or let the program write to its inputs "
            "(TraceOptions::allow_input_mutation, or torchcap::export).");
  EXPECT_TRUE(at::equal(out, at::zeros({3})));
}

TEST(Immutability, WriteThroughAViewOfAnInputIsRefused) {
  at::Tensor x = at::ones({2, 3});
  std::string message = trace_error([&] {
    trace([](IValues in) { return c10::IValue(in[0].toTensor().view({-1}).mul_(2)); }, {x});
  });
  EXPECT_EQ(message,
            "Immutable tensor `self` is potentially getting modified by aten::mul_.Scalar(Tensor(a!) "
            "self, Scalar other) -> Tensor(a!): it is %view, a view of a graph input, which a graph "
            "may not modify. Clone it first, or let the program write to its inputs "
            "(TraceOptions::allow_input_mutation, or torchcap::export).");
  EXPECT_TRUE(at::equal(x, at::ones({2, 3})));
}

TEST(Immutability, BatchNormRunningStatsThatAreInputsAreRefused) {
  at::Tensor x = at::randn({4, 3});
  at::Tensor mean = at::zeros({3});
  at::Tensor var = at::ones({3});
  std::string message = trace_error([&] {
    trace([](IValues in) {
      return c10::IValue(at::batch_norm(in[0].toTensor(), {}, {}, in[1].toTensor(),
                                        in[2].toTensor(), /*training=*/true, 0.1, 1e-5, false));
    }, {x, mean, var});
  });
  EXPECT_NE(message.find("Immutable tensor `running_mean`"), std::string::npos) << message;
  EXPECT_TRUE(at::equal(mean, at::zeros({3})));
}

TEST(InPlace, WritesToIntermediatesRebindTheirProxies) {
  GraphModule gm = trace([](IValues in) {
    at::Tensor y = in[0].toTensor().clone();
    y.add_(1);
    y.mul_(3);
    return c10::IValue(y.relu());
  }, {at::randn({4})});
  Node* add = gm.graph().find("add_");
  Node* mul = gm.graph().find("mul_");
  Node* relu = gm.graph().find("relu");
  ASSERT_TRUE(add && mul && relu);
  EXPECT_EQ(mul->args()[0].to_node(), add);   // mul_ reads add_'s result
  EXPECT_EQ(relu->args()[0].to_node(), mul);  // relu reads mul_'s result
  EXPECT_EQ(gm.graph().output_node()->args()[0].to_list()[0].to_node(), relu);
}

TEST(InPlace, ReturnsTheSameTensorObject) {
  trace([](IValues in) {
    at::Tensor y = in[0].toTensor().clone();
    at::Tensor& r = y.add_(1);
    EXPECT_TRUE(r.is_same(y));
    EXPECT_TRUE(is_tracing_tensor(y));
    return c10::IValue(y);
  }, {at::randn({2})});
}

TEST(InPlace, OutVariantRebindsItsOutArgument) {
  GraphModule gm = trace([](IValues in) {
    at::Tensor buf = at::empty({3});
    at::sin_out(buf, in[0].toTensor());
    return c10::IValue(buf * 2);
  }, {at::randn({3})});
  Node* sin = gm.graph().find("sin");
  Node* mul = gm.graph().find("mul");
  ASSERT_TRUE(sin && mul);
  EXPECT_EQ(sin->target(), "aten::sin.out");
  EXPECT_EQ(mul->args()[0].to_node(), sin);
}

TEST(Arguments, TensorListsAndOptionalTensorListsAreUnwrappedAndRecorded) {
  auto program = [](IValues in) {
    at::Tensor x = in[0].toTensor();
    at::Tensor idx = in[1].toTensor();
    at::Tensor picked = x.index({idx});                      // Tensor?[] indices
    at::Tensor joined = at::cat({picked, x.slice(0, 0, 1)});  // Tensor[]
    return c10::IValue(at::stack({joined, joined * 2}));
  };
  IValues in = {at::randn({4, 3}), at::tensor({2, 0}, at::kLong)};
  GraphModule gm = trace(program, in);
  gm.lint();
  EXPECT_EQ(count_target(gm, "aten::index.Tensor"), 1u);
  EXPECT_EQ(count_target(gm, "aten::cat"), 1u);
  EXPECT_EQ(count_target(gm, "aten::stack"), 1u);
  IValues fresh = {at::randn({4, 3}), at::tensor({3, 1}, at::kLong)};
  EXPECT_LE(examples::max_abs_diff(Interpreter(gm).run(fresh), program(fresh)), 1e-6);
}

// --- Parameters and constants -----------------------------------------------

TEST(ParameterCache, TiedWeightsAreOneAttribute) {
  examples::Example e = examples::make("tied_weights");
  GraphModule gm = examples::trace(e);
  EXPECT_EQ(count_target(gm, "embed.weight"), 1u);
  EXPECT_EQ(count_target(gm, "proj.weight"), 0u);  // the same tensor: first name wins
  EXPECT_TRUE(gm.has_attribute("embed.weight"));
  EXPECT_FALSE(gm.has_attribute("proj.weight"));
}

TEST(ParameterCache, OneParameterUsedThreeTimesIsOneGetAttr) {
  examples::Example e = examples::make("tied_weights");
  GraphModule gm = examples::trace(e);
  EXPECT_EQ(count_target(gm, "shift"), 1u);
  Node* shift = gm.graph().find("shift");
  ASSERT_NE(shift, nullptr);
  EXPECT_EQ(shift->users().size(), 3u);
  EXPECT_EQ(gm.attribute("shift").kind, AttributeKind::Parameter);
}

TEST(ParameterCache, AttributesOnWrittenMemoryAliasInTheGraphAsInTheProgram) {
  // Three buffers on one storage: the program reads `rows`, writes `counts`
  // in place, then reads `cols` for the first time. The run changes the
  // module's buffers; the graph keeps them as they were before the trace,
  // still on one memory, so that each run of the graph does what a run of
  // the program did, the writes seen through the views (with one copy per
  // attribute the second sum read the old values: 15 where the program
  // gave 21).
  at::Tensor counts = at::arange(6, at::kFloat);
  at::Tensor rows = counts.view({2, 3});
  at::Tensor cols = counts.view({3, 2});
  const at::Tensor before = counts.clone();
  ModuleState state;
  state.buffers = {{"counts", counts}, {"rows", rows}, {"cols", cols}};
  TracedFunction program = [&](IValues in) {
    at::Tensor y = rows * in[0].toTensor();
    counts.add_(1);
    return c10::IValue(std::make_tuple(y, rows.sum(), cols.sum()));
  };
  GraphModule gm = trace(state, program, {at::full({3}, 2.0)});
  EXPECT_TRUE(at::equal(counts, before + 1));
  EXPECT_TRUE(at::equal(gm.attribute("counts").value, before));
  EXPECT_TRUE(at::equal(gm.attribute("rows").value, before.view({2, 3})));
  EXPECT_TRUE(at::equal(gm.attribute("cols").value, before.view({3, 2})));

  // Two runs, each doing what one run of the program does. (The file format
  // stores each attribute's memory on its own, and save refuses this module:
  // Save.AttributesThatShareMemoryAreRefusedWhenTheGraphWritesOne.)
  Interpreter interpreter(gm);
  for (int run = 1; run <= 2; ++run) {
    auto out = interpreter.run({at::full({3}, 2.0)}).toTuple();
    const float sum = (before + run).sum().item<float>();
    EXPECT_TRUE(at::equal(out->elements()[0].toTensor(), (before + run - 1).view({2, 3}) * 2));
    EXPECT_EQ(out->elements()[1].toTensor().item<float>(), sum) << "run " << run;
    EXPECT_EQ(out->elements()[2].toTensor().item<float>(), sum) << "run " << run;
  }
}

TEST(Constants, AreLiftedOnceByIdentityAndKeptAlive) {
  GraphModule gm;
  {
    at::Tensor c = at::arange(4, at::kFloat);
    at::Tensor d = at::arange(4, at::kFloat);  // equal values, another tensor
    gm = trace([&](IValues in) {
      at::Tensor x = in[0].toTensor();
      return c10::IValue(x * c + c + d);
    }, {at::ones({4})});
  }  // c and d go out of scope: the GraphModule keeps them
  EXPECT_EQ(count_target(gm, "_tensor_constant0"), 1u);
  EXPECT_EQ(count_target(gm, "_tensor_constant1"), 1u);
  EXPECT_EQ(gm.attributes().size(), 2u);
  EXPECT_EQ(gm.attribute("_tensor_constant0").kind, AttributeKind::Constant);
  c10::IValue out = Interpreter(gm).run({at::full({4}, 2.0)});
  EXPECT_TRUE(at::allclose(out.toTensor(), at::arange(4, at::kFloat) * 4));
}

TEST(Constants, FactoriesInsideForwardAreRecorded) {
  GraphModule gm = trace([](IValues in) {
    return c10::IValue(in[0].toTensor() + at::ones({2}) + at::zeros({2}).t());
  }, {at::ones({2})});
  EXPECT_EQ(count_target(gm, "aten::ones"), 1u);
  EXPECT_EQ(count_target(gm, "aten::zeros"), 1u);
  EXPECT_EQ(count_target(gm, "aten::t"), 1u);
  EXPECT_TRUE(gm.attributes().empty());
}

// Note [Python numbers as tensors]: what Python's `x + 0.5` calls, add.Tensor
// with a wrapped number, records the number, not a tensor constant; the
// graph computes eager's float32 on an int64 input when run, and after a
// file (version 1.6), where a float64 constant would compute float64.
TEST(Constants, WrappedNumbersAreRecordedAsNumbers) {
  auto program = [](IValues in) {
    at::Tensor x = in[0].toTensor();
    return c10::IValue(at::add(x, at::native::wrapped_scalar_tensor(0.5)) *
                       at::native::wrapped_scalar_tensor(int64_t{3}));
  };
  const at::Tensor x = at::arange(4);
  const at::Tensor eager = program({x}).toTensor();
  ASSERT_EQ(eager.scalar_type(), at::kFloat);
  GraphModule gm = trace(program, {x});
  EXPECT_TRUE(gm.attributes().empty());
  const Node* add = nullptr;
  for (const Node* n : gm.graph()) {
    if (n->target() == "aten::add.Tensor") add = n;
  }
  ASSERT_NE(add, nullptr);
  ASSERT_TRUE(add->args()[1].is_double());
  EXPECT_EQ(add->args()[1].to_double(), 0.5);
  EXPECT_TRUE(at::equal(Interpreter(gm).run({x}).toTensor(), eager));
  const std::string file = save_to_string(gm);
  EXPECT_EQ(file[10], 6);  // the minor version: numbers for tensor parameters
  GraphModule loaded = load_from_buffer(file.data(), file.size());
  EXPECT_TRUE(at::equal(Interpreter(loaded).run({x}).toTensor(), eager));
}

// --- Decomposition control ---------------------------------------------------

c10::IValue linear_and_layer_norm(IValues in) {
  at::Tensor x = in[0].toTensor();
  at::Tensor y = at::linear(x, in[1].toTensor(), in[2].toTensor());
  return at::layer_norm(y, {4});
}

IValues linear_inputs() { return {at::randn({3, 5}), at::randn({4, 5}), at::randn({4})}; }

TEST(Preserve, InferenceModeKeepsLinearAndLayerNormWhole) {
  TraceOptions options;
  options.inference_mode = true;
  GraphModule gm = trace(linear_and_layer_norm, linear_inputs(), options);
  EXPECT_EQ(count_target(gm, "aten::linear"), 1u);
  EXPECT_EQ(count_target(gm, "aten::layer_norm"), 1u);
  EXPECT_EQ(count_target(gm, "aten::addmm"), 0u);
  EXPECT_EQ(count_target(gm, "aten::native_layer_norm"), 0u);
  gm.lint();
}

TEST(Preserve, WithoutInferenceModeTheyDecompose) {
  GraphModule gm = trace(linear_and_layer_norm, linear_inputs());
  EXPECT_EQ(count_target(gm, "aten::linear"), 0u);
  EXPECT_EQ(count_target(gm, "aten::layer_norm"), 0u);
  EXPECT_EQ(count_target(gm, "aten::addmm"), 1u);
  EXPECT_EQ(count_target(gm, "aten::native_layer_norm"), 1u);
}

TEST(Preserve, AnEmptySetDecomposesUnderInferenceModeToo) {
  TraceOptions options;
  options.inference_mode = true;
  options.preserve = std::vector<std::string>{};
  GraphModule gm = trace(linear_and_layer_norm, linear_inputs(), options);
  EXPECT_EQ(count_target(gm, "aten::linear"), 0u);
  EXPECT_EQ(count_target(gm, "aten::layer_norm"), 0u);
  EXPECT_EQ(count_target(gm, "aten::native_layer_norm"), 1u);
  // And the graph computes the same thing.
  IValues in = linear_inputs();
  EXPECT_LE(examples::max_abs_diff(Interpreter(gm).run(in), linear_and_layer_norm(in)), 1e-5);
}

TEST(Preserve, ACustomSetUnderAnOuterInferenceMode) {
  TraceOptions options;
  options.preserve = std::vector<std::string>{"aten::layer_norm"};
  c10::InferenceMode guard;
  GraphModule gm = trace(linear_and_layer_norm, linear_inputs(), options);
  EXPECT_EQ(count_target(gm, "aten::linear"), 0u);
  EXPECT_EQ(count_target(gm, "aten::layer_norm"), 1u);
}

TEST(Preserve, UnknownOperatorsAreRejected) {
  TraceOptions options;
  options.preserve = std::vector<std::string>{"aten::lnear"};
  EXPECT_EQ(trace_error([&] { trace(linear_and_layer_norm, linear_inputs(), options); }),
            "TraceOptions::preserve: 'aten::lnear' is not a registered operator (expected e.g. "
            "aten::linear)");
}

// --- Stack traces ------------------------------------------------------------

TEST(StackTraces, NameTheUsersFileAndLine) {
  int line = 0;
  GraphModule gm = trace([&line](IValues in) {
    line = __LINE__ + 1;
    at::Tensor y = at::sigmoid(in[0].toTensor());
    return c10::IValue(y);
  }, {at::randn({2})});
  Node* sigmoid = gm.graph().find("sigmoid");
  ASSERT_NE(sigmoid, nullptr);
  const auto& frames = sigmoid->meta().stack_trace.frames();
  ASSERT_FALSE(frames.empty());
  bool found = false;
  for (const SourceFrame& f : frames) {
    found = found || (f.file.find("tracer_test.cpp") != std::string::npos && f.line == line);
    EXPECT_EQ(f.file.find("/src/"), std::string::npos) << f.file;
    EXPECT_EQ(f.file.find("include/torchcap"), std::string::npos) << f.file;
    EXPECT_EQ(f.function.rfind("torchcap::detail", 0), std::string::npos) << f.function;
    EXPECT_EQ(f.function.rfind("torchcap::trace", 0), std::string::npos) << f.function;
  }
  EXPECT_TRUE(found) << sigmoid->meta().stack_trace.str();
  EXPECT_EQ(frames.front().file.find("tracer_test.cpp") != std::string::npos, true);
}

TEST(StackTraces, NameTheModelsSourceInsideModules) {
  examples::Example e = examples::make("mlp");
  GraphModule gm = examples::trace(e);
  Node* relu = gm.graph().find("relu");
  ASSERT_NE(relu, nullptr);
  ASSERT_FALSE(relu->meta().stack_trace.frames().empty());
  EXPECT_NE(relu->meta().stack_trace.frames().front().file.find("models.cpp"), std::string::npos)
      << relu->meta().stack_trace.str();
}

// Two functions alike but for their lines, called in turn from one loop: the
// stack of one lies where the other's does, with other return addresses in
// it. A stack seen before is recognized by its return addresses (Note
// [Stacks recognized by their return address slots]); neither function's
// nodes may take the other's.
int sigmoid_here_line = 0;
int sigmoid_there_line = 0;
__attribute__((noinline)) at::Tensor sigmoid_here(const at::Tensor& x) {
  sigmoid_here_line = __LINE__ + 1;
  at::Tensor y = at::sigmoid(x);
  return y;
}
__attribute__((noinline)) at::Tensor sigmoid_there(const at::Tensor& x) {
  sigmoid_there_line = __LINE__ + 1;
  at::Tensor y = at::sigmoid(x);
  return y;
}

// The nodes' innermost frames, "function:line", in graph order.
std::vector<std::string> sigmoid_sources() {
  constexpr int kRounds = 6;
  GraphModule gm = trace([](IValues in) {
    at::Tensor x = in[0].toTensor();
    for (int i = 0; i < kRounds; ++i) x = sigmoid_there(sigmoid_here(x));
    return c10::IValue(x);
  }, {at::randn({2})});
  std::vector<std::string> sources;
  for (const Node* n : gm.graph()) {
    if (n->target() != "aten::sigmoid") continue;
    const auto& frames = n->meta().stack_trace.frames();
    sources.push_back(frames.empty() ? "none"
                                     : frames.front().function + ":" +
                                           std::to_string(frames.front().line));
  }
  return sources;
}

TEST(StackTraces, StacksAtTheSameDepthAreToldApartEveryTime) {
  // On the main thread, and on another, whose stack's bounds are found
  // another way; each learns its stacks anew.
  std::vector<std::string> on_main = sigmoid_sources();
  std::vector<std::string> on_thread;
  std::thread([&] { on_thread = sigmoid_sources(); }).join();
  for (const auto* sources : {&on_main, &on_thread}) {
    ASSERT_EQ(sources->size(), 12u);
    for (size_t i = 0; i < sources->size(); ++i) {
      const bool here = i % 2 == 0;
      const std::string& s = (*sources)[i];
      EXPECT_NE(s.find(here ? "sigmoid_here" : "sigmoid_there"), std::string::npos) << i << ": " << s;
      EXPECT_EQ(s.substr(s.rfind(':') + 1),
                std::to_string(here ? sigmoid_here_line : sigmoid_there_line))
          << i << ": " << s;
    }
  }
}

// Twelve stacks at one depth, more than a few: one function calls an
// operator from twelve lines. (The store after each call keeps the compiler
// from merging the calls into one.)
int twelve_first_line = 0;
volatile int twelve_sink = 0;
__attribute__((noinline)) at::Tensor sigmoid_on_line(const at::Tensor& x, int k) {
  volatile int& sink = twelve_sink;
  at::Tensor y;
  twelve_first_line = __LINE__ + 2;
  switch (k) {
    case 0: y = at::sigmoid(x); sink = 0; break;
    case 1: y = at::sigmoid(x); sink = 1; break;
    case 2: y = at::sigmoid(x); sink = 2; break;
    case 3: y = at::sigmoid(x); sink = 3; break;
    case 4: y = at::sigmoid(x); sink = 4; break;
    case 5: y = at::sigmoid(x); sink = 5; break;
    case 6: y = at::sigmoid(x); sink = 6; break;
    case 7: y = at::sigmoid(x); sink = 7; break;
    case 8: y = at::sigmoid(x); sink = 8; break;
    case 9: y = at::sigmoid(x); sink = 9; break;
    case 10: y = at::sigmoid(x); sink = 10; break;
    case 11: y = at::sigmoid(x); sink = 11; break;
  }
  return y;
}

TEST(StackTraces, ManyStacksAtOneDepthAreToldApart) {
  // In turn, then out of turn (5 is prime to 12), several rounds each:
  // every node names the line that called its operator.
  std::vector<int> order;
  for (int round = 0; round < 4; ++round) {
    for (int k = 0; k < 12; ++k) order.push_back(k);
  }
  for (int round = 0; round < 4; ++round) {
    for (int k = 0; k < 12; ++k) order.push_back((k * 5 + round) % 12);
  }
  GraphModule gm = trace([&](IValues in) {
    at::Tensor x = in[0].toTensor();
    for (int k : order) x = sigmoid_on_line(x, k);
    return c10::IValue(x);
  }, {at::randn({2})});
  size_t i = 0;
  for (const Node* n : gm.graph()) {
    if (n->target() != "aten::sigmoid") continue;
    ASSERT_LT(i, order.size());
    const auto& frames = n->meta().stack_trace.frames();
    ASSERT_FALSE(frames.empty()) << i;
    EXPECT_NE(frames.front().function.find("sigmoid_on_line"), std::string::npos)
        << i << ": " << frames.front().function;
    EXPECT_EQ(frames.front().line, twelve_first_line + order[i]) << i;
    ++i;
  }
  EXPECT_EQ(i, order.size());
}

TEST(StackTraces, CanBeTurnedOff) {
  TraceOptions options;
  options.record_stack_traces = false;
  GraphModule gm = trace([](IValues in) { return c10::IValue(in[0].toTensor().exp()); },
                         {at::randn({2})}, options);
  EXPECT_TRUE(gm.graph().find("exp")->meta().stack_trace.empty());
}

// --- Threads -----------------------------------------------------------------

TEST(Threads, ConcurrentTracesMatchTracesAlone) {
  const std::vector<std::string> models = {"mlp", "cnn_bn_eval", "multi_output", "nested_io"};
  std::vector<std::string> alone;
  for (const std::string& m : models) {
    examples::Example e = examples::make(m);
    alone.push_back(examples::trace(e).str());
  }
  std::vector<examples::Example> instances;
  for (const std::string& m : models) instances.push_back(examples::make(m));
  std::vector<std::string> together(models.size());
  std::vector<std::string> errors(models.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < models.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        for (int round = 0; round < 3; ++round) together[i] = examples::trace(instances[i]).str();
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < models.size(); ++i) {
    EXPECT_EQ(errors[i], "") << models[i];
    EXPECT_EQ(together[i], alone[i]) << models[i];
  }
}

// --- Without a trace -----------------------------------------------------------

TEST(Wrappers, ComputeAndRecordNothingOutsideATrace) {
  at::Tensor kept;
  GraphModule gm = trace([&](IValues in) {
    at::Tensor y = in[0].toTensor() * 2;
    kept = y;
    return c10::IValue(y);
  }, {at::full({3}, 1.5)});
  size_t nodes = gm.graph().size();
  ASSERT_TRUE(is_tracing_tensor(kept));
  at::Tensor z = kept + 1;  // no trace active
  EXPECT_FALSE(is_tracing_tensor(z));
  EXPECT_TRUE(at::allclose(z, at::full({3}, 4.0)));
  kept.mul_(2);  // in place: the wrapper itself comes back
  EXPECT_TRUE(is_tracing_tensor(kept));
  EXPECT_TRUE(at::allclose(unwrap_tracing_tensor(kept), at::full({3}, 6.0)));
  EXPECT_EQ(gm.graph().size(), nodes);
  EXPECT_NE(describe_tensor(kept).find("TracedTensor(from another trace, f32[3]"), std::string::npos)
      << describe_tensor(kept);
}

TEST(Wrappers, PrintAsTracedTensorsWithTheirValue) {
  std::string text;
  trace([&](IValues in) {
    at::Tensor y = in[0].toTensor() + 1;
    text = describe_tensor(y);
    return c10::IValue(y);
  }, {at::zeros({2})});
  EXPECT_NE(text.find("TracedTensor(%add, f32[2], value="), std::string::npos) << text;
  EXPECT_NE(text.find(" 1\n 1\n"), std::string::npos - 1) << text;
}

TEST(Wrappers, StorageAndMetadataSettersThrow) {
  trace([](IValues in) {
    at::Tensor x = in[0].toTensor();
    EXPECT_EQ(x.sizes(), c10::IntArrayRef({2, 3}));
    EXPECT_EQ(x.strides(), c10::IntArrayRef({3, 1}));
    EXPECT_EQ(x.scalar_type(), at::kFloat);
    EXPECT_TRUE(x.is_contiguous());
    EXPECT_ANY_THROW(x.data_ptr());
    EXPECT_ANY_THROW(x.storage());
    EXPECT_ANY_THROW(x.unsafeGetTensorImpl()->set_size(0, 4));
    return c10::IValue(x.clone());
  }, {at::zeros({2, 3})});
}

TEST(Wrappers, UndefinedOutputsBecomeEmptyTensors) {
  GraphModule gm = trace([](IValues in) {
    at::Tensor x = in[0].toTensor();
    at::Tensor w = in[1].toTensor();
    auto grads = at::convolution_backward(at::ones({1, 1, 3, 3}), x, w, c10::nullopt, {1, 1},
                                          {0, 0}, {1, 1}, false, {0, 0}, 1, {true, false, false});
    EXPECT_TRUE(std::get<1>(grads).defined());
    EXPECT_EQ(std::get<1>(grads).numel(), 0);
    return c10::IValue(std::get<0>(grads));
  }, {at::randn({1, 1, 5, 5}), at::randn({1, 1, 3, 3})});
  gm.lint();
}

// --- Bad input -----------------------------------------------------------------

TEST(BadInput, UnsupportedInputTypes) {
  EXPECT_EQ(trace_error([] {
              trace([](IValues in) { return in[0]; }, {at::ones({1}), c10::IValue(c10::Device(c10::kCPU))});
            }),
            "TypeError: input[1]: unsupported value, a value of type Device; expected tensors, "
            "tuples, lists, dicts, None, or int/float/bool/str");
}

TEST(BadInput, NonTensorOutputsAreATypeError) {
  EXPECT_EQ(trace_error([] { trace([](IValues) { return c10::IValue(int64_t(3)); }, {at::ones({1})}); }),
            "TypeError: the traced function returned 3 among its outputs; outputs must be tensors "
            "or None, or tuples, lists and dicts of them");
}

TEST(BadInput, ExceptionsPropagateAndLeaveNothingBehind) {
  try {
    trace([](IValues in) -> c10::IValue {
      at::Tensor y = in[0].toTensor() + 1;
      throw std::runtime_error("model exploded at layer 3");
    }, {at::ones({2})});
    FAIL() << "expected the model's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "model exploded at layer 3");
  }
  // No trace is active any more: plain tensors compute normally and the next
  // trace works.
  at::Tensor plain = at::ones({2}) * 3;
  EXPECT_FALSE(is_tracing_tensor(plain));
  GraphModule gm = trace([](IValues in) { return c10::IValue(in[0].toTensor() - in[0].toTensor()); },
                         {at::ones({2})});
  EXPECT_EQ(count_target(gm, "aten::sub.Tensor"), 1u);
}

TEST(BadInput, WrapperFromAnotherTraceIsRefused) {
  at::Tensor leaked;
  trace([&](IValues in) {
    leaked = in[0].toTensor() * 2;
    return c10::IValue(leaked);
  }, {at::ones({2})});
  std::string message = trace_error([&] {
    trace([&](IValues in) { return c10::IValue(in[0].toTensor() + leaked); }, {at::ones({2})});
  });
  EXPECT_EQ(message,
            "argument 'other' of aten::add.Tensor is a traced tensor from another trace; a trace can "
            "only use its own inputs, values computed from them, and plain tensors");
  EXPECT_EQ(trace_error([&] { trace([](IValues in) { return in[0]; }, {leaked}); }),
            "input tensor 0 is a traced tensor of another trace; pass real tensors as inputs");
}

TEST(BadInput, MutationsTheGraphCannotExpress) {
  std::string message = trace_error([] {
    trace([](IValues in) {
      std::vector<at::Tensor> list = {in[0].toTensor().clone(), in[0].toTensor().clone()};
      at::_foreach_add_(list, 1.0);
      return c10::IValue(list[0]);
    }, {at::ones({2})});
  });
  EXPECT_EQ(message,
            "aten::_foreach_add_.Scalar writes to argument 'self' without returning it; a graph "
            "cannot express that mutation. Schema: aten::_foreach_add_.Scalar(Tensor(a!)[] self, "
            "Scalar scalar) -> ()");
}

TEST(BadInput, DataDependentValues) {
  std::string message = trace_error([] {
    trace([](IValues in) {
      double v = in[0].toTensor().sum().item<double>();
      return c10::IValue(in[0].toTensor() * v);
    }, {at::ones({2})});
  });
  EXPECT_EQ(message.rfind("aten::_local_scalar_dense reads a tensor's value into C++", 0), 0u) << message;
  TraceOptions allow;
  allow.allow_data_dependent_values = true;
  GraphModule gm = trace([](IValues in) {
    double v = in[0].toTensor().sum().item<double>();
    return c10::IValue(in[0].toTensor() * v);
  }, {at::ones({2})}, allow);
  gm.lint();
}

// Note [Values no input can change]: a value computed from sizes and
// literals only is a constant of the graph; reading it needs no permission.
TEST(DataDependence, ValuesNoInputCanChangeAreConstants) {
  auto program = [](IValues in) {
    const at::Tensor& x = in[0].toTensor();
    const double half = (at::tensor({static_cast<double>(x.size(0))}) / 2).item<double>();
    return c10::IValue(x * half);
  };
  GraphModule gm = trace(program, {at::ones({4})});
  EXPECT_EQ(count_target(gm, "aten::_local_scalar_dense"), 0u);
  EXPECT_TRUE(at::equal(Interpreter(gm).run({at::ones({4})}).toTensor(), at::full({4}, 2.0)));
}

// Note [Guards of values the program read]: allowed, a read of an input's
// value is baked in and checked on every run.
TEST(DataDependence, ReadsOfInputValuesAreGuarded) {
  TraceOptions allow;
  allow.allow_data_dependent_values = true;
  GraphModule gm = trace([](IValues in) {
    const at::Tensor& x = in[0].toTensor();
    return c10::IValue(x.sum().item<double>() > 0 ? x * 2 : x * 3);
  }, {at::ones({2})}, allow);
  EXPECT_EQ(count_target(gm, "torchcap::guard_value"), 1u);
  Interpreter interpreter(gm);
  EXPECT_TRUE(at::equal(interpreter.run({at::ones({2})}).toTensor(), at::full({2}, 2.0)));
  try {
    interpreter.run({-at::ones({2})});
    FAIL() << "a run that reads another value was not refused";
  } catch (const RuntimeError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("read a value out of a tensor that was 2 when it was traced and is -2 in this run"),
              std::string::npos)
        << message;
  }
}

// Note [Data-dependent values]: decided by each operator's registration, so
// every way of reading data into C++ is refused, not only .item().
TEST(BadInput, EveryDataDependentValueIsRefused) {
  auto traced = [](std::function<c10::IValue(const at::Tensor&)> body) {
    return trace_error([&] { trace([&](IValues in) { return body(in[0].toTensor()); }, {at::ones({2})}); });
  };
  std::string allclose = traced([](const at::Tensor& x) {
    return c10::IValue(x.allclose(x + 1e-9) ? x : -x);
  });
  EXPECT_EQ(allclose.rfind("aten::allclose reads a tensor's value into C++", 0), 0u) << allclose;
  std::string equal = traced([](const at::Tensor& x) { return c10::IValue(at::equal(x, x * 2) ? x : -x); });
  EXPECT_EQ(equal.rfind("aten::equal reads a tensor's value into C++", 0), 0u) << equal;
  std::string nonzero = traced([](const at::Tensor& x) { return c10::IValue(x.sum().is_nonzero() ? x : -x); });
  EXPECT_NE(nonzero.find("reads a tensor's value into C++"), std::string::npos) << nonzero;
  // Metadata is not data: sizes and dtypes asked of the dispatcher are fine.
  GraphModule gm = trace([](IValues in) {
    const at::Tensor& x = in[0].toTensor();
    bool same = x.is_same_size(x * 2);
    auto dtype = at::result_type(x, x.to(at::kDouble));
    return c10::IValue(same ? x.to(dtype) : x);
  }, {at::ones({2})});
  gm.lint();
}

// Note [Nested traces]: refused before anything runs; the outer trace,
// which catches the error, records nothing of the attempt.
TEST(BadInput, NestedTracesAreRefusedAndLeaveTheOuterGraphAlone) {
  std::string inner_error;
  GraphModule outer = trace([&](IValues in) {
    at::Tensor x = in[0].toTensor();
    try {
      trace([](IValues inner) { return c10::IValue(inner[0].toTensor() * 3); }, {x});
    } catch (const TraceError& e) {
      inner_error = e.what();
    }
    return c10::IValue(x + 1);
  }, {at::ones({2})});
  EXPECT_NE(inner_error.find("traces do not nest"), std::string::npos) << inner_error;
  EXPECT_EQ(outer.attributes().size(), 0u) << outer.str();
  size_t calls = 0;
  for (const Node* n : outer.graph()) calls += n->op() == OpCode::CallFunction ? 1 : 0;
  EXPECT_EQ(calls, 1u) << outer.str();  // the add, nothing of the inner attempt
}

// --- Silent wrong answers, closed as classes -------------------------------------

// Note [Traced tensors on other threads]: an operator run on another thread
// would be missing from the graph, its result baked in as a constant.
TEST(OtherThreads, OperatorsOnTracedTensorsThereAreRefused) {
  std::string message = trace_error([] {
    trace([](IValues in) {
      at::Tensor x = in[0].toTensor();
      at::Tensor y;
      std::exception_ptr failed;
      std::thread worker([&] {
        try {
          y = x.cos();
        } catch (...) {
          failed = std::current_exception();
        }
      });
      worker.join();
      if (failed) std::rethrow_exception(failed);
      return c10::IValue(y + 1);
    }, {at::zeros({3})});
  });
  EXPECT_NE(message.find("aten::cos was called on a traced tensor on a thread that is not tracing"),
            std::string::npos) << message;
}

TEST(OtherThreads, PausedTracesComputeAndEndedOnesComputeAnywhere) {
  at::Tensor kept;
  GraphModule gm = trace([&](IValues in) {
    at::Tensor x = in[0].toTensor();
    {
      PauseTracing paused;  // a computation on the side, on the tracing thread
      EXPECT_TRUE(at::allclose(unwrap_tracing_tensor(x * 2), at::full({2}, 2.0)));
    }
    kept = x + 1;
    return c10::IValue(kept);
  }, {at::ones({2})});
  EXPECT_EQ(count_target(gm, "aten::mul.Tensor"), 0u) << gm.str();
  at::Tensor elsewhere;
  std::thread([&] { elsewhere = kept * 3; }).join();  // the trace has ended
  EXPECT_TRUE(at::allclose(elsewhere, at::full({2}, 6.0)));
}

// Note [Shapes that depend on values]
TEST(DataDependentShapes, AreRefusedNamingTheOperatorAndTheLine) {
  auto refused = [](const std::function<at::Tensor(const at::Tensor&)>& body) {
    return trace_error([&] {
      trace([&](IValues in) { return c10::IValue(body(in[0].toTensor())); }, {at::randn({6})});
    });
  };
  std::vector<std::pair<std::string, std::function<at::Tensor(const at::Tensor&)>>> cases = {
      {"aten::nonzero", [](const at::Tensor& x) { return at::nonzero(x > 0); }},
      {"aten::masked_select", [](const at::Tensor& x) { return at::masked_select(x, x > 0); }},
      {"aten::index.Tensor", [](const at::Tensor& x) { return x.index({x > 0}); }},
      {"aten::_unique2", [](const at::Tensor& x) { return std::get<0>(at::_unique2(x.round())); }},
      {"aten::bincount", [](const at::Tensor& x) { return at::bincount(x.abs().mul(3).to(at::kLong)); }},
      {"aten::repeat_interleave.Tensor",
       [](const at::Tensor& x) { return at::repeat_interleave(x.abs().mul(2).to(at::kLong)); }},
  };
  for (const auto& [op, body] : cases) {
    std::string message = refused(body);
    EXPECT_EQ(message.rfind(op + " returns a tensor whose shape depends on tensor values", 0), 0u)
        << op << ": " << message;
    EXPECT_NE(message.find("tracer_test.cpp"), std::string::npos) << message;  // the line
  }
}

TEST(DataDependentShapes, FixedShapesOfTheSameOperatorsAreTraced) {
  GraphModule gm = trace([](IValues in) {
    at::Tensor x = in[0].toTensor();
    at::Tensor picked = x.index({at::tensor({0, 2}, at::kLong)});  // integer indices
    at::Tensor repeated = at::repeat_interleave(x, at::tensor({1, 2, 1, 1, 1, 1}), 0, 7);
    return c10::IValue(picked.sum() + repeated.sum());
  }, {at::randn({6})});
  gm.lint();
  at::Tensor y = at::randn({6});
  at::Tensor expected = y.index({at::tensor({0, 2}, at::kLong)}).sum() +
                        at::repeat_interleave(y, at::tensor({1, 2, 1, 1, 1, 1}), 0, 7).sum();
  EXPECT_TRUE(at::allclose(Interpreter(gm).run({y}).toTensor(), expected));
}

TEST(DataDependentShapes, AllowedTheGraphComputesTheSizeOnEveryRun) {
  TraceOptions allow;
  allow.allow_data_dependent_values = true;
  auto program = [](IValues in) {
    at::Tensor x = in[0].toTensor();
    return c10::IValue(x.index({x > 0}) * 2);
  };
  GraphModule gm = trace(program, {at::tensor({1.f, -1.f, 2.f})}, allow);
  at::Tensor y = at::tensor({3.f, 4.f, -5.f, 6.f}).narrow(0, 0, 3);
  at::Tensor more = at::tensor({3.f, 4.f, 5.f});
  for (const at::Tensor& x : {y, more}) {
    EXPECT_TRUE(at::equal(Interpreter(gm).run({x}).toTensor(), program({x}).toTensor()));
  }
}

// Note [Raw reads of traced tensors]
TEST(RawReads, OfTracedTensorsAreRefusedNamingTheTensor) {
  std::string message = trace_error([] {
    trace([](IValues in) {
      const float* p = in[0].toTensor().data_ptr<float>();
      return c10::IValue(in[0].toTensor() * p[0]);
    }, {at::ones({2})});
  });
  EXPECT_EQ(message.rfind("The program reads the memory of traced tensor %ph_0 directly", 0), 0u)
      << message;
  // Allowed, the values are read and baked in, as .item()'s are, and
  // checked on every run (Note [Guards of values the program read]): the
  // graph answers for the values it was traced with, and refuses others.
  TraceOptions allow;
  allow.allow_data_dependent_values = true;
  GraphModule gm = trace([](IValues in) {
    const float* p = in[0].toTensor().data_ptr<float>();
    return c10::IValue(in[0].toTensor() * p[0]);
  }, {at::full({2}, 3.0)}, allow);
  EXPECT_TRUE(at::allclose(Interpreter(gm).run({at::full({2}, 3.0)}).toTensor(), at::full({2}, 9.0)));
  EXPECT_THROW(Interpreter(gm).run({at::ones({2})}), RuntimeError);
}

TEST(RawReads, ByALibTorchFunctionNameIt) {
  std::string message = trace_error([] {
    trace([](IValues in) {
      auto parts = at::tensor_split(in[0].toTensor(), in[1].toTensor());
      return c10::IValue(parts[0]);
    }, {at::randn({6}), at::tensor({2, 4}, at::kLong)});
  });
  EXPECT_EQ(message.rfind("aten::tensor_split.tensor_indices_or_sections reads the memory of traced "
                          "tensor %ph_1 directly", 0), 0u) << message;
}

// Note [Wrappers are subclass-like]: the composites that read raw memory of
// ordinary tensors take their operator path for wrappers, as for make_fx's.
TEST(RawReads, CompositesWithARawFastPathTraceThroughOperators) {
  auto check = [](const std::function<at::Tensor(const at::Tensor&)>& f, at::Tensor traced_on,
                  at::Tensor run_on) {
    GraphModule gm = trace([&](IValues in) { return c10::IValue(f(in[0].toTensor())); }, {traced_on});
    gm.lint();
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(Interpreter(gm).run({run_on}).toTensor(), f(run_on))) << gm.str();
  };
  check([](const at::Tensor& x) { return at::max_pool1d(x, 2); }, at::randn({1, 2, 8}),
        at::randn({1, 2, 8}));
  check([](const at::Tensor& x) { return at::real(at::linalg_eigvals(x)); }, at::randn({3, 3}),
        at::randn({3, 3}));
}

TEST(Gradients, BackwardInsideATraceSaysItIsNotCaptured) {
  std::string message = trace_error([] {
    trace([](IValues in) {
      at::Tensor w = at::ones({2}).requires_grad_();
      (in[0].toTensor() * w).sum().backward();
      return c10::IValue(w.grad());
    }, {at::ones({2})});
  });
  EXPECT_NE(message.find("captures no gradients"), std::string::npos) << message;
  EXPECT_NE(message.find("export_training"), std::string::npos) << message;
}

// A module of the user's own, as TORCH_MODULE makes it: its holder's
// operator() takes any arguments, which must not stop trace(model, {x}) from
// choosing the holder overload.
struct ScaledLinearImpl : torch::nn::Module {
  ScaledLinearImpl() : fc(register_module("fc", torch::nn::Linear(4, 3))) {}
  at::Tensor forward(at::Tensor x) { return torch::relu(fc(x)) * 2; }
  torch::nn::Linear fc;
};
TORCH_MODULE(ScaledLinear);

std::vector<std::string> get_attr_targets(const GraphModule& gm) {
  std::vector<std::string> out;
  for (Node* n : gm.graph()) {
    if (n->op() == OpCode::GetAttr) out.push_back(n->target());
  }
  return out;
}

TEST(ModuleHolders, OwnModulesAndBuiltInOnesTraceWithAnInitializerList) {
  torch::manual_seed(0);
  ScaledLinear model;
  at::Tensor x = at::randn({2, 4});
  GraphModule gm = trace(model, {x});
  EXPECT_EQ(get_attr_targets(gm), (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_TRUE(at::equal(Interpreter(gm).run({x}).toTensor(), model(x)));
  GraphModule exported = export_program(model, {x});
  EXPECT_TRUE(at::equal(Interpreter(exported).run({x}).toTensor(), model(x)));

  torch::nn::Linear linear(4, 2);
  EXPECT_TRUE(at::equal(Interpreter(trace(linear, {x})).run({x}).toTensor(), linear(x)));
  // Functions still take the function overload, as lambdas and as TracedFunction.
  TracedFunction fn = [](std::vector<c10::IValue> in) { return c10::IValue(in[0].toTensor() * 3); };
  EXPECT_EQ(trace(fn, {x}).graph().size(), 3u);  // x, mul, output
  auto neg = [](std::vector<c10::IValue> in) { return c10::IValue(in[0].toTensor().neg()); };
  EXPECT_EQ(export_program(neg, {x}).graph().size(), 3u);
}

}  // namespace
}  // namespace torchcap
