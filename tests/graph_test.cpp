// Graph and Node: creation, naming, insertion points, the edge write path,
// erase, copy, graphs far longer than any stack, and GraphModule attributes.
#include <torchcap/error.h>
#include <torchcap/graph.h>
#include <torchcap/graph_module.h>
#include <torchcap/printer.h>

#include <ATen/ops/empty_strided.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace torchcap {
namespace {

std::vector<std::string> names(const Graph& g) {
  std::vector<std::string> out;
  for (const Node* n : g) out.push_back(n->name());
  return out;
}

std::vector<std::string> names(c10::ArrayRef<Node*> nodes) {
  std::vector<std::string> out;
  for (const Node* n : nodes) out.push_back(n->name());
  return out;
}

using Names = std::vector<std::string>;

TEST(Graph, CreatesNodesOfEachOpcode) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* w = g.get_attr("fc.weight");
  Node* t = g.call_function("aten::t", {w});
  Node* mm = g.call_function("aten::mm", {x, t});
  Node* top = g.call_function("aten::topk", {mm, 2});
  Node* values = g.getitem(top, 0);
  Node* out = g.output({values});

  EXPECT_EQ(x->op(), OpCode::Placeholder);
  EXPECT_EQ(w->op(), OpCode::GetAttr);
  EXPECT_EQ(w->target(), "fc.weight");
  EXPECT_EQ(w->name(), "fc_weight");
  EXPECT_EQ(t->target(), "aten::t");
  EXPECT_TRUE(t->is_operator());
  EXPECT_EQ(t->schema().name(), "aten::t");
  EXPECT_TRUE(values->is_getitem());
  EXPECT_EQ(values->target(), kGetItem);
  EXPECT_EQ(out->op(), OpCode::Output);
  EXPECT_EQ(g.output_node(), out);
  EXPECT_EQ(g.size(), 7u);
  EXPECT_EQ(names(g), (Names{"x", "fc_weight", "t", "mm", "topk", "getitem", "output"}));
  g.lint();
}

TEST(Graph, ResolvesOverloadsOnce) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* add = g.call_function("aten::add.Tensor", {x, x}, {{"alpha", 2}});
  EXPECT_EQ(add->target(), "aten::add.Tensor");
  EXPECT_EQ(add->op_handle().operator_name().overload_name, "Tensor");
  ASSERT_NE(add->kwarg("alpha"), nullptr);
  EXPECT_EQ(add->kwarg("alpha")->to_int(), 2);
  EXPECT_EQ(add->kwarg("beta"), nullptr);
}

TEST(Graph, RejectsUnknownOperators) {
  Graph g;
  Node* x = g.placeholder("x");
  try {
    g.call_function("aten::no_such_op", {x});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no operator aten::no_such_op is registered"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(g.call_function("add", {x}), Error);  // not qualified
  EXPECT_THROW(g.call_function("aten::add.NoSuchOverload", {x}), Error);
  EXPECT_EQ(g.size(), 1u);
}

TEST(Graph, NamesAreUniqueReadableIdentifiers) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* x2 = g.placeholder("x");
  Node* a = g.call_function("aten::add.Tensor", {x, x2});
  Node* b = g.call_function("aten::add.Tensor", {a, x});
  Node* c = g.call_function("aten::add.Tensor", {b, x});
  Node* s = g.call_function("aten::sum", {c});  // "sum" is a Python builtin
  Node* attr = g.get_attr("layer1.0.conv1.weight");
  Node* d = g.call_function("aten::add.Tensor", {c, x}, {}, "add_1");  // taken: continues the series
  EXPECT_EQ(x2->name(), "x_1");
  EXPECT_EQ(names(g), (Names{"x", "x_1", "add", "add_1", "add_2", "sum_1",
                             "layer1_0_conv1_weight", "add_3"}));
  EXPECT_EQ(attr->target(), "layer1.0.conv1.weight");
  EXPECT_EQ(g.find("add_2"), c);
  EXPECT_EQ(g.find("sum_1"), s);
  EXPECT_EQ(g.find("nope"), nullptr);
  EXPECT_EQ(d->name(), "add_3");
  EXPECT_FALSE(is_valid_node_name("self"));
  EXPECT_FALSE(is_valid_node_name("1x"));
  EXPECT_FALSE(is_valid_node_name("lambda"));
  EXPECT_TRUE(is_valid_node_name("ph_0"));
}

TEST(Graph, AppendsBeforeTheOutputByDefault) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* r = g.call_function("aten::relu", {x});
  g.output({r});
  Node* late = g.call_function("aten::neg", {x});
  EXPECT_EQ(names(g), (Names{"x", "relu", "neg", "output"}));
  EXPECT_EQ(late->next(), g.output_node());
  EXPECT_THROW(g.output({r}), Error);
}

TEST(Graph, ScopedInsertionPoints) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* r = g.call_function("aten::relu", {x});
  g.output({r});
  {
    auto guard = g.inserting_before(r);
    g.call_function("aten::neg", {x});
    g.call_function("aten::sigmoid", {x});
  }
  {
    auto guard = g.inserting_after(r);
    g.call_function("aten::exp", {r});
    g.call_function("aten::sin", {r});
    {
      auto inner = g.inserting_before(x);
      g.placeholder("first");
    }
    g.call_function("aten::cos", {r});  // the outer point is back
  }
  g.call_function("aten::tanh", {x});  // and the default after both guards
  EXPECT_EQ(names(g),
            (Names{"first", "x", "neg", "sigmoid", "relu", "exp", "sin", "cos", "tanh", "output"}));
  EXPECT_EQ(g.insert_point().anchor, nullptr);
}

TEST(Graph, InsertionPointMustBeInThisGraph) {
  Graph g, other;
  Node* y = other.placeholder("y");
  EXPECT_THROW(g.set_insert_point(InsertPoint::before_node(y)), Error);
}

TEST(Graph, SetArgsKeepsUsersConsistent) {
  Graph g;
  Node* a = g.placeholder("a");
  Node* b = g.placeholder("b");
  Node* add = g.call_function("aten::add.Tensor", {a, a});
  EXPECT_EQ(add->inputs(), std::vector<Node*>{a});
  EXPECT_EQ(a->users(), std::vector<Node*>{add});  // once, though used twice

  add->set_args({a, b});
  EXPECT_EQ(add->inputs(), (std::vector<Node*>{a, b}));
  EXPECT_EQ(b->users(), std::vector<Node*>{add});

  add->set_arg(0, b);
  EXPECT_EQ(add->inputs(), std::vector<Node*>{b});
  EXPECT_TRUE(a->users().empty());

  add->set_kwargs({{"alpha", 3}});
  Node* cat = g.call_function("aten::cat", {Argument(ArgumentList{a, b, a})});
  EXPECT_EQ(cat->inputs(), (std::vector<Node*>{a, b}));  // through lists too
  EXPECT_EQ(b->users(), (std::vector<Node*>{add, cat}));
  EXPECT_THROW(add->set_arg(5, a), Error);
}

TEST(Graph, RejectsEdgesToOtherGraphs) {
  Graph g, other;
  Node* x = g.placeholder("x");
  Node* y = other.placeholder("y");
  Node* r = g.call_function("aten::relu", {x});
  EXPECT_THROW(r->set_args({y}), Error);
  EXPECT_EQ(r->args()[0].to_node(), x);  // unchanged on error
  EXPECT_TRUE(y->users().empty());
  EXPECT_THROW(g.call_function("aten::relu", {y}), Error);
  EXPECT_THROW(r->set_args({static_cast<Node*>(nullptr)}), Error);
}

TEST(Graph, ReplaceAllUses) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* a = g.call_function("aten::relu", {x});
  Node* b = g.call_function("aten::neg", {a});
  Node* c = g.call_function("aten::cat", {Argument(ArgumentList{a, b, a})});
  g.output({a, c});
  Node* repl = g.call_function("aten::sigmoid", {x});

  std::vector<Node*> changed = a->replace_all_uses_with(repl);
  EXPECT_EQ(names(changed), (Names{"neg", "cat", "output"}));
  EXPECT_TRUE(a->users().empty());
  EXPECT_EQ(names(repl->users()), (Names{"neg", "cat", "output"}));
  EXPECT_EQ(repl->name(), "sigmoid");
  EXPECT_EQ(c->args()[0].to_list()[2].to_node(), repl);
  EXPECT_THROW(repl->replace_all_uses_with(repl), Error);
  g.erase(a);
  // repl was appended after the nodes it now feeds: fix the order, then lint.
  g.move_before(repl, b);
  g.lint();
}

TEST(Graph, ReplaceInputWith) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* y = g.placeholder("y");
  Node* m = g.call_function("aten::mul.Tensor", {x, x});
  m->replace_input_with(x, y);
  EXPECT_EQ(m->inputs(), std::vector<Node*>{y});
  EXPECT_TRUE(x->users().empty());
}

TEST(Graph, EraseNamesRemainingUsers) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* r = g.call_function("aten::relu", {x});
  Node* n1 = g.call_function("aten::neg", {r});
  Node* n2 = g.call_function("aten::sigmoid", {r});
  g.output({n1, n2});
  try {
    g.erase(r);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "erase: cannot erase %relu because it still has 2 user(s): %neg, %sigmoid; replace "
              "its uses first (replace_all_uses_with)");
  }
  EXPECT_EQ(g.size(), 5u);
  g.erase(g.output_node());
  g.erase(n2);
  EXPECT_EQ(names(r->users()), Names{"neg"});
  g.erase(n1);
  g.erase(r);
  EXPECT_TRUE(x->users().empty());
  EXPECT_EQ(names(g), Names{"x"});
  Graph other;
  EXPECT_THROW(other.erase(x), Error);
  // An erased name can be taken again.
  EXPECT_EQ(g.call_function("aten::relu", {x})->name(), "relu");
}

TEST(Graph, EraseTheInsertionAnchor) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* a = g.call_function("aten::relu", {x});
  Node* b = g.call_function("aten::neg", {x});
  auto guard = g.inserting_before(a);
  g.erase(a);
  g.call_function("aten::sigmoid", {x});
  EXPECT_EQ(names(g), (Names{"x", "sigmoid", "neg"}));
  (void)b;
}

TEST(Graph, CopyIsDeepAndIdentical) {
  Graph g;
  Node* x = g.placeholder("x");
  Node* w = g.get_attr("w");
  Node* mm = g.call_function("aten::mm", {x, w});
  mm->meta().val = ValueMeta::tensor(TensorMeta{c10::kFloat, {2, 3}, {3, 1}, c10::kCPU, nullptr});
  Node* top = g.call_function("aten::topk", {mm, 2}, {{"largest", false}});
  g.output({g.getitem(top, 1)});

  std::unordered_map<const Node*, Node*> map;
  std::unique_ptr<Graph> c = g.copy(&map);
  c->lint();
  EXPECT_EQ(c->str(), g.str());
  EXPECT_EQ(map.at(mm)->owning_graph(), c.get());
  EXPECT_EQ(map.at(mm)->meta().val, mm->meta().val);
  c->erase(c->output_node());
  EXPECT_NE(g.output_node(), nullptr);  // the original is untouched
}

// A node calling an operator holds no copy of its target: every node calling
// it, in any graph, reads the one record of the operator's name.
TEST(Graph, NodesCallingOneOperatorShareItsTarget) {
  Graph g, h;
  Node* x = g.placeholder("x");
  Node* a = g.call_function("aten::add.Tensor", {x, x});
  Node* b = g.call_function("aten::add.Tensor", {a, x});
  Node* other = g.call_function("aten::add.Scalar", {b, 1});
  Node* c = h.call_function("aten::add.Tensor", {h.placeholder("y"), 2});
  EXPECT_EQ(&a->target(), &b->target());
  EXPECT_EQ(&a->target(), &c->target());
  EXPECT_EQ(other->target(), "aten::add.Scalar");
  EXPECT_NE(&other->target(), &a->target());
  g.output({other});
  std::unordered_map<const Node*, Node*> map;
  std::unique_ptr<Graph> copy = g.copy(&map);
  EXPECT_EQ(&map.at(b)->target(), &a->target());
  EXPECT_EQ(map.at(x)->target(), "x");
  copy->lint();
}

// The attribute index views the attributes' own names; growing, replacing,
// cloning and pruning must each leave every name finding its own tensor, short
// names (kept inside the string) and long ones alike.
TEST(GraphModule, AttributesStayFoundAsTheyGrow) {
  GraphModule gm;
  auto name = [](int i) {
    return i % 2 == 0 ? "w" + std::to_string(i) : "layer" + std::to_string(i) + ".block.conv.weight";
  };
  auto value_of = [&](const GraphModule& m, int i) {
    return m.attribute(name(i)).value.item<float>();
  };
  for (int i = 0; i < 300; ++i) {
    gm.set_attribute(name(i), at::full({1}, static_cast<float>(i)), AttributeKind::Parameter);
    for (int j = 0; j <= i; j += 37) ASSERT_EQ(value_of(gm, j), j) << "after adding " << i;
  }
  for (int i = 0; i < 300; ++i) ASSERT_EQ(value_of(gm, i), i);

  gm.set_attribute(name(7), at::full({1}, -7.0f), AttributeKind::Buffer);
  EXPECT_EQ(gm.attributes().size(), 300u);
  EXPECT_EQ(gm.attributes()[7].name, name(7));
  EXPECT_EQ(value_of(gm, 7), -7);
  EXPECT_EQ(gm.attribute(name(7)).kind, AttributeKind::Buffer);

  GraphModule copy = gm.clone();
  GraphModule moved = std::move(gm);
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(value_of(copy, i), i == 7 ? -7 : i);
    ASSERT_EQ(value_of(moved, i), i == 7 ? -7 : i);
  }

  // Keep every third attribute: a get_attr node names it.
  for (int i = 0; i < 300; i += 3) moved.graph().get_attr(name(i));
  EXPECT_EQ(moved.remove_unused_attributes(), 200u);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(moved.has_attribute(name(i)), i % 3 == 0) << name(i);
  for (int i = 0; i < 300; i += 3) ASSERT_EQ(value_of(moved, i), i);
  moved.set_attribute("late", at::full({1}, 1000.0f), AttributeKind::Constant);
  EXPECT_EQ(moved.attribute("late").value.item<float>(), 1000);
  EXPECT_EQ(value_of(moved, 0), 0);
}

// Sizes and strides are kept inline up to five dimensions and on the heap
// beyond; either way a TensorMeta holds exactly the tensor's.
TEST(TensorMeta, RecordsAnyNumberOfDimensions) {
  for (int64_t dims : {0, 2, 5, 6, 9}) {
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
    int64_t stride = 1;
    for (int64_t d = 1; d <= dims; ++d) {  // column-major: not contiguous
      sizes.push_back(d);
      strides.push_back(stride);
      stride *= d;
    }
    at::Tensor t = at::empty_strided(sizes, strides);
    TensorMeta m = TensorMeta::of(t);
    EXPECT_EQ(std::vector<int64_t>(m.sizes.begin(), m.sizes.end()), sizes) << dims;
    EXPECT_EQ(std::vector<int64_t>(m.strides.begin(), m.strides.end()), strides) << dims;
    EXPECT_EQ(m.numel(), t.numel());
    EXPECT_EQ(m.is_contiguous(), t.is_contiguous()) << dims;
    ValueMeta v = ValueMeta::tensor(m);
    EXPECT_EQ(v.tensors[0], m);
    if (dims > 0) {
      v.tensors[0].strides.back() += 1;
      EXPECT_NE(v.tensors[0], m);
    }
  }
  TensorMeta six = TensorMeta::of(at::empty_strided({1, 2, 3, 4, 5, 6}, {720, 360, 120, 30, 6, 1}));
  EXPECT_EQ(six.str(), "f32[1, 2, 3, 4, 5, 6]");
  EXPECT_TRUE(six.is_contiguous());
}

TEST(Graph, HundredThousandNodeChain) {
  constexpr int kLength = 100000;
  auto g = std::make_unique<Graph>();
  Node* prev = g->placeholder("x");
  for (int i = 0; i < kLength; ++i) prev = g->call_function("aten::relu", {prev});
  g->output({prev});
  EXPECT_EQ(g->size(), static_cast<size_t>(kLength + 2));
  g->lint();
  std::string text = g->str();
  EXPECT_NE(text.find("%relu_99999 : [users=1] = aten::relu(%relu_99998)"), std::string::npos);
  std::unique_ptr<Graph> c = g->copy();
  EXPECT_EQ(c->size(), g->size());
  c->lint();
  g.reset();  // destruction walks the list, it does not recurse
  c.reset();
}

}  // namespace
}  // namespace torchcap
