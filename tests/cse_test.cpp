// Common-subexpression elimination.
#include <torchcap/interpreter.h>
#include <torchcap/passes.h>
#include <torchcap/tracer.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace torchcap {
namespace {

using IValues = std::vector<c10::IValue>;

size_t count_target(const Graph& g, const std::string& target) {
  size_t n = 0;
  for (const Node* node : g) n += node->target() == target ? 1 : 0;
  return n;
}

TEST(CSE, RemovesADuplicatedSubexpressionAndDCECleansUp) {
  auto program = [](IValues in) {
    at::Tensor x = in[0].toTensor();
    at::Tensor a = at::sin(x) * 2;
    at::Tensor b = at::sin(x) * 2;  // the same computation again
    return c10::IValue(a + b);
  };
  GraphModule gm = trace(program, {at::randn({5})});
  EXPECT_EQ(count_target(gm.graph(), "aten::sin"), 2u);
  EXPECT_TRUE(eliminate_common_subexpressions(gm.graph()));
  EXPECT_TRUE(eliminate_dead_code(gm.graph()));  // what CSE orphaned
  EXPECT_EQ(count_target(gm.graph(), "aten::sin"), 1u);
  EXPECT_EQ(count_target(gm.graph(), "aten::mul.Scalar"), 1u);
  gm.lint();
  EXPECT_FALSE(eliminate_common_subexpressions(gm.graph()));
  IValues in = {at::randn({5})};
  EXPECT_TRUE(at::allclose(Interpreter(gm).run(in).toTensor(), program(in).toTensor()));
}

TEST(CSE, KeepsTwoCallsOfARandomOperator) {
  GraphModule gm = trace([](IValues in) {
    at::Tensor x = in[0].toTensor();
    return c10::IValue(at::dropout(x, 0.5, true) + at::dropout(x, 0.5, true) + at::rand({4}) +
                       at::rand({4}));
  }, {at::randn({4})});
  size_t random_before = count_target(gm.graph(), "aten::bernoulli_.float") +
                         count_target(gm.graph(), "aten::rand");
  ASSERT_GE(random_before, 4u) << gm.str();
  eliminate_common_subexpressions(gm.graph());
  eliminate_dead_code(gm.graph());
  EXPECT_EQ(count_target(gm.graph(), "aten::bernoulli_.float") + count_target(gm.graph(), "aten::rand"),
            random_before);
  gm.lint();
}

TEST(CSE, DistinguishesArguments) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* a = g.call_function("aten::add.Scalar", {x, 1});
  Node* b = g.call_function("aten::add.Scalar", {x, 1.0});  // a double, not an int
  Node* c = g.call_function("aten::add.Scalar", {x, 1}, {{"alpha", 2}});
  Node* d = g.call_function("aten::add.Scalar", {x, 1});
  g.output({a, b, c, d});
  EXPECT_TRUE(eliminate_common_subexpressions(g));
  EXPECT_EQ(g.output_node()->args()[0].to_list()[3].to_node(), a);
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(count_target(g, "aten::add.Scalar"), 3u);
}

TEST(CSE, MergesAttributesAndGetItems) {
  Graph g;
  Node* w1 = g.get_attr("w");
  Node* w2 = g.get_attr("w");
  Node* t1 = g.call_function("aten::topk", {w1, 2});
  Node* t2 = g.call_function("aten::topk", {w2, 2});
  g.output({g.getitem(t1, 0), g.getitem(t2, 0)});
  EXPECT_TRUE(eliminate_common_subexpressions(g));
  eliminate_dead_code(g);
  EXPECT_EQ(count_target(g, "w"), 1u);
  EXPECT_EQ(count_target(g, "aten::topk"), 1u);
  EXPECT_EQ(count_target(g, kGetItem), 1u);
}

TEST(CSE, LeavesMutationsAndViewsAlone) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* c1 = g.call_function("aten::clone", {x});
  Node* a1 = g.call_function("aten::add_.Scalar", {c1, 1});
  Node* a2 = g.call_function("aten::add_.Scalar", {c1, 1});  // applies twice: not a duplicate
  Node* v1 = g.call_function("aten::view", {x, ArgumentList{-1}});
  Node* v2 = g.call_function("aten::view", {x, ArgumentList{-1}});
  g.output({a1, a2, v1, v2});
  EXPECT_FALSE(eliminate_common_subexpressions(g));
}

}  // namespace
}  // namespace torchcap
