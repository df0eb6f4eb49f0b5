// The interpreter's plan passes (src/runtime/plan_passes.h), each on its own:
// a plan from build_plan, the passes the interpreter runs before it, then the
// pass; what it changed in the plan, and the run's numbers against eager.
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/passes.h>
#include <torchcap/tracer.h>

#include "runtime/plan.h"
#include "runtime/plan_passes.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torchcap {
namespace {

using IValues = std::vector<c10::IValue>;
using detail::InterpreterPlan;
using detail::Slot;

std::unique_ptr<InterpreterPlan> build(const GraphModule& gm, bool plan_memory = false) {
  InterpreterOptions options;
  options.plan_memory = plan_memory;
  return detail::build_plan(gm, options);
}

// Runs, in the interpreter's order, the passes before `pass`; then `pass`,
// and returns what it returned.
bool run_up_to(const std::string& pass, InterpreterPlan& plan, const GraphModule& gm) {
  for (const detail::PlanPass& p : detail::kPlanPasses) {
    if (p.name == pass) return p.run(plan, gm.graph());
    p.run(plan, gm.graph());
  }
  ADD_FAILURE() << "no plan pass " << pass;
  return false;
}

// The plan's operators, in order: "aten::mul.Tensor".
std::vector<std::string> operators(const InterpreterPlan& plan) {
  std::vector<std::string> names;
  for (const detail::Instruction& ins : plan.instructions) {
    const c10::OperatorName& name = ins.op.operator_name();
    names.push_back(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
  }
  return names;
}

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::vector<at::Tensor> run(const InterpreterPlan& plan, const std::vector<at::Tensor>& inputs,
                            RunStats* stats = nullptr) {
  RunStats ignored;
  return detail::run_plan(plan, inputs, stats ? *stats : ignored);
}

// --- use_views_for_copies ------------------------------------------------------
// Note [Views for copies in functional graphs] in src/runtime/plan_passes/views_for_copies.cpp

struct Exported {
  at::Tensor w;
  GraphModule gm;
};

// An exported (functional) graph of x.mm(w.t()).relu(), or, when the
// transpose is to be an output, of (x.relu(), w.t()).
Exported exported_transpose(bool transpose_is_output) {
  at::manual_seed(0);
  Exported e{at::randn({4, 3}), {}};
  ModuleState state;
  state.parameters.emplace_back("w", e.w);
  at::Tensor w = e.w;
  TracedFunction f = [w, transpose_is_output](IValues in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    if (transpose_is_output) return c10::ivalue::Tuple::create({x.relu(), w.t()});
    return x.mm(w.t()).relu();
  };
  e.gm = export_program(state, f, {at::randn({2, 3})});
  return e;
}

TEST(ViewsForCopies, ACopyThatIsNoOutputRunsAsItsView) {
  Exported e = exported_transpose(false);
  ASSERT_TRUE(is_functional(e.gm.graph()));
  auto plan = build(e.gm);
  ASSERT_TRUE(has(operators(*plan), "aten::t_copy"));
  EXPECT_TRUE(run_up_to("use_views_for_copies", *plan, e.gm));
  EXPECT_FALSE(has(operators(*plan), "aten::t_copy"));
  EXPECT_TRUE(has(operators(*plan), "aten::t"));
  at::Tensor x = at::randn({2, 3});
  EXPECT_TRUE(at::equal(run(*plan, {x})[0], x.mm(e.w.t()).relu()));
}

TEST(ViewsForCopies, NotForAnOutputNorInAPlannedPlan) {
  Exported e = exported_transpose(true);
  ASSERT_TRUE(is_functional(e.gm.graph()));
  auto plan = build(e.gm);
  std::vector<std::string> before = operators(*plan);
  ASSERT_TRUE(has(before, "aten::t_copy"));
  EXPECT_FALSE(run_up_to("use_views_for_copies", *plan, e.gm));
  EXPECT_EQ(operators(*plan), before);
  at::Tensor x = at::randn({2, 3});
  std::vector<at::Tensor> out = run(*plan, {x});
  EXPECT_TRUE(at::equal(out[0], x.relu()));
  EXPECT_TRUE(at::equal(out[1], e.w.t()));
  EXPECT_FALSE(out[1].is_alias_of(e.w));  // a copy: no output aliases an attribute

  Exported planned = exported_transpose(false);
  auto planned_plan = build(planned.gm, /*plan_memory=*/true);
  EXPECT_FALSE(run_up_to("use_views_for_copies", *planned_plan, planned.gm));
  EXPECT_TRUE(has(operators(*planned_plan), "aten::t_copy"));
  EXPECT_TRUE(at::equal(run(*planned_plan, {x})[0], x.mm(planned.w.t()).relu()));
}

// --- fold_views_of_attributes --------------------------------------------------
// Note [Views of attributes, computed once] in src/runtime/plan_passes/fold_views.cpp

TEST(FoldViews, AViewOfAnAttributeBecomesAnAttribute) {
  at::Tensor w = at::randn({4, 3});
  ModuleState state;
  state.parameters.emplace_back("w", w);
  GraphModule gm = trace(state, [&w](IValues in) { return c10::IValue(in[0].toTensor().mm(w.t()) * 2); },
                         {at::randn({2, 3})});
  auto plan = build(gm);
  ASSERT_EQ(operators(*plan), (std::vector<std::string>{"aten::t", "aten::mm", "aten::mul.Scalar"}));
  const size_t attributes = plan->attributes.size();
  EXPECT_TRUE(run_up_to("fold_views_of_attributes", *plan, gm));
  EXPECT_EQ(operators(*plan), (std::vector<std::string>{"aten::mm", "aten::mul.Scalar"}));
  ASSERT_EQ(plan->attributes.size(), attributes + 1);
  const at::Tensor& folded = plan->attributes.back();
  EXPECT_TRUE(folded.is_alias_of(w));  // a view, computed once
  EXPECT_EQ(folded.strides(), w.t().strides());
  // mm reads it; the values left are numbered without a hole.
  EXPECT_EQ(plan->instructions[0].args[1].kind, Slot::Kind::Attribute);
  EXPECT_EQ(plan->instructions[0].out, 0);
  EXPECT_EQ(plan->num_values, 2);
  EXPECT_EQ(plan->node_infos.size(), 2u);
  at::Tensor x = at::randn({2, 3});
  EXPECT_TRUE(at::equal(run(*plan, {x})[0], x.mm(w.t()) * 2));
}

TEST(FoldViews, NotAViewOfAnInput) {
  GraphModule gm = trace([](IValues in) { return c10::IValue(in[0].toTensor().t() * 2); }, {at::randn({2, 3})});
  auto plan = build(gm);
  std::vector<std::string> before = operators(*plan);
  EXPECT_FALSE(run_up_to("fold_views_of_attributes", *plan, gm));
  EXPECT_EQ(operators(*plan), before);
  EXPECT_TRUE(has(before, "aten::t"));
  at::Tensor x = at::randn({2, 3});
  EXPECT_TRUE(at::equal(run(*plan, {x})[0], x.t() * 2));
}

// --- use_tensor_forms_of_scalar_operators --------------------------------------
// Note [Scalar operators as Tensor operators] in src/runtime/plan_passes/scalar_operators.cpp

TEST(ScalarOperators, AConstantScalarIsMadeATensorOnce) {
  auto f = [](IValues in) { return c10::IValue(in[0].toTensor() * 0.1); };
  GraphModule gm = trace(f, {at::randn({5})});
  auto plan = build(gm);
  ASSERT_EQ(operators(*plan), std::vector<std::string>{"aten::mul.Scalar"});
  EXPECT_TRUE(run_up_to("use_tensor_forms_of_scalar_operators", *plan, gm));
  ASSERT_EQ(operators(*plan), std::vector<std::string>{"aten::mul.Tensor"});
  const c10::IValue& operand = plan->instructions[0].args[1].constant;
  ASSERT_TRUE(operand.isTensor());
  EXPECT_EQ(operand.toTensor().dim(), 0);
  EXPECT_EQ(operand.toTensor().scalar_type(), at::kFloat);  // the result's dtype
  EXPECT_TRUE(operand.toTensor().unsafeGetTensorImpl()->is_wrapped_number());
  at::Tensor x = at::randn({5});
  EXPECT_TRUE(at::equal(run(*plan, {x})[0], f({x}).toTensor()));
}

TEST(ScalarOperators, NotForTensorOperandsNorInAPlannedPlan) {
  auto product = [](IValues in) { return c10::IValue(in[0].toTensor() * in[1].toTensor()); };
  GraphModule tensors = trace(product, {at::randn({5}), at::randn({5})});
  auto plan = build(tensors);
  EXPECT_FALSE(run_up_to("use_tensor_forms_of_scalar_operators", *plan, tensors));
  EXPECT_EQ(operators(*plan), std::vector<std::string>{"aten::mul.Tensor"});
  at::Tensor x = at::randn({5}), y = at::randn({5});
  EXPECT_TRUE(at::equal(run(*plan, {x, y})[0], x * y));

  auto scaled = [](IValues in) { return c10::IValue(in[0].toTensor() * 0.1); };
  GraphModule gm = trace(scaled, {at::randn({5})});
  auto planned = build(gm, /*plan_memory=*/true);
  EXPECT_FALSE(run_up_to("use_tensor_forms_of_scalar_operators", *planned, gm));
  EXPECT_EQ(operators(*planned), std::vector<std::string>{"aten::mul.Scalar"});
  EXPECT_TRUE(at::equal(run(*planned, {x})[0], x * 0.1));
}

// --- write_updates_in_place ----------------------------------------------------
// Note [Updates written in place] in src/runtime/plan_passes/updates_in_place.cpp

// An exported graph that updates its buffer `buf` (initially 2) by `fn`.
GraphModule updates_buffer(const std::function<c10::IValue(at::Tensor&, const at::Tensor&)>& fn) {
  ModuleState state;
  state.buffers.emplace_back("buf", at::full({3}, 2.0));
  at::Tensor buf = state.buffers[0].second;
  return export_program(state, [&](IValues in) { return fn(buf, in[0].toTensor()); }, {at::zeros({3})});
}

TEST(UpdatesInPlace, TheUpdateWritesIntoTheBuffer) {
  GraphModule gm = updates_buffer([](at::Tensor& buf, const at::Tensor& x) {
    buf.mul_(0.5).add_(x);
    return c10::IValue(buf * 3);
  });
  at::Tensor buf = gm.attribute("buf").value;
  auto plan = build(gm);
  ASSERT_EQ(plan->write_backs.size(), 1u);
  EXPECT_TRUE(run_up_to("write_updates_in_place", *plan, gm));
  EXPECT_TRUE(plan->write_backs[0].in_place);
  // Both steps of the update, mul then add, write into the buffer.
  size_t into_buffer = 0;
  for (const detail::Instruction& ins : plan->instructions) into_buffer += ins.into.is_same(buf) ? 1 : 0;
  EXPECT_EQ(into_buffer, 2u);

  at::Tensor before = buf.clone();
  const void* data = buf.data_ptr();
  at::Tensor x = at::arange(3, at::kFloat);
  at::Tensor expected = before.mul(0.5).add(x);
  at::Tensor out = run(*plan, {x})[0];
  EXPECT_TRUE(at::equal(buf, expected)) << buf;
  EXPECT_TRUE(at::equal(out, expected * 3)) << out;
  EXPECT_EQ(buf.data_ptr(), data);
}

TEST(UpdatesInPlace, NotWhenTheNewValueIsAlsoReturned) {
  GraphModule gm = updates_buffer([](at::Tensor& buf, const at::Tensor& x) {
    buf.add_(x);
    return c10::IValue(buf);  // returned and written back: the same value twice
  });
  at::Tensor buf = gm.attribute("buf").value;
  auto plan = build(gm);
  EXPECT_FALSE(run_up_to("write_updates_in_place", *plan, gm));
  EXPECT_FALSE(plan->write_backs[0].in_place);
  for (const detail::Instruction& ins : plan->instructions) EXPECT_FALSE(ins.into.defined());

  at::Tensor before = buf.clone();
  at::Tensor x = at::arange(3, at::kFloat);
  at::Tensor out = run(*plan, {x})[0];
  EXPECT_TRUE(at::equal(buf, before + x));
  EXPECT_TRUE(at::equal(out, before + x));
  EXPECT_FALSE(out.is_alias_of(buf));
}

// --- free_values_after_last_use ------------------------------------------------
// Note [Freeing values after their last use] in src/runtime/plan_passes/frees.cpp

TEST(Frees, EachValueIsReleasedAfterItsLastUse) {
  auto f = [](IValues in) { return c10::IValue(at::sin(in[0].toTensor()) * in[0].toTensor() + 1); };
  GraphModule gm = trace(f, {at::randn({4})});
  auto plan = build(gm);
  ASSERT_EQ(plan->instructions.size(), 3u);  // sin, mul, add
  EXPECT_TRUE(run_up_to("free_values_after_last_use", *plan, gm));
  const auto& ins = plan->instructions;
  EXPECT_EQ(ins[0].frees, std::vector<int32_t>{});
  EXPECT_EQ(ins[1].frees, std::vector<int32_t>{ins[0].out});  // sin's value, read by mul only
  EXPECT_EQ(ins[2].frees, std::vector<int32_t>{ins[1].out});
  EXPECT_FALSE(detail::free_values_after_last_use(*plan));  // again: nothing to change
  at::Tensor x = at::randn({4});
  RunStats stats;
  EXPECT_TRUE(at::equal(run(*plan, {x}, &stats)[0], f({x}).toTensor()));
  EXPECT_EQ(stats.peak_live_values, 2u);
}

TEST(Frees, NotAValueThatIsReturned) {
  auto f = [](IValues in) {
    at::Tensor a = in[0].toTensor() * 2;
    return c10::IValue(c10::ivalue::Tuple::create({a, a + 1}));
  };
  GraphModule gm = trace(f, {at::randn({4})});
  auto plan = build(gm);
  EXPECT_FALSE(run_up_to("free_values_after_last_use", *plan, gm));
  for (const detail::Instruction& i : plan->instructions) EXPECT_TRUE(i.frees.empty());
  at::Tensor x = at::randn({4});
  std::vector<at::Tensor> out = run(*plan, {x});
  EXPECT_TRUE(at::equal(out[0], x * 2));
  EXPECT_TRUE(at::equal(out[1], x * 2 + 1));
}

// --- write_results_over_dying_arguments ----------------------------------------
// Note [Results written over a dying argument] in src/runtime/plan_passes/overwrites.cpp

TEST(Overwrites, AnElementwiseResultMayGoIntoAnArgumentThatDiesThere) {
  auto f = [](IValues in) { return c10::IValue(at::relu(in[0].toTensor() * 2) * 3); };
  GraphModule gm = trace(f, {at::randn({4, 5})});
  auto plan = build(gm);
  EXPECT_TRUE(run_up_to("write_results_over_dying_arguments", *plan, gm));
  const auto& ins = plan->instructions;
  ASSERT_EQ(ins.size(), 3u);  // mul, relu, mul
  EXPECT_FALSE(ins[0].overwrite);  // its argument is the input
  ASSERT_TRUE(ins[1].overwrite);
  EXPECT_EQ(ins[1].overwrite->args, std::vector<int32_t>{0});
  ASSERT_TRUE(ins[2].overwrite);
  EXPECT_EQ(ins[2].overwrite->args, std::vector<int32_t>{0});
  at::Tensor x = at::randn({4, 5});
  at::Tensor before = x.clone();
  RunStats stats;
  EXPECT_TRUE(at::equal(run(*plan, {x}, &stats)[0], f({before}).toTensor()));
  EXPECT_EQ(stats.results_over_arguments, 2u);
  EXPECT_TRUE(at::equal(x, before));  // the input is never written
}

TEST(Overwrites, NotOverAnArgumentThatLivesOn) {
  auto f = [](IValues in) {
    at::Tensor a = in[0].toTensor() * 2;
    return c10::IValue(c10::ivalue::Tuple::create({a, at::relu(a)}));  // a is returned
  };
  GraphModule gm = trace(f, {at::randn({6})});
  auto plan = build(gm);
  EXPECT_FALSE(run_up_to("write_results_over_dying_arguments", *plan, gm));
  for (const detail::Instruction& i : plan->instructions) EXPECT_FALSE(i.overwrite);
  at::Tensor x = at::randn({6});
  RunStats stats;
  std::vector<at::Tensor> out = run(*plan, {x}, &stats);
  EXPECT_TRUE(at::equal(out[0], x * 2));
  EXPECT_TRUE(at::equal(out[1], at::relu(x * 2)));
  EXPECT_EQ(stats.results_over_arguments, 0u);
}

}  // namespace
}  // namespace torchcap
