// The interpreter: the zoo on fresh inputs, input validation, failing
// operators, threads, and freeing values after their last use.
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/tracer.h>

#include "zoo.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>

namespace torchcap {
namespace {

using IValues = std::vector<c10::IValue>;

class ZooOnFreshInputs : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooOnFreshInputs, MatchesEager) {
  const std::string name = GetParam();
  examples::Example traced = examples::make(name);
  GraphModule gm = examples::trace(traced);  // on the reference inputs (seed 0)
  Interpreter interp(gm);

  examples::Example eager = examples::make(name);  // untouched by the trace
  for (uint64_t seed : {1, 2}) {
    IValues inputs = eager.make_inputs(seed);
    c10::IValue expected = eager.forward(inputs);
    c10::IValue actual = interp.run(inputs);
    EXPECT_LE(examples::max_abs_diff(actual, expected), 1e-5) << name << " seed " << seed;
  }
  // State the program changes (BatchNorm running stats in train mode) changes
  // the same way in the graph: it started from the values before the trace.
  for (const auto& [buffer, value] : examples::named_buffers(eager)) {
    if (!gm.has_attribute(buffer)) continue;
    EXPECT_TRUE(at::allclose(gm.attribute(buffer).value, value, 1e-5, 1e-6)) << buffer;
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, ZooOnFreshInputs, ::testing::ValuesIn(examples::names()),
                         [](const auto& info) { return info.param; });

std::string input_error(const Interpreter& interp, const IValues& inputs) {
  try {
    interp.run(inputs);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

GraphModule two_input_graph() {
  return trace([](IValues in) { return c10::IValue(in[0].toTensor().matmul(in[1].toTensor())); },
               {at::randn({2, 3}), at::randn({3, 4})});
}

TEST(Validation, OneErrorListsEveryMismatch) {
  Interpreter interp(two_input_graph());
  EXPECT_EQ(input_error(interp, {at::randn({2, 5}), at::randn({3, 4}, at::kDouble)}),
            "inputs do not match the graph:\n"
            "  input 0 (ph_0): expected f32[2, 3], got f32[2, 5]\n"
            "  input 1 (ph_1): expected f32[3, 4], got f64[3, 4]");
  EXPECT_EQ(input_error(interp, {at::randn({2, 3, 1}), at::randn({3, 4})}),
            "inputs do not match the graph:\n"
            "  input 0 (ph_0): expected f32[2, 3], got f32[2, 3, 1]");
}

TEST(Validation, CountAndType) {
  Interpreter interp(two_input_graph());
  EXPECT_EQ(input_error(interp, {at::randn({2, 3})}),
            "input: expected a tuple of 2, got a tuple of 1");
  EXPECT_EQ(input_error(interp, {at::randn({2, 3}), c10::IValue(int64_t(4))}),
            "input[1]: expected a tensor, got int 4");
  EXPECT_EQ(input_error(interp, {at::randn({2, 3}), c10::IValue()}),
            "input[1]: expected a tensor, got None");
  EXPECT_EQ(input_error(interp, {at::randn({2, 3}), at::Tensor()}),
            "inputs do not match the graph:\n"
            "  input 1 (ph_1): expected a tensor, got an undefined tensor");
  try {
    interp.run_flat({at::randn({2, 3})});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "expected 2 input tensor(s), got 1");
  }
}

TEST(Validation, NestedStructure) {
  examples::Example e = examples::make("nested_io");
  Interpreter interp(examples::trace(e));
  IValues good = e.make_inputs(1);
  IValues wrong_constant = good;
  wrong_constant[2] = c10::IValue(int64_t(5));
  EXPECT_EQ(input_error(interp, wrong_constant),
            "input[2]: expected int 2 (the value the graph was captured with; it is not an "
            "input), got int 5");
  IValues wrong_nesting = good;
  wrong_nesting[1] = at::randn({2, 3});
  EXPECT_EQ(input_error(interp, wrong_nesting), "input[1]: expected a dict of 2, got a tensor");
}

TEST(Errors, FailingOperatorNamesTheNodeAndItsStackTrace) {
  // Indices are data: validation cannot catch an out-of-range one.
  GraphModule gm = trace([](IValues in) {
    return c10::IValue(at::index_select(in[0].toTensor(), 0, in[1].toTensor()));
  }, {at::randn({4, 2}), at::tensor({0, 3}, at::kLong)});
  Interpreter interp(gm);
  try {
    interp.run({at::randn({4, 2}), at::tensor({0, 9}, at::kLong)});
    FAIL() << "expected a RuntimeError";
  } catch (const RuntimeError& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("while executing %index_select : i64[2] [users=1] = "
                      "aten::index_select(%ph_0, 0, %ph_1)", 0),
              std::string::npos);  // the recorded type is f32
    EXPECT_EQ(m.rfind("while executing %index_select : f32[2, 2] [users=1] = "
                      "aten::index_select(%ph_0, 0, %ph_1)\ncaptured at:\n",
                      0),
              0u)
        << m;
    EXPECT_NE(m.find("interpreter_test.cpp"), std::string::npos) << m;
    EXPECT_NE(m.find("out of range"), std::string::npos) << m;
  }
}

TEST(Errors, HandBuiltGraphWithoutStackTraces) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* y = g.placeholder("y");
  g.output({g.call_function("aten::mm", {x, y})});
  gm.set_flat_specs();
  Interpreter interp(gm);
  try {
    interp.run_flat({at::randn({2, 3}), at::randn({4, 5})});
    FAIL();
  } catch (const RuntimeError& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("while executing %mm : [users=1] = aten::mm(%x, %y)\n", 0), 0u) << m;
    EXPECT_NE(m.find("mat1 and mat2 shapes cannot be multiplied"), std::string::npos) << m;
  }
}

TEST(Errors, GraphsThatCannotRunAreRejectedAtLoad) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  g.output({g.call_function("aten::relu", {x, 3})});  // too many arguments
  gm.set_flat_specs();
  EXPECT_THROW(Interpreter{gm}, LintError);
}

TEST(Threads, OneGraphManyCallers) {
  examples::Example e = examples::make("cnn_bn_eval");
  Interpreter interp(examples::trace(e));
  constexpr int kThreads = 4;
  std::vector<IValues> inputs;
  std::vector<c10::IValue> expected;
  for (int i = 0; i < kThreads; ++i) {
    inputs.push_back(e.make_inputs(10 + i));
    expected.push_back(e.forward(inputs.back()));
  }
  std::vector<double> worst(kThreads, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      double w = 0;
      for (int round = 0; round < 20; ++round) {
        w = std::max(w, examples::max_abs_diff(interp.run(inputs[i]), expected[i]));
      }
      worst[i] = w;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_LE(worst[i], 1e-5) << "thread " << i;
}

// Note [Concurrent runs that update buffers]: runs of an exported graph
// that writes its buffers back are serialized, so none of the updates is
// lost (before, 8 x 100 runs left num_batches_tracked between 88 and 476).
TEST(Threads, ExportedBufferUpdatesAreNotLost) {
  examples::Example e = examples::make("cnn_bn_train");
  GraphModule gm = export_program(*e.module, e.forward, e.make_inputs(0));
  const std::string counter = "bn1.num_batches_tracked";
  ASSERT_TRUE(gm.has_attribute(counter)) << gm.str();
  const int64_t before = gm.attribute(counter).value.item<int64_t>();
  Interpreter interp(gm);
  constexpr int kThreads = 8, kRuns = 100;
  IValues inputs = e.make_inputs(1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int r = 0; r < kRuns; ++r) interp.run(inputs);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(gm.attribute(counter).value.item<int64_t>(), before + kThreads * kRuns);
}

// Note [Writing back like the program would]
GraphModule adds_one_to_its_input() {
  TraceOptions options;
  options.allow_input_mutation = true;
  return export_program([](IValues in) {
    at::Tensor x = in[0].toTensor();
    x.add_(1);
    return c10::IValue(x * 2);
  }, {at::zeros({3})}, options);
}

TEST(WriteBack, ALeafThatRequiresGradIsRefusedUnderGradModeAndKeepsItsValue) {
  Interpreter interp(adds_one_to_its_input());
  at::Tensor leaf = at::zeros({3}).requires_grad_();
  try {
    interp.run({leaf});
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 (ph_0), a leaf tensor that requires grad"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(leaf.detach(), at::zeros({3})));
  at::NoGradGuard no_grad;  // as in an optimizer step: allowed, as in eager
  interp.run({leaf});
  EXPECT_TRUE(at::equal(leaf.detach(), at::ones({3})));
}

TEST(WriteBack, BumpsTheVersionSoAutogradSeesTheWrite) {
  Interpreter interp(adds_one_to_its_input());
  at::Tensor w = at::ones({3}).requires_grad_();
  at::Tensor x = at::zeros({3});
  at::Tensor loss = (w * x).sum();  // saves x for backward
  const auto version = x._version();
  interp.run({x});
  EXPECT_GT(x._version(), version);
  // Eager's in-place write would make backward refuse; so does the graph's.
  EXPECT_THROW(loss.backward(), c10::Error);
}

// Note [Updates written in place] (src/runtime/plan_passes/updates_in_place.cpp)
GraphModule updates_its_buffer(const std::function<c10::IValue(at::Tensor&, const at::Tensor&)>& fn) {
  ModuleState state;
  state.buffers.emplace_back("buf", at::full({3}, 2.0));
  at::Tensor buf = state.buffers[0].second;
  return export_program(state, [&](IValues in) { return fn(buf, in[0].toTensor()); },
                        {at::zeros({3})});
}

// buf = buf * 0.5 + x, in place; returns buf * 3.
GraphModule halves_and_adds_into_its_buffer() {
  return updates_its_buffer([](at::Tensor& buf, const at::Tensor& x) {
    buf.mul_(0.5).add_(x);
    return c10::IValue(buf * 3);
  });
}

TEST(UpdatesInPlace, TheLastOperatorOfAnUpdateWritesIntoTheBuffer) {
  GraphModule gm = halves_and_adds_into_its_buffer();
  at::Tensor buf = gm.attribute("buf").value;
  at::Tensor before = buf.clone();
  Interpreter interp(gm);
  EXPECT_EQ(interp.updated_in_place(), std::vector<std::string>{"buf"});
  const void* data = buf.data_ptr();
  const auto version = buf._version();
  at::Tensor x = at::arange(3, at::kFloat);
  at::Tensor out = interp.run({x}).toTensor();
  at::Tensor expected = before.mul(0.5).add(x);
  EXPECT_TRUE(at::equal(buf, expected)) << buf;
  EXPECT_TRUE(at::equal(out, expected * 3)) << out;
  EXPECT_EQ(buf.data_ptr(), data);
  EXPECT_GT(buf._version(), version);  // as the copy after the run would
  interp.run({x});
  EXPECT_TRUE(at::equal(buf, expected.mul(0.5).add(x)));
}

// Counts the CPU allocator's allocations of at least `bytes` while installed.
class LargeAllocations final : public c10::Allocator {
 public:
  explicit LargeAllocations(size_t bytes) : bytes_(bytes), inner_(c10::GetCPUAllocator()) {
    c10::SetCPUAllocator(this, kPriority);
  }
  ~LargeAllocations() override { c10::SetCPUAllocator(inner_, kPriority); }
  c10::DataPtr allocate(size_t n) const override {
    if (n >= bytes_) ++count_;
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  size_t count() const { return count_; }

 private:
  static constexpr uint8_t kPriority = 201;
  size_t bytes_;
  c10::Allocator* inner_;
  mutable std::atomic<size_t> count_{0};
};

TEST(UpdatesInPlace, AnUpdateRunsInPlaceFromItsFirstOperator) {
  GraphModule gm = halves_and_adds_into_its_buffer();
  at::Tensor buf = gm.attribute("buf").value;
  at::Tensor before = buf.clone();
  Interpreter interp(gm);
  at::Tensor x = at::arange(3, at::kFloat);
  size_t allocations = 0;
  {
    LargeAllocations count(3 * sizeof(float));  // not the Scalars' 0-dim tensors
    interp.run({x});
    allocations = count.count();
  }
  EXPECT_TRUE(at::equal(buf, before.mul(0.5).add(x))) << buf;
  EXPECT_EQ(allocations, 1u);  // the result; mul's value is the buffer itself
}

TEST(UpdatesInPlace, NotFromTheFirstOperatorWhenTheOldValueIsReadInBetween) {
  GraphModule gm = updates_its_buffer([](at::Tensor& buf, const at::Tensor& x) {
    at::Tensor half = buf.mul(0.5);
    at::Tensor old = buf + 1;  // after mul, before the update's last operator
    buf.copy_(half.add(x));
    return c10::IValue(old);
  });
  at::Tensor buf = gm.attribute("buf").value;
  at::Tensor before = buf.clone();
  Interpreter interp(gm);
  EXPECT_EQ(interp.updated_in_place(), std::vector<std::string>{"buf"});
  at::Tensor x = at::arange(3, at::kFloat);
  at::Tensor out = interp.run({x}).toTensor();
  EXPECT_TRUE(at::equal(out, before + 1)) << out;
  EXPECT_TRUE(at::equal(buf, before.mul(0.5).add(x))) << buf;
}

TEST(UpdatesInPlace, NotWhenTheNewValueIsAlsoAResult) {
  // The result must not be the buffer itself, which the next run changes.
  GraphModule gm = updates_its_buffer([](at::Tensor& buf, const at::Tensor& x) {
    buf.add_(x);
    return c10::IValue(buf);
  });
  at::Tensor buf = gm.attribute("buf").value;
  Interpreter interp(gm);
  EXPECT_TRUE(interp.updated_in_place().empty());
  at::Tensor out = interp.run({at::ones({3})}).toTensor();
  EXPECT_TRUE(at::equal(out, buf));
  EXPECT_FALSE(out.is_alias_of(buf));
}

TEST(UpdatesInPlace, NotWhenTheOldValueIsReadAfterTheUpdate) {
  // The new value is computed first; the old one is read afterwards, by
  // itself or through a view: writing the new value into the buffer when
  // it is computed would change what those reads see.
  using Read = std::function<at::Tensor(const at::Tensor&)>;
  for (const auto& [what, read] : std::vector<std::pair<std::string, Read>>{
           {"itself", [](const at::Tensor& b) { return b * 3; }},
           {"a view", [](const at::Tensor& b) { return b.view({3, 1}).slice(0, 1) * 3; }}}) {
    GraphModule gm = updates_its_buffer([&read = read](at::Tensor& buf, const at::Tensor& x) {
      at::Tensor next = buf.mul(0.5).add(x);
      at::Tensor old = read(buf);
      buf.copy_(next);
      return c10::IValue(old);
    });
    at::Tensor buf = gm.attribute("buf").value;
    at::Tensor before = buf.clone();
    Interpreter interp(gm);
    EXPECT_TRUE(interp.updated_in_place().empty()) << what;
    at::Tensor x = at::arange(3, at::kFloat);
    at::Tensor out = interp.run({x}).toTensor();
    EXPECT_TRUE(at::equal(out, read(before))) << what << ": " << out;
    EXPECT_TRUE(at::equal(buf, before.mul(0.5).add(x))) << what << ": " << buf;
  }
}

TEST(UpdatesInPlace, EveryParameterAndOptimizerStateOfATrainingStep) {
  examples::Example e = examples::make("cnn_bn_train");
  GraphModule gm = export_program(*e.module, e.forward, e.make_inputs(0));
  Interpreter interp(gm);
  // BatchNorm's running statistics end with an elementwise add.
  std::vector<std::string> in_place = interp.updated_in_place();
  EXPECT_NE(std::find(in_place.begin(), in_place.end(), "bn1.running_mean"), in_place.end());
  EXPECT_NE(std::find(in_place.begin(), in_place.end(), "bn1.running_var"), in_place.end());
}

TEST(Memory, ValuesAreFreedAfterTheirLastUse) {
  auto chain = [](int64_t length) {
    return trace([length](IValues in) {
      at::Tensor x = in[0].toTensor();
      for (int64_t i = 0; i < length; ++i) x = at::sin(x);
      return c10::IValue(x);
    }, {at::randn({8})});
  };
  for (int64_t length : {10, 1000}) {
    Interpreter interp(chain(length));
    RunStats stats = interp.run_with_stats({at::randn({8})}).stats;
    EXPECT_EQ(stats.nodes_executed, static_cast<size_t>(length));
    EXPECT_LE(stats.peak_live_values, 2u) << "chain of " << length;
  }
}

TEST(Memory, UnusedOutputsAreDroppedAtOnce) {
  GraphModule gm = trace([](IValues in) {
    at::Tensor x = in[0].toTensor();
    auto [v, i] = at::topk(x, 2);  // i is never read
    return c10::IValue(v * 2);
  }, {at::randn({5})});
  RunStats stats = Interpreter(gm).run_with_stats({at::randn({5})}).stats;
  EXPECT_LE(stats.peak_live_values, 2u);
}

// Note [Results written over a dying argument] (src/runtime/plan_passes/overwrites.cpp).

TEST(Overwrites, AnElementwiseResultGoesIntoAnArgumentThatDiesThere) {
  GraphModule gm = trace([](IValues in) {
    return c10::IValue(at::relu(in[0].toTensor() * 2) * 3);
  }, {at::randn({4, 5})});
  at::Tensor x = at::randn({4, 5});
  at::Tensor before = x.clone();
  Interpreter::Result r = Interpreter(gm).run_with_stats({x});
  EXPECT_TRUE(at::equal(r.outputs.toTensor(), at::relu(before * 2) * 3));
  EXPECT_EQ(r.stats.results_over_arguments, 2u);  // relu and the last product, each into its argument
  EXPECT_TRUE(at::equal(x, before));  // the input is never written
}

// InterpreterOptions::autograd: the run is differentiated as the program's
// own operators would be, through the operators the overwrite pass would
// otherwise run into dying arguments (above) and views of attributes.
TEST(Autograd, ARunRecordsTheProgramsGradients) {
  auto program = [](IValues in) {
    const at::Tensor& x = in[0].toTensor();
    const at::Tensor& w = in[1].toTensor();
    return c10::IValue(at::relu(x.matmul(w.t()) * 2) * 3);
  };
  GraphModule gm = trace(program, {at::randn({4, 5}), at::randn({3, 5})});
  at::Tensor x = at::randn({4, 5});
  at::Tensor w = at::randn({3, 5}).requires_grad_();
  InterpreterOptions options;
  options.autograd = true;
  at::Tensor out = Interpreter(gm, options).run({x, w}).toTensor();
  ASSERT_TRUE(out.requires_grad());
  out.square().sum().backward();
  at::Tensor by_run = w.grad().clone();
  w.mutable_grad().reset();
  program({x, w}).toTensor().square().sum().backward();
  EXPECT_TRUE(at::equal(by_run, w.grad()));
  // The default interpreter runs below autograd.
  EXPECT_FALSE(Interpreter(gm).run({x, w}).toTensor().requires_grad());
}

TEST(Autograd, NotWithPlannedMemory) {
  GraphModule gm = trace([](IValues in) { return c10::IValue(in[0].toTensor() * 2); }, {at::randn({3})});
  InterpreterOptions options;
  options.autograd = options.plan_memory = true;
  try {
    Interpreter interp(gm, options);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan_memory and autograd do not go together"),
              std::string::npos) << e.what();
  }
}

TEST(Overwrites, NotIntoAValueReadLater) {
  GraphModule gm = trace([](IValues in) {
    at::Tensor a = in[0].toTensor() * 2;
    at::Tensor b = at::relu(a);
    return c10::IValue(a + b);  // a is read after relu
  }, {at::randn({6})});
  at::Tensor x = at::randn({6});
  at::Tensor a = x * 2;
  Interpreter::Result r = Interpreter(gm).run_with_stats({x});
  EXPECT_TRUE(at::equal(r.outputs.toTensor(), a + at::relu(a)));
  EXPECT_EQ(r.stats.results_over_arguments, 1u);  // only the sum, into a or relu's result
}

TEST(Overwrites, NotIntoAViewOfAnInputOrAnAttribute) {
  at::Tensor w = at::randn({2, 3});
  ModuleState state;
  state.parameters.emplace_back("w", w);
  TracedFunction f = [&](IValues in) -> c10::IValue {
    // Both relus read views (run as views) of tensors the run does not own.
    return c10::ivalue::Tuple::create({at::relu(in[0].toTensor().view({-1})),
                                       at::relu(w.t()) + 1});
  };
  at::Tensor x = at::randn({2, 3});
  GraphModule gm = export_program(state, f, {x});
  at::Tensor x_before = x.clone(), w_before = w.clone();
  Interpreter::Result r = Interpreter(gm).run_with_stats({x});
  auto out = r.outputs.toTupleRef().elements();
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::relu(x_before.view({-1}))));
  EXPECT_TRUE(at::equal(out[1].toTensor(), at::relu(w_before.t()) + 1));
  EXPECT_TRUE(at::equal(x, x_before));
  EXPECT_TRUE(at::equal(gm.attribute("w").value, w_before));
  EXPECT_EQ(r.stats.results_over_arguments, 1u);  // only + 1, into relu's result
}

TEST(Overwrites, NotWhenTheArgumentHasAnotherLayout) {
  // relu of a transposed intermediate: the result is laid out as its
  // argument (column-major) and recorded so; the sum that follows has a
  // row-major broadcast partner, so its result is row-major and the
  // transposed argument is not its buffer.
  GraphModule gm = trace([](IValues in) {
    at::Tensor t = (in[0].toTensor() * 2).t();
    return c10::IValue(at::relu(t) + in[1].toTensor());
  }, {at::randn({3, 4}), at::randn({4, 3})});
  at::Tensor x = at::randn({3, 4}), y = at::randn({4, 3});
  Interpreter::Result r = Interpreter(gm).run_with_stats({x, y});
  at::Tensor expected = at::relu((x * 2).t()) + y;
  EXPECT_TRUE(at::equal(r.outputs.toTensor(), expected));
  EXPECT_EQ(r.outputs.toTensor().strides(), expected.strides());
}

// Note [Scalar operators as Tensor operators]
// (src/runtime/plan_passes/scalar_operators.cpp): the same values as the
// Scalar overloads' own kernels, for every dtype's promotion.
TEST(ScalarOperators, SameValuesAsTheirOwnKernels) {
  auto f = [](IValues in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    return c10::ivalue::Tuple::create({x * 0.1, x.add(0.3, 2), x / 3.0, x - 7, x.sub(1.5, 0.25), x * 3});
  };
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong}) {
    at::Tensor example = (at::randn({7}) * 10).to(dtype);
    GraphModule gm = trace(f, {example});
    at::Tensor x = (at::randn({7}) * 10).to(dtype);
    auto actual = Interpreter(gm).run({x}).toTupleRef().elements();
    auto expected = f({x}).toTupleRef().elements();
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(actual[i].toTensor().scalar_type(), expected[i].toTensor().scalar_type()) << dtype << " " << i;
      EXPECT_TRUE(at::equal(actual[i].toTensor(), expected[i].toTensor())) << dtype << " " << i;
    }
  }
}

// Note [Run frames] (interpreter.cpp): each thread reuses one frame; these
// show it holds nothing between runs and is not shared by nested runs.

TEST(Memory, ARunHoldsNoTensorAfterItEnds) {
  GraphModule gm = trace([](IValues in) {
    return c10::IValue(at::sin(in[0].toTensor()) * 2);
  }, {at::randn({3})});
  Interpreter interp(gm);
  at::Tensor out = interp.run({at::randn({3})}).toTensor();
  EXPECT_EQ(out.use_count(), 1);
}

TEST(Memory, AFailedRunHoldsNoTensorAfterItEnds) {
  // %detach shares x's storage; mm then fails with it still live.
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* d = g.call_function("aten::detach", {x});
  g.output({g.call_function("aten::mm", {d, d})});
  gm.set_flat_specs();
  Interpreter interp(gm);
  at::Tensor input = at::randn({2, 3});
  const size_t before = input.storage().use_count();
  EXPECT_THROW(interp.run_flat({input}), RuntimeError);
  EXPECT_EQ(input.storage().use_count(), before);
  // The thread's frame works for the next run.
  at::Tensor square = at::randn({3, 3});
  EXPECT_TRUE(at::allclose(interp.run_flat({square})[0], at::mm(square, square)));
}

// An operator whose kernel runs another graph: a run inside a run.
Interpreter* inner_graph = nullptr;
at::Tensor run_inner_graph(const at::Tensor& x) { return inner_graph->run({x}).toTensor(); }
TORCH_LIBRARY(torchcap_interpreter_test, m) {
  m.def("run_inner_graph(Tensor x) -> Tensor", &run_inner_graph);
}

TEST(Nesting, AGraphRunFromInsideAnotherRunKeepsBothFrames) {
  Interpreter inner(trace([](IValues in) {
    return c10::IValue(at::relu(in[0].toTensor()) * 2);
  }, {at::randn({4})}));
  inner_graph = &inner;
  GraphModule outer;
  Graph& g = outer.graph();
  Node* x = g.placeholder("x");
  Node* a = g.call_function("aten::sin", {x});
  Node* b = g.call_function("torchcap_interpreter_test::run_inner_graph", {a});
  g.output({g.call_function("aten::add.Tensor", {a, b})});  // %a is read after the inner run
  outer.set_flat_specs();
  Interpreter interp(outer);
  at::Tensor input = at::randn({4});
  at::Tensor expected = at::sin(input) + at::relu(at::sin(input)) * 2;
  EXPECT_TRUE(at::allclose(interp.run_flat({input})[0], expected));
  inner_graph = nullptr;
}

// Note [Views for copies in functional graphs]
// (src/runtime/plan_passes/views_for_copies.cpp): an exported graph's copies
// of views run as views, except where the value is an output.
TEST(ViewsForCopies, SameValuesAndNoOutputAliasesAnAttribute) {
  at::manual_seed(0);
  at::Tensor w = at::randn({4, 3});
  ModuleState state;
  state.parameters.emplace_back("w", w);
  TracedFunction f = [&](IValues in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    // t(t(w)) and a view of an intermediate feed operators; w.t() is returned.
    at::Tensor y = x.mm(w.t().t().t()).view({-1}).unsqueeze(0);
    return c10::ivalue::Tuple::create({y.sum(1), w.t()});
  };
  at::Tensor x = at::randn({2, 3});
  GraphModule gm = export_program(state, f, {x});
  ASSERT_TRUE(is_functional(gm.graph()));
  auto out = Interpreter(gm).run({x}).toTupleRef().elements();
  EXPECT_TRUE(at::equal(out[0].toTensor(), x.mm(w.t()).view({-1}).unsqueeze(0).sum(1)));
  EXPECT_TRUE(at::equal(out[1].toTensor(), w.t()));
  // The returned transpose is a copy, not a view of the attribute.
  EXPECT_FALSE(out[1].toTensor().is_alias_of(gm.attribute("w").value));
}

// Note [Inputs in the traced layout]: embedding_bag's kernel reads its
// indices as laid out when traced; LibTorch made them contiguous only if
// they were not.
TEST(InputLayout, InputsOfOtherStridesAreRunInTheTracedLayout) {
  at::Tensor weight = at::randn({10, 3});
  auto bag = [&weight](IValues in) {
    return c10::IValue(std::get<0>(at::embedding_bag(weight, in[0].toTensor(), in[1].toTensor())));
  };
  at::Tensor offsets = at::tensor({0, 2}, at::kLong);
  at::Tensor strided = at::tensor({0, 9, 2, 9, 4, 9, 5, 9}, at::kLong).slice(0, 0, 8, 2);
  for (const at::Tensor& traced_with : {strided.contiguous(), strided}) {
    GraphModule gm = trace(bag, {traced_with, offsets});
    at::NoGradGuard no_grad;
    for (const at::Tensor& given : {strided, strided.contiguous()}) {
      EXPECT_TRUE(at::equal(Interpreter(gm).run({given, offsets}).toTensor(),
                            bag({given, offsets}).toTensor()));
      EXPECT_TRUE(at::equal(Interpreter(gm, InterpreterOptions{true}).run({given, offsets}).toTensor(),
                            bag({given, offsets}).toTensor()));
    }
  }
}

TEST(InputLayout, WrittenInputsOfOtherStridesAreRefused) {
  TraceOptions writes;
  writes.allow_input_mutation = true;
  GraphModule gm = trace([](IValues in) { return c10::IValue(in[0].toTensor().add_(1)); },
                         {at::zeros({2, 3})}, writes);
  at::Tensor transposed = at::zeros({3, 2}).t();
  try {
    Interpreter(gm).run({transposed});
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 (ph_0) is written by the graph and must have the "
                                         "strides it was traced with, [3, 1]; got [1, 2]"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(transposed, at::zeros({2, 3})));
}

}  // namespace
}  // namespace torchcap

namespace torchcap {
namespace {

// Interpreter::profile: every node of the graph, in order, timed over the
// runs; the table's totals and the Chrome trace say the same.
TEST(Profile, EveryNodeTimedOverTheRuns) {
  examples::Example e = examples::make("mlp");
  GraphModule gm = examples::trace(e);
  Interpreter interp(gm);
  const Profile p = interp.profile(e.make_inputs(0), 3);
  EXPECT_EQ(p.runs, 3);
  // The nodes that run: the two `t`s of weights are computed once, when the
  // interpreter is made (Note [Views of attributes, computed once]).
  const std::vector<std::string> expected = {"addmm", "relu", "addmm_1"};
  std::vector<std::string> names;
  double sum = 0;
  for (const Profile::Node& n : p.nodes) {
    names.push_back(n.name);
    EXPECT_GT(n.seconds, 0) << n.name;
    EXPECT_GE(n.last_seconds, 0) << n.name;
    sum += n.seconds;
  }
  EXPECT_EQ(names, expected);
  EXPECT_DOUBLE_EQ(p.seconds, sum);
  const std::string table = p.table(2);
  EXPECT_EQ(table.rfind("3 runs, ", 0), 0u) << table;
  EXPECT_NE(table.find("aten::addmm       6"), std::string::npos) << table;  // 2 nodes x 3 runs
  EXPECT_NE(table.find("slowest nodes (ms/run):"), std::string::npos) << table;
  const nlohmann::json trace = nlohmann::json::parse(p.chrome_trace());
  ASSERT_EQ(trace["traceEvents"].size(), expected.size());
  EXPECT_EQ(trace["traceEvents"][0]["ph"], "X");
  EXPECT_EQ(trace["traceEvents"][0]["name"], expected[0]);
  EXPECT_THROW(interp.profile(e.make_inputs(0), 0), Error);
  EXPECT_THROW(interp.profile({at::zeros({3})}, 1), InputError);  // checked as a run is
}

}  // namespace
}  // namespace torchcap
