// Dead-code elimination.
#include <torchcap/graph.h>
#include <torchcap/passes.h>

#include <gtest/gtest.h>

namespace torchcap {
namespace {

std::vector<std::string> names(const Graph& g) {
  std::vector<std::string> out;
  for (const Node* n : g) out.push_back(n->name());
  return out;
}
using Names = std::vector<std::string>;

TEST(DeadCode, RemovesUnusedChainsInOnePass) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* unused_in = g.placeholder("unused_in");
  Node* w = g.get_attr("w");
  Node* dead1 = g.call_function("aten::mul.Tensor", {x, w});
  g.call_function("aten::relu", {dead1});  // dead, and makes dead1 dead
  Node* live = g.call_function("aten::neg", {x});
  g.output({live});
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(names(g), (Names{"x", "unused_in", "neg", "output"}));  // placeholders stay
  EXPECT_FALSE(eliminate_dead_code(g));
  g.lint();
  (void)unused_in;
}

TEST(DeadCode, KeepsOpsThatWriteArguments) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* buf = g.get_attr("running_mean");
  Node* c = g.call_function("aten::clone", {x});
  g.call_function("aten::add_.Tensor", {buf, c});        // in place: unused result, kept
  Node* y = g.call_function("aten::mul.Tensor", {x, x});  // dead
  g.call_function("aten::relu", {y});                     // dead
  Node* out_buf = g.call_function("aten::empty.memory_format", {Argument(ArgumentList{2})});
  g.call_function("aten::neg.out", {x}, {{"out", out_buf}});  // out=: writes out_buf, kept
  g.output({x});
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(names(g), (Names{"x", "running_mean", "clone", "add_", "empty", "neg", "output"}));
  g.lint();
}

TEST(DeadCode, NothingToRemove) {
  Graph g;
  Node* x = g.placeholder("x");
  g.output({g.call_function("aten::relu", {x})});
  EXPECT_FALSE(eliminate_dead_code(g));
  EXPECT_EQ(g.size(), 3u);
}

TEST(DeadCode, LongDeadChain) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* prev = x;
  for (int i = 0; i < 100000; ++i) prev = g.call_function("aten::relu", {prev});
  g.output({x});
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(g.size(), 2u);
}

}  // namespace
}  // namespace torchcap
