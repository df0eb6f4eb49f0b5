// plan_memory, verify_memory_plan and the memory views of `torchcap show`.
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/memory_plan.h>
#include <torchcap/tracer.h>

#include "cli/memory_view.h"
#include "counting_allocator.h"
#include "golden.h"
#include "sample_graphs.h"
#include "zoo.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>

namespace torchcap {
namespace {

using testing::meta;

// x -> relu -> view -> mul -> add_ (in place) -> neg -> sum (total) -> output.
//   step: x 0, relu 1, view 2, mul 3, add_ 4, neg 5, sum 6, output 7
GraphModule chain() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* relu = g.call_function("aten::relu", {x}, {}, "relu");
  Node* view = g.call_function("aten::view", {relu, Argument(ArgumentList{64})}, {}, "view");
  Node* mul = g.call_function("aten::mul.Tensor", {view, view}, {}, "mul");
  Node* add = g.call_function("aten::add_.Tensor", {mul, view}, {}, "add_");
  Node* neg = g.call_function("aten::neg", {add}, {}, "neg");
  Node* sum = g.call_function("aten::sum", {neg}, {}, "total");
  g.output({sum});
  x->meta().val = ValueMeta::tensor(meta(c10::kFloat, {4, 16}));
  relu->meta().val = ValueMeta::tensor(meta(c10::kFloat, {4, 16}));
  view->meta().val = ValueMeta::tensor(meta(c10::kFloat, {64}));
  mul->meta().val = ValueMeta::tensor(meta(c10::kFloat, {64}));
  add->meta().val = ValueMeta::tensor(meta(c10::kFloat, {64}));
  neg->meta().val = ValueMeta::tensor(meta(c10::kFloat, {64}));
  sum->meta().val = ValueMeta::tensor(meta(c10::kFloat, {}));
  return gm;
}

TEST(MemoryPlan, LifetimesFollowViewsAndInPlaceResults) {
  GraphModule gm = chain();
  MemoryPlan plan = plan_memory(gm.graph());
  ASSERT_EQ(plan.values.size(), 3u);
  const PlannedValue* relu = plan.find("relu");
  const PlannedValue* mul = plan.find("mul");
  const PlannedValue* neg = plan.find("neg");
  ASSERT_TRUE(relu && mul && neg);
  // The view of relu is read by mul (3) and add_ (4): relu lives until 4.
  EXPECT_EQ(relu->first, 1);
  EXPECT_EQ(relu->last, 4);
  EXPECT_EQ(relu->aliases, std::vector<std::string>{"view"});
  // add_ writes mul in place: its result is mul's buffer, read by neg (5).
  EXPECT_EQ(mul->first, 3);
  EXPECT_EQ(mul->last, 5);
  EXPECT_EQ(mul->aliases, std::vector<std::string>{"add_"});
  EXPECT_EQ(neg->first, 5);
  EXPECT_EQ(neg->last, 6);
  EXPECT_EQ(relu->size, 256);
  // The output is returned, the input is the caller's: neither is planned.
  ASSERT_EQ(plan.unplanned.size(), 1u);
  EXPECT_EQ(plan.unplanned[0].node, "total");
  EXPECT_EQ(plan.unplanned[0].reason, "returned by the graph");

  EXPECT_EQ(plan.naive_bytes, 3 * 256);
  EXPECT_EQ(plan.lower_bound_bytes, 2 * 256);  // relu and mul at steps 3 and 4
  EXPECT_EQ(plan.peak_step, 3);
  EXPECT_EQ(plan.arena_bytes, 2 * 256);  // neg reuses relu's bytes
  EXPECT_EQ(neg->offset, relu->offset);
  EXPECT_NO_THROW(verify_memory_plan(plan));
  // live_at lists by offset.
  auto live = plan.live_at(4);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_LT(live[0]->offset, live[1]->offset);
}

TEST(MemoryPlan, InPlaceOnAnInputIsNotPlanned) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* add = g.call_function("aten::add_.Tensor", {x, x}, {}, "add_");
  Node* neg = g.call_function("aten::neg", {add}, {}, "neg");
  Node* out = g.call_function("aten::neg", {neg}, {}, "out");
  g.output({out});
  for (Node* n : {x, add, neg, out}) n->meta().val = ValueMeta::tensor(meta(c10::kFloat, {3}));
  MemoryPlan plan = plan_memory(g);
  ASSERT_EQ(plan.values.size(), 1u);
  EXPECT_EQ(plan.values[0].node, "neg");
  EXPECT_EQ(plan.values[0].size, 12);
  EXPECT_EQ(plan.arena_bytes, 64);  // one aligned slot
}

TEST(MemoryPlan, TupleElementsAreBuffersOfTheirOwn) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* top = g.call_function("aten::topk", {x, 3}, {}, "topk");
  Node* values = g.getitem(top, 0, "values");
  Node* indices = g.getitem(top, 1, "indices");
  Node* neg = g.call_function("aten::neg", {values}, {}, "neg");
  Node* f = g.call_function("aten::_to_copy", {indices}, {{"dtype", c10::kFloat}}, "as_float");
  Node* add = g.call_function("aten::add.Tensor", {neg, f}, {}, "add");
  g.output({add});
  x->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 10}));
  top->meta().val = ValueMeta{ValueKind::Tuple, {meta(c10::kFloat, {2, 3}), meta(c10::kLong, {2, 3})}};
  values->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 3}));
  indices->meta().val = ValueMeta::tensor(meta(c10::kLong, {2, 3}));
  for (Node* n : {neg, f, add}) n->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 3}));
  MemoryPlan plan = plan_memory(g);
  const PlannedValue* v = plan.find("topk", 0);
  const PlannedValue* i = plan.find("topk", 1);
  ASSERT_TRUE(v && i);
  EXPECT_EQ(v->label(), "topk[0]");
  EXPECT_EQ(v->size, 24);
  EXPECT_EQ(i->size, 48);
  EXPECT_EQ(v->aliases, std::vector<std::string>{"values"});
  EXPECT_EQ(v->last, 4);  // neg
  EXPECT_EQ(i->last, 5);  // _to_copy
  // topk has an out variant with a CPU kernel: topk.values.
  ASSERT_FALSE(plan.operators.empty());
  EXPECT_EQ(plan.operators[0].target, "aten::topk");
  EXPECT_EQ(plan.operators[0].out_variant, "aten::topk.values");
  verify_memory_plan(plan);
}

TEST(MemoryPlan, ElementsOfATensorListOfViewsShareTheirBase) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* base = g.call_function("aten::neg", {x}, {}, "base");
  Node* parts = g.call_function("aten::unbind.int", {base}, {}, "parts");
  Node* first = g.getitem(parts, 0, "first");
  Node* second = g.getitem(parts, 1, "second");
  Node* a = g.call_function("aten::neg", {first}, {}, "a");
  Node* b = g.call_function("aten::mul.Tensor", {a, second}, {}, "b");
  g.output({b});
  x->meta().val = base->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 8}));
  parts->meta().val = ValueMeta{ValueKind::List, {meta(c10::kFloat, {8}), meta(c10::kFloat, {8})}};
  for (Node* n : {first, second, a, b}) n->meta().val = ValueMeta::tensor(meta(c10::kFloat, {8}));
  MemoryPlan plan = plan_memory(g);
  ASSERT_EQ(plan.values.size(), 2u);  // base and a: unbind makes no buffer
  const PlannedValue* v = plan.find("base");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->last, 6);  // `second` is read by mul
  EXPECT_EQ(v->aliases, (std::vector<std::string>{"parts", "first", "second"}));
}

TEST(MemoryPlan, OutVariantsMatchBySchema) {
  auto handle = [](const char* name, const char* overload) {
    return *c10::Dispatcher::singleton().findSchema({name, overload});
  };
  auto out_of = [&](const char* name, const char* overload) {
    auto out = find_out_variant(handle(name, overload));
    return out ? out->schema().overload_name() : std::string("-");
  };
  EXPECT_EQ(out_of("aten::add", "Tensor"), "out");
  EXPECT_EQ(out_of("aten::add", "Scalar"), "Scalar_out");
  EXPECT_EQ(out_of("aten::max", "dim"), "dim_max");
  EXPECT_EQ(out_of("aten::sum", "dim_IntList"), "IntList_out");
  EXPECT_EQ(out_of("aten::addmm", ""), "out");
  EXPECT_EQ(out_of("aten::add_", "Tensor"), "-");  // writes its argument already
  EXPECT_EQ(out_of("aten::view", ""), "-");        // a view
}

TEST(MemoryPlan, VerifierRejectsOverlapsNamingBothValues) {
  GraphModule gm = chain();
  MemoryPlan plan = plan_memory(gm.graph());
  MemoryPlan broken = plan;
  for (PlannedValue& v : broken.values) {
    if (v.node == "mul") v.offset = broken.find("relu")->offset;
  }
  try {
    verify_memory_plan(broken);
    FAIL() << "an overlapping plan was accepted";
  } catch (const MemoryPlanError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("%relu"), std::string::npos) << m;
    EXPECT_NE(m.find("%mul"), std::string::npos) << m;
    EXPECT_NE(m.find("share bytes"), std::string::npos) << m;
  }
  // neg and relu are never live together: sharing is fine.
  MemoryPlan shared = plan;
  for (PlannedValue& v : shared.values) {
    if (v.node == "neg") v.offset = shared.find("relu")->offset;
  }
  EXPECT_NO_THROW(verify_memory_plan(shared));

  MemoryPlan misaligned = plan;
  misaligned.values[0].offset += 4;
  EXPECT_THROW(verify_memory_plan(misaligned), MemoryPlanError);
  MemoryPlan small = plan;
  small.arena_bytes = 256;
  EXPECT_THROW(verify_memory_plan(small), MemoryPlanError);
}

void expect_bitwise_equal(const c10::IValue& a, const c10::IValue& b, const std::string& what);

void expect_sound(const MemoryPlan& plan, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_NO_THROW(verify_memory_plan(plan));
  EXPECT_LE(plan.arena_bytes, plan.greedy_bytes);
  EXPECT_LE(plan.greedy_bytes, plan.naive_bytes);
  EXPECT_GE(plan.arena_bytes, plan.lower_bound_bytes);
  // The bound is reached at the peak step.
  int64_t live = 0;
  for (const PlannedValue* v : plan.live_at(plan.peak_step)) live += (v->size + 63) / 64 * 64;
  EXPECT_EQ(live, plan.lower_bound_bytes);
}

TEST(MemoryPlan, EveryZooExample) {
  for (const std::string& name : examples::names()) {
    examples::Example e = examples::make(name);
    GraphModule gm = examples::trace(e);
    MemoryPlan plan = plan_memory(gm.graph());
    expect_sound(plan, name);
  }
}

TEST(MemoryPlan, ResNet18ReusesMemory) {
  examples::Example e = examples::make("resnet18");
  GraphModule gm = examples::trace(e);
  MemoryPlan plan = plan_memory(gm.graph());
  expect_sound(plan, "resnet18");
  EXPECT_LT(plan.arena_bytes * 4, plan.naive_bytes);
  EXPECT_LE(plan.arena_bytes, plan.lower_bound_bytes * 105 / 100);
}

// torchvision's own models, scripted by Python (the repository carries no
// binary models), traced through TorchScript.
class TorchvisionMemoryPlan : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() /
           ("torchcap_memory_plan_" + std::to_string(::getpid()));
    std::string command = "/usr/bin/python3 " + std::string(TORCHCAP_TEST_DIR) +
                          "/python/make_torchvision_models.py " + dir_.string() +
                          " resnet18 mobilenet_v2";
    ok_ = std::system(command.c_str()) == 0;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::filesystem::path dir_;
  static bool ok_;
};
std::filesystem::path TorchvisionMemoryPlan::dir_;
bool TorchvisionMemoryPlan::ok_ = false;

TEST_P(TorchvisionMemoryPlan, PlanIsSound) {
  ASSERT_TRUE(ok_) << "could not script the torchvision models";
  torch::jit::Module m = torch::jit::load((dir_ / (GetParam() + ".pt")).string());
  GraphModule gm = trace(m, {torch::randn({1, 3, 224, 224})});
  MemoryPlan plan = plan_memory(gm.graph());
  expect_sound(plan, GetParam());
  EXPECT_FALSE(plan.values.empty());
  at::NoGradGuard no_grad;
  Interpreter plain(gm);
  Interpreter planned(gm, InterpreterOptions{true});
  for (int run = 0; run < 2; ++run) {
    std::vector<c10::IValue> inputs{torch::randn({1, 3, 224, 224})};
    expect_bitwise_equal(plain.run(inputs), planned.run(inputs), GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TorchvisionMemoryPlan, ::testing::Values("resnet18", "mobilenet_v2"));

TEST(MemoryView, TextJsonAndSvg) {
  GraphModule gm = chain();
  MemoryPlan plan = plan_memory(gm.graph());
  testing::expect_golden("memory_plan_chain.txt", cli::format_memory_plan(plan));
  testing::expect_golden("memory_plan_chain.svg", cli::memory_plan_svg(plan));
  nlohmann::ordered_json j = cli::memory_plan_json(plan);
  EXPECT_EQ(j["arena_bytes"], 512);
  EXPECT_EQ(j["peak_node"], "mul");
  EXPECT_EQ(j["live_at_peak"].size(), 2u);
  EXPECT_EQ(j["values"].size(), 3u);
}

// --- Planned runs ---------------------------------------------------------------

std::vector<at::Tensor> flat(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  std::vector<c10::IValue> work{v};
  while (!work.empty()) {
    c10::IValue x = work.back();
    work.pop_back();
    if (x.isTensor()) {
      out.push_back(x.toTensor());
    } else if (x.isTuple()) {
      for (const c10::IValue& e : x.toTupleRef().elements()) work.push_back(e);
    } else if (x.isList()) {
      for (const c10::IValue& e : x.toListRef()) work.push_back(e);
    } else if (x.isGenericDict()) {
      for (const auto& e : x.toGenericDict()) work.push_back(e.value());
    }
  }
  return out;
}

// Same dtype, shape and bytes.
void expect_bitwise_equal(const c10::IValue& a, const c10::IValue& b, const std::string& what) {
  std::vector<at::Tensor> x = flat(a), y = flat(b);
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) {
    at::Tensor p = x[i].contiguous(), q = y[i].contiguous();
    ASSERT_EQ(p.scalar_type(), q.scalar_type()) << what << " output " << i;
    ASSERT_EQ(p.sizes(), q.sizes()) << what << " output " << i;
    EXPECT_EQ(std::memcmp(p.data_ptr(), q.data_ptr(), p.nbytes()), 0) << what << " output " << i;
  }
}

TEST(PlannedInterpreter, RunsEqualUnplannedRunsBitForBitOnTheZoo) {
  at::NoGradGuard no_grad;
  for (const std::string& name : examples::names()) {
    examples::Example e = examples::make(name);
    GraphModule gm = examples::trace(e);
    Interpreter plain(gm);
    Interpreter planned(gm, InterpreterOptions{true});
    ASSERT_NE(planned.memory_plan(), nullptr);
    EXPECT_EQ(plain.memory_plan(), nullptr);
    for (uint64_t seed : {1, 2}) {  // the second run reuses the arena
      std::vector<c10::IValue> inputs = e.make_inputs(seed);
      expect_bitwise_equal(plain.run(inputs), planned.run(inputs), name + " seed " + std::to_string(seed));
    }
  }
}

using examples::CountingAllocator;

// Every operator has an out variant with a CPU kernel of its own.
GraphModule all_out_variants() {
  at::Tensor w = torch::randn({16, 32}), b = torch::randn({32}), c = torch::randn({64});
  return trace(
      [w, b, c](std::vector<c10::IValue> in) -> c10::IValue {
        at::Tensor x = in[0].toTensor();
        at::Tensor h = torch::tanh(torch::addmm(b, x, w));
        h = torch::cat({h * h, torch::sigmoid(h)}, 1);
        return torch::sum(torch::mm(h.t(), h) + c, {1});
      },
      {torch::randn({4, 16})});
}

TEST(PlannedInterpreter, PlannedRunAllocatesNothingForIntermediates) {
  at::NoGradGuard no_grad;
  GraphModule gm = all_out_variants();
  Interpreter plain(gm);
  Interpreter planned(gm, InterpreterOptions{true});
  for (const OperatorPlan& op : planned.planned_operators()) {
    EXPECT_EQ(op.fallback, "") << op.node << " = " << op.target;
  }
  std::vector<c10::IValue> inputs{torch::randn({4, 16})};
  planned.run(inputs);  // makes this thread's arena
  size_t plain_count, planned_count, plain_overwrites;
  {
    CountingAllocator counting;
    plain_overwrites = plain.run_with_stats(inputs).stats.results_over_arguments;
    plain_count = counting.count();
  }
  {
    CountingAllocator counting;
    planned.run(inputs);
    planned_count = counting.count();
  }
  EXPECT_EQ(planned_count, 1u) << "only the output is allocated";
  // Unplanned, each intermediate is a new tensor or is written over an
  // argument that died there (Note [Results written over a dying argument]
  // in src/runtime/plan_passes/overwrites.cpp).
  EXPECT_GE(plain_count + plain_overwrites, planned.memory_plan()->values.size() + 1);
  EXPECT_GT(plain_count, planned_count);
  expect_bitwise_equal(plain.run(inputs), planned.run(inputs), "all_out_variants");
}

TEST(PlannedInterpreter, ThreadsEachGetTheirOwnArena) {
  at::NoGradGuard no_grad;
  examples::Example e = examples::make("mlp");
  GraphModule gm = examples::trace(e);
  Interpreter plain(gm);
  Interpreter planned(gm, InterpreterOptions{true});
  std::vector<std::vector<c10::IValue>> inputs;
  std::vector<c10::IValue> expected;
  for (uint64_t t = 0; t < 4; ++t) {
    inputs.push_back(e.make_inputs(10 + t));
    expected.push_back(plain.run(inputs.back()));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      at::NoGradGuard no_grad_here;
      for (int i = 0; i < 200; ++i) {
        c10::IValue out = planned.run(inputs[t]);
        if (!out.toTensor().equal(expected[t].toTensor())) ++mismatches;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Planned runs of an exported graph that writes its buffers back, from 8
// threads: every update kept, the statistics those of as many eager calls.
TEST(PlannedInterpreter, BufferUpdatesFromEightThreadsMatchEager) {
  examples::Example traced = examples::make("cnn_bn_train");
  examples::Example eager = examples::make("cnn_bn_train");
  GraphModule gm = export_program(*traced.module, traced.forward, traced.make_inputs(0));
  Interpreter planned(gm, InterpreterOptions{true});
  const std::string counter = "bn1.num_batches_tracked", mean = "bn1.running_mean";
  std::vector<c10::IValue> inputs = traced.make_inputs(1);
  constexpr int kThreads = 8, kRuns = 100;
  {
    at::NoGradGuard no_grad;
    for (int r = 0; r < kThreads * kRuns; ++r) eager.forward(inputs);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int r = 0; r < kRuns; ++r) planned.run(inputs);
    });
  }
  for (std::thread& t : threads) t.join();
  at::Tensor eager_counter, eager_mean;
  for (const auto& b : eager.module->named_buffers()) {
    if (b.key() == counter) eager_counter = b.value();
    if (b.key() == mean) eager_mean = b.value();
  }
  // The graph's attributes started from the values before the trace (Note
  // [Attributes written during a trace]), as the fresh eager module did.
  EXPECT_EQ(gm.attribute(counter).value.item<int64_t>(), eager_counter.item<int64_t>());
  EXPECT_TRUE(at::allclose(gm.attribute(mean).value, eager_mean, 1e-5, 1e-6))
      << gm.attribute(mean).value << eager_mean;
}

// Note [Shapes that depend on values]: allowed, such a value and everything
// computed from it are left to allocate; nothing is written past a slice.
TEST(PlannedInterpreter, DataDependentSizesAreNotPlanned) {
  at::NoGradGuard no_grad;
  TraceOptions allow;
  allow.allow_data_dependent_values = true;
  GraphModule gm = trace(
      [](std::vector<c10::IValue> in) -> c10::IValue {
        at::Tensor x = in[0].toTensor();
        at::Tensor idx = torch::nonzero(x);
        at::Tensor scaled = (idx * idx + 1).to(at::kFloat) * 2;
        return torch::sum(scaled) + (x * 3).sum();
      },
      {torch::tensor({1.f, 0.f, 2.f, 0.f, 3.f, 0.f})}, allow);
  Interpreter plain(gm);
  Interpreter planned(gm, InterpreterOptions{true});
  const MemoryPlan& plan = *planned.memory_plan();
  for (const PlannedValue& v : plan.values) {
    EXPECT_NE(v.node, "nonzero");
    EXPECT_NE(v.node, "mul");  // idx * idx
  }
  bool unplanned_noted = false;
  for (const auto& u : plan.unplanned) {
    unplanned_noted = unplanned_noted || u.reason == "its size depends on tensor values";
  }
  EXPECT_TRUE(unplanned_noted);
  // More, then fewer non-zeros than when traced.
  for (at::Tensor x : {torch::tensor({1.f, 1.f, 2.f, 1.f, 3.f, 1.f}), torch::tensor({0.f, 0.f, 2.f, 0.f, 0.f, 0.f}),
                       torch::tensor({1.f, 0.f, 2.f, 0.f, 3.f, 0.f})}) {
    expect_bitwise_equal(plain.run({x}), planned.run({x}), "nonzero");
  }
  // Nothing fell back at run time (composites without an out kernel of
  // their own are listed as such from the start).
  for (const OperatorPlan& op : planned.planned_operators()) {
    EXPECT_EQ(op.fallback.find("its out variant"), std::string::npos) << op.target << ": " << op.fallback;
  }
}

// Note [Planned runs]: a run whose operator fails leaves later runs as they were.
TEST(PlannedInterpreter, AFailedRunDoesNotChangeLaterRuns) {
  at::NoGradGuard no_grad;
  GraphModule gm = trace(
      [](std::vector<c10::IValue> in) -> c10::IValue {
        at::Tensor picked = at::index_select(in[0].toTensor() * 2, 0, in[1].toTensor());
        return picked + 1;
      },
      {torch::randn({4, 3}), torch::tensor({0, 2}, at::kLong)});
  Interpreter planned(gm, InterpreterOptions{true});
  EXPECT_THROW(planned.run({torch::randn({4, 3}), torch::tensor({0, 9}, at::kLong)}), RuntimeError);
  at::Tensor x = torch::randn({4, 3});
  at::Tensor out = planned.run({x, torch::tensor({3, 1}, at::kLong)}).toTensor();
  EXPECT_TRUE(at::allclose(out, at::index_select(x * 2, 0, torch::tensor({3, 1})) + 1));
  bool found = false;
  for (const OperatorPlan& op : planned.planned_operators()) {
    if (op.target != "aten::index_select") continue;
    found = true;
    EXPECT_FALSE(op.out_variant.empty()) << "index_select has no out variant in this plan";
    EXPECT_EQ(op.fallback, "") << "a failed run gave up the out variant for good";
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace torchcap
