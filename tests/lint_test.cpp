// Graph::lint and GraphModule::lint: each broken invariant with its message.
#include <torchcap/error.h>
#include <torchcap/graph.h>
#include <torchcap/graph_module.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/library.h>

namespace torchcap {

// Reaches into graphs to break invariants the public API protects.
struct GraphTestPeer {
  static void set_graph(Node* n, Graph* g) { n->graph_ = g; }
  static void set_name(Node* n, const std::string& name) { n->name_ = name; }
  static void drop_user(Node* n) { n->users_.clear(); }
  static void add_user(Node* n, Node* u) { n->users_.push_back(u); }
  static void set_inputs(Node* n, std::vector<Node*> in) { n->inputs_ = std::move(in); }
};

namespace {

std::string lint_message(const Graph& g) {
  try {
    g.lint();
  } catch (const LintError& e) {
    return e.what();
  }
  return "";
}

std::string lint_message(const GraphModule& gm) {
  try {
    gm.lint();
  } catch (const LintError& e) {
    return e.what();
  }
  return "";
}

// x -> relu -> output
struct Small {
  Graph g;
  Node* x = g.placeholder("x");
  Node* relu = g.call_function("aten::relu", {x});
  Node* out = g.output({relu});
};

TEST(Lint, AcceptsAWellFormedGraph) {
  Small s;
  EXPECT_EQ(lint_message(s.g), "");
}

TEST(Lint, Ownership) {
  Small s;
  Graph other;
  GraphTestPeer::set_graph(s.x, &other);
  EXPECT_EQ(lint_message(s.g), "lint: node %x is owned by a different graph");
  GraphTestPeer::set_graph(s.x, &s.g);
}

TEST(Lint, ArgumentFromAnotherGraph) {
  Small s;
  Graph other;
  Node* y = other.placeholder("y");
  GraphTestPeer::set_graph(y, &s.g);  // sneak the edge past set_args
  s.relu->set_args({y});
  GraphTestPeer::set_graph(y, &other);
  EXPECT_EQ(lint_message(s.g), "lint: argument %y of %relu belongs to a different graph");
  GraphTestPeer::set_graph(y, &s.g);
  s.relu->set_args({s.x});
  GraphTestPeer::set_graph(y, &other);
}

TEST(Lint, DuplicateNames) {
  Small s;
  GraphTestPeer::set_name(s.relu, "x");
  EXPECT_EQ(lint_message(s.g), "lint: two nodes are named 'x'");
}

TEST(Lint, InvalidName) {
  Small s;
  GraphTestPeer::set_name(s.relu, "not valid");
  EXPECT_EQ(lint_message(s.g),
            "lint: node name 'not valid' is not a valid, unreserved Python identifier");
}

TEST(Lint, NameTable) {
  Small s;
  GraphTestPeer::set_name(s.relu, "renamed");
  EXPECT_EQ(lint_message(s.g), "lint: node %renamed is missing from the graph's name table");
}

TEST(Lint, InputsDriftFromArguments) {
  Small s;
  GraphTestPeer::set_inputs(s.relu, {});
  EXPECT_EQ(lint_message(s.g), "lint: the inputs of %relu do not match its arguments");
  GraphTestPeer::set_inputs(s.relu, {s.x});
}

TEST(Lint, MissingUser) {
  Small s;
  GraphTestPeer::drop_user(s.x);
  EXPECT_EQ(lint_message(s.g), "lint: node %relu uses %x but is not listed once among its users");
  GraphTestPeer::add_user(s.x, s.relu);
}

TEST(Lint, SpuriousUser) {
  Small s;
  Node* neg = s.g.call_function("aten::neg", {s.relu});
  GraphTestPeer::add_user(s.x, neg);
  EXPECT_EQ(lint_message(s.g), "lint: node %x lists %neg as a user, but %neg does not use it");
  GraphTestPeer::drop_user(s.x);
  GraphTestPeer::add_user(s.x, s.relu);
}

TEST(Lint, UseBeforeDefinition) {
  Small s;
  Node* neg = s.g.call_function("aten::neg", {s.x});
  s.relu->set_args({neg});
  EXPECT_EQ(lint_message(s.g),
            "lint: node %relu uses %neg before it is defined (graph is not in topological order)");
}

TEST(Lint, SelfUse) {
  Small s;
  s.relu->set_args({s.relu});
  EXPECT_EQ(lint_message(s.g), "lint: node %relu uses itself");
  s.relu->set_args({s.x});
}

TEST(Lint, PlaceholderAfterOtherNodes) {
  Small s;
  Node* late = s.g.placeholder("late");
  EXPECT_EQ(lint_message(s.g), "lint: placeholder %late comes after non-placeholder nodes");
  (void)late;
}

TEST(Lint, NodeAfterOutput) {
  Small s;
  Node* after = nullptr;
  {
    auto guard = s.g.inserting_after(s.out);
    after = s.g.call_function("aten::neg", {s.x});
  }
  EXPECT_EQ(lint_message(s.g), "lint: node %neg comes after the output node %output");
  (void)after;
}

TEST(Lint, MissingOutput) {
  Graph g;
  g.placeholder("x");
  EXPECT_EQ(lint_message(g), "lint: the graph has no output node");
}

TEST(Lint, OutputOfNonTensor) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* top = g.call_function("aten::topk", {x, 2});
  g.output({top});
  EXPECT_EQ(lint_message(g),
            "lint: output %output returns node %topk; results must be Tensor nodes or none");
}

TEST(Lint, TooManyPositionalArguments) {
  Small s;
  s.relu->set_args({s.x, 1});
  EXPECT_EQ(lint_message(s.g),
            "lint: node %relu: aten::relu takes at most 1 positional argument(s), got 2");
}

TEST(Lint, KwargOnlyGivenPositionally) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* add = g.call_function("aten::add.Tensor", {x, x, 2});  // alpha is keyword-only
  g.output({add});
  EXPECT_EQ(lint_message(g),
            "lint: node %add: aten::add.Tensor takes at most 2 positional argument(s), got 3");
}

TEST(Lint, UnknownKeyword) {
  Small s;
  s.relu->set_kwargs({{"inplace", true}});
  EXPECT_EQ(lint_message(s.g), "lint: node %relu: aten::relu has no argument named 'inplace'");
}

TEST(Lint, ArgumentGivenTwice) {
  Small s;
  s.relu->set_kwargs({{"self", s.x}});
  EXPECT_EQ(lint_message(s.g),
            "lint: node %relu: aten::relu got argument 'self' both positionally and by keyword");
}

TEST(Lint, MissingRequiredArgument) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* mm = g.call_function("aten::mm", {x});
  g.output({mm});
  EXPECT_EQ(lint_message(g), "lint: node %mm: aten::mm is missing required argument 'mat2'");
}

TEST(Lint, WrongArgumentType) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* add = g.call_function("aten::add.Tensor", {x, "two"});
  g.output({add});
  EXPECT_EQ(lint_message(g),
            "lint: node %add: argument 'other' of aten::add.Tensor expects Tensor, got str");
  add->set_args({x, ArgumentList{x}});
  EXPECT_EQ(lint_message(g),
            "lint: node %add: argument 'other' of aten::add.Tensor expects Tensor, got list");
  add->set_args({x, x});
  add->set_kwargs({{"alpha", c10::kFloat}});
  EXPECT_EQ(lint_message(g),
            "lint: node %add: argument 'alpha' of aten::add.Tensor expects Scalar, got dtype");
}

TEST(Lint, ListElementTypes) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* v = g.call_function("aten::view", {x, ArgumentList{2, 1.5}});
  g.output({v});
  EXPECT_EQ(lint_message(g),
            "lint: node %view: argument 'size' of aten::view expects SymInt[], got list");
  v->set_args({x, ArgumentList{2, -1}});
  EXPECT_EQ(lint_message(g), "");
}

TEST(Lint, MultiOutputNodeUsedAsTensor) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* top = g.call_function("aten::topk", {x, 2});
  Node* r = g.call_function("aten::relu", {top});
  g.output({r});
  EXPECT_EQ(lint_message(g),
            "lint: node %relu: argument 'self' of aten::relu expects Tensor, got a node with "
            "several outputs (use getitem)");
}

TEST(Lint, GetItemOutOfRange) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* top = g.call_function("aten::topk", {x, 2});
  Node* item = g.getitem(top, 2);
  g.output({item});
  EXPECT_EQ(lint_message(g),
            "lint: node %getitem: getitem index 2 is out of range for %topk, which has 2 values");
}

TEST(Lint, GetItemOfSingleValue) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* r = g.call_function("aten::relu", {x});
  Node* item = g.getitem(r, 0);
  g.output({item});
  EXPECT_EQ(lint_message(g),
            "lint: node %getitem: getitem reads %relu, which has a single value (a Tensor node)");
}

TEST(Lint, DeregisteredOperator) {
  Graph g;
  Node* x = g.placeholder("x");
  {
    auto def = c10::Dispatcher::singleton().registerDef(
        torch::schema("torchcap_test::scratch(Tensor self) -> Tensor"), "lint_test");
    Node* call = g.call_function("torchcap_test::scratch", {x});
    g.output({call});
    EXPECT_EQ(lint_message(g), "");
  }
  EXPECT_EQ(lint_message(g),
            "lint: node %scratch calls torchcap_test::scratch, which is not a registered operator");
}

TEST(Lint, GraphModuleAttributesAndSpecs) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* w = g.get_attr("fc.weight");
  Node* mm = g.call_function("aten::mm", {x, w});
  g.output({mm});
  gm.set_flat_specs();
  EXPECT_EQ(lint_message(gm),
            "lint: get_attr %fc_weight reads attribute 'fc.weight', which the GraphModule does "
            "not have");
  gm.set_attribute("fc.weight", at::Tensor(), AttributeKind::Parameter);
  EXPECT_EQ(lint_message(gm), "");
  gm.in_spec = TreeSpec::tuple({TreeSpec::leaf(), TreeSpec::leaf()});
  EXPECT_EQ(lint_message(gm),
            "lint: the graph has 1 placeholders but the input spec (*, *) has 2 tensors");
  gm.set_flat_specs();
  gm.out_spec = TreeSpec::tuple({});
  EXPECT_EQ(lint_message(gm),
            "lint: the output returns 1 tensors and 0 none(s); the output spec () expects 0 "
            "tensors");
}

}  // namespace
}  // namespace torchcap
