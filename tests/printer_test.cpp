// The graph listing, the Python code and the Graphviz pictures, against
// golden text.
#include <torchcap/graph_module.h>
#include <torchcap/printer.h>
#include <torchcap/training.h>

#include "golden.h"
#include "graph/python_literals.h"
#include "sample_graphs.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

namespace torchcap {
namespace {

using testing::meta;
using testing::sample_module;


TEST(Printer, GraphListing) {
  GraphModule gm = sample_module();
  gm.lint();
  testing::expect_golden("printer_graph.txt", gm.graph().str());
}

TEST(Printer, NodeLine) {
  Graph g;
  Node* bias = g.placeholder("bias");
  Node* x = g.placeholder("x");
  Node* t = g.placeholder("t");
  Node* addmm = g.call_function("aten::addmm", {bias, x, t});
  addmm->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 10}));
  g.output({addmm});
  EXPECT_EQ(format_node(*addmm), "%addmm : f32[2, 10] [users=1] = aten::addmm(%bias, %x, %t)");
  EXPECT_EQ(format_node(*g.output_node()), "return (%addmm,)");
  EXPECT_EQ(format_node(*x), "%x : [users=1] = placeholder[target=x]");
}

TEST(Printer, PythonCode) {
  GraphModule gm = sample_module();
  testing::expect_golden("printer_python_code.py", python_code(gm));
}

TEST(Printer, PythonCodeUnpacksNestedInputs) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* a = g.placeholder("ph_0");
  Node* b = g.placeholder("ph_1");
  Node* c = g.placeholder("ph_2");
  Node* s = g.call_function("aten::add.Tensor", {a, b});
  Node* attr = g.get_attr("layer1.0.conv.weight");
  Node* s2 = g.call_function("aten::add.Tensor", {s, c});
  Node* s3 = g.call_function("aten::add.Tensor", {s2, attr});
  g.output({s3});
  // forward(x, (y, {'k': z}), 3, None)
  gm.set_specs(
      TreeSpec::tuple(
          {TreeSpec::leaf(),
           TreeSpec::tuple({TreeSpec::leaf(), TreeSpec::dict({c10::IValue("k")}, {TreeSpec::leaf()})}),
           TreeSpec::constant(3), TreeSpec::none()}),
      TreeSpec::leaf());
  testing::expect_golden("printer_python_nested.py", python_code(gm));
}

TEST(Printer, PythonFloatRepr) {
  EXPECT_EQ(detail::python_float_repr(1.0), "1.0");
  EXPECT_EQ(detail::python_float_repr(0.1), "0.1");
  EXPECT_EQ(detail::python_float_repr(-2.5), "-2.5");
  EXPECT_EQ(detail::python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(detail::python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(detail::python_float_repr(123456789.0), "123456789.0");
  EXPECT_EQ(detail::python_float_repr(1e16), "1e+16");
  EXPECT_EQ(detail::python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(detail::python_float_repr(1.5e300), "1.5e+300");
  EXPECT_EQ(detail::python_float_repr(3.14159), "3.14159");
  EXPECT_EQ(detail::python_float_repr(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(detail::python_float_repr(0.0), "0.0");
  EXPECT_EQ(detail::python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(detail::python_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(detail::python_float_repr(std::nan("")), "nan");
  EXPECT_EQ(detail::python_float_repr(5e-324), "5e-324");
}

TEST(Printer, ArgumentLiterals) {
  EXPECT_EQ(format_argument(Argument()), "None");
  EXPECT_EQ(format_argument(Argument(true)), "True");
  EXPECT_EQ(format_argument(Argument("it's")), "'it\\'s'");
  EXPECT_EQ(format_argument(Argument(c10::kLong)), "torch.int64");
  EXPECT_EQ(format_argument(Argument(c10::kBool)), "torch.bool");
  EXPECT_EQ(format_argument(Argument(c10::MemoryFormat::ChannelsLast)), "torch.channels_last");
  EXPECT_EQ(format_argument(Argument(c10::Device(c10::kCUDA, 1))),
            "device(type='cuda', index=1)");
  EXPECT_EQ(format_argument(Argument(ArgumentList{1, ArgumentList{}, 2.0})), "[1, [], 2.0]");
}

TEST(Printer, IsDeterministic) {
  EXPECT_EQ(sample_module().graph().str(), sample_module().graph().str());
  EXPECT_EQ(python_code(sample_module()), python_code(sample_module()));
}

// --- Pictures (graphviz_picture) ---

ModuleStack stack_of(std::vector<std::pair<std::string, std::string>> frames) {
  std::vector<ModuleFrame> out{{"", "model.Model"}};  // the root, as TorchScript records it
  for (auto& [path, type] : frames) out.push_back({path, type});
  return ModuleStack(std::move(out));
}

const std::pair<std::string, std::string> kBlock{"block", "model.Block"};

// A residual block calling its ReLU twice, then a head:
//   block.conv (Linear: mm, + bias) -> block.relu (ReLU) -> + x -> block.relu again -> head (Linear)
GraphModule block_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  x->meta().val = ValueMeta::tensor(meta(c10::kFloat, {1, 4}));
  Node* w = g.get_attr("block.conv.weight");
  Node* conv = g.call_function("aten::mm", {x, w});
  conv->meta().module_stack = stack_of({kBlock, {"block.conv", "torch.nn.modules.linear.Linear"}});
  Node* b = g.get_attr("block.conv.bias");
  Node* biased = g.call_function("aten::add.Tensor", {conv, b});
  biased->meta().module_stack = conv->meta().module_stack;
  Node* relu = g.call_function("aten::relu", {biased});
  relu->meta().module_stack = stack_of({kBlock, {"block.relu", "torch.nn.modules.activation.ReLU"}});
  Node* add = g.call_function("aten::add.Tensor", {relu, x});
  add->meta().module_stack = stack_of({kBlock});
  Node* relu_1 = g.call_function("aten::relu", {add});
  relu_1->meta().module_stack = relu->meta().module_stack;
  Node* head_w = g.get_attr("head.weight");
  Node* head = g.call_function("aten::mm", {relu_1, head_w});
  head->meta().module_stack = stack_of({{"head", "torch.nn.modules.linear.Linear"}});
  g.output({head});
  g.lint();
  return gm;
}

// The clusters of a picture, as "label" lines in the order they open, each
// indented by its nesting.
std::string cluster_outline(const std::string& source) {
  std::string out;
  int depth = 0;
  std::regex label(R"re(label="([^"]*)"; style)re");
  std::istringstream lines(source);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("subgraph \"cluster_") != std::string::npos) ++depth;
    std::smatch m;
    if (std::regex_search(line, m, label)) out += std::string(2 * (depth - 1), ' ') + m[1].str() + "\n";
    if (line.find_first_not_of(' ') != std::string::npos && line.substr(line.find_first_not_of(' ')) == "}" &&
        depth > 0) {
      --depth;
    }
  }
  return out;
}

// The statements inside the cluster labelled `label` (its first), without
// those of its sub-clusters.
std::string cluster_body(const std::string& source, const std::string& label) {
  size_t at = source.find("label=\"" + label + "\"; style");
  if (at == std::string::npos) return "";
  std::string out;
  int depth = 0;
  std::istringstream lines(source.substr(source.find('\n', at) + 1));
  for (std::string line; std::getline(lines, line);) {
    if (line.find("subgraph") != std::string::npos) ++depth;
    if (line.find_first_not_of(' ') != std::string::npos && line.substr(line.find_first_not_of(' ')) == "}") {
      if (depth-- == 0) break;
      continue;
    }
    if (depth == 0) out += line + "\n";
  }
  return out;
}

TEST(Picture, NodesNestInClustersByModuleCall) {
  GraphModule gm = block_module();
  DotPicture p = graphviz_picture(gm);
  EXPECT_FALSE(p.module_level());
  EXPECT_EQ(p.nodes, 11u);
  EXPECT_EQ(p.folded, 3u);  // each attribute is read once
  EXPECT_EQ(p.drawn, 8u);
  EXPECT_EQ(p.modules, 5u);  // block, block.conv, block.relu twice, head
  // The second call of block.relu is a cluster of its own, after the add.
  EXPECT_EQ(cluster_outline(p.source),
            "block (Block)\n"
            "  block.conv (Linear)\n"
            "  block.relu (ReLU)\n"
            "  block.relu (ReLU)\n"
            "head (Linear)\n");
  // Attributes are named in their reader's box, relative to its module; an
  // operator of the block's own forward is in the block.
  std::string conv = cluster_body(p.source, "block.conv (Linear)");
  EXPECT_NE(conv.find("\"mm\" [label=\"mm\\naten::mm\\nreads: weight\"]"), std::string::npos) << conv;
  EXPECT_NE(conv.find("\\naten::add.Tensor\\nreads: bias\""), std::string::npos) << conv;
  EXPECT_EQ(p.source.find("\"block_conv_weight\""), std::string::npos);
  EXPECT_NE(cluster_body(p.source, "block (Block)").find("\"add_1\""), std::string::npos);
  EXPECT_NE(cluster_body(p.source, "head (Linear)").find("aten::mm\\nreads: weight\""), std::string::npos);
  EXPECT_EQ(p.summary(), "all 11 nodes in 5 module clusters, 3 attributes inside the box of their reader");
  testing::expect_golden("picture_block.dot", p.source);
  EXPECT_EQ(graphviz_dot(gm.graph()), p.source);
  EXPECT_EQ(graphviz_picture(block_module()).source, p.source);
}

TEST(Picture, ModuleLevelDrawsABoxPerModuleAndAnEdgePerCrossing) {
  GraphModule gm = block_module();
  DotOptions options;
  options.depth = 1;
  DotPicture p = graphviz_picture(gm, options);
  EXPECT_TRUE(p.module_level());
  EXPECT_EQ(p.depth, 1);
  EXPECT_EQ(p.modules, 2u);
  EXPECT_EQ(p.others, 2u);  // x and the output
  EXPECT_EQ(p.drawn, 4u);
  EXPECT_EQ(cluster_outline(p.source), "");
  // x feeds the block twice (the Linear and the residual add): one edge. No
  // attribute is drawn; the boxes count their operators.
  std::regex edge(R"re("([^"]+)" -> "([^"]+)";)re");
  std::vector<std::string> edges;
  for (std::sregex_iterator it(p.source.begin(), p.source.end(), edge), end; it != end; ++it) {
    edges.push_back((*it)[1].str() + " -> " + (*it)[2].str());
  }
  EXPECT_EQ(edges, (std::vector<std::string>{"x -> group:0", "group:0 -> group:4", "group:4 -> output"}));
  EXPECT_NE(p.source.find("label=\"block (Block)\\n5 operators\""), std::string::npos) << p.source;
  EXPECT_EQ(p.source.find("weight"), std::string::npos);
  EXPECT_EQ(p.summary(), "2 modules and 2 other nodes of 11 nodes at module depth 1");
  testing::expect_golden("picture_block_depth1.dot", p.source);

  // Depth 2: the block is a cluster holding its children's boxes (two for
  // the two calls of its ReLU) and its own add; the head has no children
  // and stays a box.
  options.depth = 2;
  p = graphviz_picture(gm, options);
  EXPECT_EQ(p.modules, 4u);
  EXPECT_EQ(cluster_outline(p.source), "block (Block)\n");
  std::string block = cluster_body(p.source, "block (Block)");
  EXPECT_NE(block.find("\"add_1\" [label="), std::string::npos) << block;
  EXPECT_NE(block.find("block.relu (ReLU)\\n1 operator\""), std::string::npos) << block;
  EXPECT_NE(p.source.find("\"group:4\" -> \"output\""), std::string::npos) << p.source;
}

TEST(Picture, AnAttributeReadTwiceKeepsItsBox) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* w = g.get_attr("shared.weight");
  Node* a = g.call_function("aten::mm", {x, w});
  Node* b = g.call_function("aten::mm", {a, w});
  g.output({b});
  DotPicture p = graphviz_picture(gm);
  EXPECT_EQ(p.folded, 0u);
  EXPECT_NE(p.source.find("\"shared_weight\" [label=\"shared_weight\\nshared.weight\""), std::string::npos) << p.source;
  EXPECT_NE(p.source.find("\"shared_weight\" -> \"mm_1\";"), std::string::npos);
}

TEST(Picture, TheBudgetChoosesTheDeepestDepthThatFits) {
  GraphModule gm = block_module();
  DotOptions options;
  options.budget = 8;  // every node: 8 boxes, the attributes inside their readers'
  EXPECT_FALSE(graphviz_picture(gm, options).module_level());
  options.budget = 7;  // depth 2 draws 4 modules, the add, x and the output
  DotPicture p = graphviz_picture(gm, options);
  EXPECT_EQ(p.depth, 2);
  EXPECT_FALSE(p.over_budget);
  options.budget = 6;
  p = graphviz_picture(gm, options);
  EXPECT_EQ(p.depth, 1);
  EXPECT_EQ(p.drawn, 4u);
  options.budget = 2;  // nothing fits: the smallest picture, said to be over
  p = graphviz_picture(gm, options);
  EXPECT_EQ(p.depth, 1);
  EXPECT_TRUE(p.over_budget);
  // Every node when asked, whatever the budget.
  options.all_nodes = true;
  p = graphviz_picture(gm, options);
  EXPECT_FALSE(p.module_level());
  EXPECT_TRUE(p.over_budget);
  EXPECT_EQ(p.source, graphviz_picture(gm).source);
}

// Layer i of a dense block reads every earlier layer's output, as
// DenseNet's do: few nodes, but many edges side by side.
GraphModule dense_block(int layers) {
  GraphModule gm;
  Graph& g = gm.graph();
  std::vector<Node*> outputs{g.placeholder("x")};
  for (int i = 0; i < layers; ++i) {
    ArgumentList earlier(outputs.begin(), outputs.end());
    Node* cat = g.call_function("aten::cat", {earlier, 1});
    Node* relu = g.call_function("aten::relu", {cat});
    std::string path = "block.layer" + std::to_string(i);
    cat->meta().module_stack = relu->meta().module_stack = stack_of({{"block", "model.Dense"}, {path, "model.Layer"}});
    outputs.push_back(relu);
  }
  g.output({outputs.back()});
  return gm;
}

TEST(Picture, AWidePictureIsDrawnByModuleThoughItHasFewBoxes) {
  GraphModule gm = dense_block(40);
  DotOptions all;
  all.all_nodes = true;
  DotPicture every = graphviz_picture(gm, all);
  EXPECT_EQ(every.drawn, 82u);
  EXPECT_GT(every.width, DotOptions().max_width);  // about 20 x 20 edges cross the middle
  EXPECT_TRUE(every.over_budget);
  DotPicture p = graphviz_picture(gm);
  EXPECT_EQ(p.depth, 1);  // at depth 2, one box per layer, the edges stay as wide
  EXPECT_LE(p.width, DotOptions().max_width);
  EXPECT_FALSE(p.over_budget);
  EXPECT_LT(graphviz_picture(dense_block(10)).width, DotOptions().max_width);
  EXPECT_FALSE(graphviz_picture(dense_block(10)).module_level());
}

TEST(Picture, NodesWithoutModuleStacksArePlacedByTheAttributesTheyRead) {
  // As a torch::nn model traced from C++ records it.
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* w1 = g.get_attr("layer1.0.fc1.weight");
  Node* t1 = g.call_function("aten::t", {w1});
  Node* mm1 = g.call_function("aten::mm", {x, t1});
  Node* relu = g.call_function("aten::relu", {mm1});
  Node* w2 = g.get_attr("layer1.0.fc2.weight");
  Node* t2 = g.call_function("aten::t", {w2});
  Node* mm2 = g.call_function("aten::mm", {relu, t2});
  Node* top = g.call_function("aten::relu", {mm2});
  g.output({top});
  g.lint();
  DotPicture p = graphviz_picture(gm);
  EXPECT_EQ(cluster_outline(p.source),
            "layer1\n"
            "  layer1.0\n"
            "    layer1.0.fc1\n"
            "    layer1.0.fc2\n");
  // The relu between the two Linears is the block's; the last one, with no
  // neighbour after it, goes to the block too (its input's module's parent).
  EXPECT_NE(cluster_body(p.source, "layer1.0").find("\"relu\""), std::string::npos) << p.source;
  EXPECT_NE(cluster_body(p.source, "layer1.0.fc1").find("\"t\""), std::string::npos);
  EXPECT_NE(cluster_body(p.source, "layer1.0.fc1").find("\"mm\""), std::string::npos);
}

// A training step of a small model with BatchNorm, by optimizer.
GraphModule step_with(Optimizer optimizer) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                              torch::nn::Linear(8, 3));
  model->train();
  TrainingOptions options;
  options.optimizer = optimizer;
  return export_training(model, losses::mse(), {torch::randn({5, 4})}, {torch::randn({5, 3})}, options);
}

TEST(Picture, ATrainingStepHasForwardBackwardAndOptimizerRegions) {
  const std::vector<std::pair<std::string, Optimizer>> optimizers = {
      {"sgd", SGD{0.1}},
      {"sgd momentum weight decay", SGD{0.1, 0.9, 0, 0.01}},
      {"adam", Adam{}},
      {"adamw", AdamW{}},
      {"gradients only", GradientsOnly{}}};
  for (const auto& [name, optimizer] : optimizers) {
    SCOPED_TRACE(name);
    GraphModule step = step_with(optimizer);
    const auto phases = step_phases(step);
    const TrainingSignature sig = training_signature(step);
    const ArgumentList& results = step.graph().output_node()->args()[0].to_list();
    auto phase_of = [&](const Node* n) -> std::string {
      return phases.count(n) != 0 ? step_phase_name(phases.at(n)) : "none";
    };
    std::map<std::string, size_t> count;
    for (const Node* n : step.graph()) {
      std::string phase = phase_of(n);
      ++count[phase];
      if (n->op() == OpCode::Placeholder || n->op() == OpCode::Output) {
        EXPECT_EQ(phase, "none") << n->name();
      } else if (n->target().find("_backward") != std::string::npos || n->target() == "aten::ones_like") {
        EXPECT_EQ(phase, "backward") << format_node(*n);
      } else if (n->target().rfind("optimizer.", 0) == 0) {
        EXPECT_EQ(phase, "optimizer") << format_node(*n);
      } else if (n->target() == "aten::native_batch_norm" || n->target() == "aten::addmm") {
        EXPECT_EQ(phase, "forward") << format_node(*n);
      }
    }
    for (size_t i = 0; i < sig.outputs.size(); ++i) {
      const Node* v = results[i].to_node();
      switch (sig.outputs[i].role) {
        case StepRole::Loss:
        case StepRole::BufferUpdate: EXPECT_EQ(phase_of(v), "forward") << format_node(*v); break;
        case StepRole::ParameterUpdate:
        case StepRole::OptimizerState: EXPECT_EQ(phase_of(v), "optimizer") << format_node(*v); break;
        case StepRole::Gradient: EXPECT_EQ(phase_of(v), "backward") << format_node(*v); break;
        default: break;
      }
    }
    const bool has_optimizer = name != "gradients only";
    EXPECT_EQ(count.count("optimizer") != 0, has_optimizer);
    EXPECT_GT(count["backward"], 5u);

    DotPicture p = graphviz_picture(step);
    EXPECT_TRUE(p.regions);
    std::string outline = cluster_outline(p.source);
    EXPECT_EQ(outline.rfind("forward\n", 0), 0u) << outline;
    EXPECT_NE(outline.find("\nbackward\n"), std::string::npos) << outline;
    EXPECT_EQ(outline.find("\noptimizer\n") != std::string::npos, has_optimizer) << outline;
    // A Graph has no training signature: no regions.
    EXPECT_FALSE(graphviz_picture(step.graph()).regions);
  }
}

TEST(Picture, AStepOverTheBudgetFoldsItsBackwardAndOptimizerIntoABoxEach) {
  GraphModule step = step_with(Adam{});
  DotOptions options;
  options.budget = 12;
  DotPicture p = graphviz_picture(step, options);
  EXPECT_TRUE(p.module_level());
  EXPECT_TRUE(p.collapsed);
  EXPECT_NE(p.source.find("label=\"backward\\n"), std::string::npos) << p.source;
  EXPECT_NE(p.source.find("label=\"optimizer\\n"), std::string::npos) << p.source;
  EXPECT_NE(p.summary().find("the backward pass and the optimizer as one box each"), std::string::npos);
  EXPECT_NE(cluster_outline(p.source).find("forward\n"), std::string::npos);
}

}  // namespace
}  // namespace torchcap
