// Printing graphs: the torch.fx-style listing and Python source.
//
// Both are deterministic: the same graph always prints the same text, so tests
// compare them with golden files.
#pragma once

#include <torchcap/graph.h>

#include <cstdint>
#include <string>
#include <unordered_map>

namespace torchcap {

class GraphModule;

// One line in torch.fx's style:
//   %addmm : f32[2, 10] [users=1] = aten::addmm(%bias, %x, %t)
std::string format_node(const Node& n);
// "%name" for nodes, Python literals for constants, "[...]" for lists.
std::string format_argument(const Argument& a);

struct PrintOptions {
  // Before each operator node, a comment saying where it came from, as
  // torch.export prints it: its innermost module and its user's source line,
  //   # layer1.0.conv1 (Conv2d), File: resnet.py:71 in forward, code: out = self.conv1(x)
  // (nodes without either get none). Symbolizes C++ stack traces.
  bool source = false;
};

// The whole graph: "graph():" then one indented line per node.
std::string format_graph(const Graph& g, const PrintOptions& options = {});

// Python source of a module-level function
//   def forward(self, ph_0, ph_1): ...
// calling `torch.ops.aten.<op>.<overload>` and `operator.getitem`, reading
// attributes as `self.<path>`, unpacking nested inputs and building nested
// outputs by the GraphModule's specs. Values are released after their last
// use, as torch.fx does. The text starts with the imports it needs; executing
// it defines `forward`, which `torch.fx.symbolic_trace` turns into a
// GraphModule once it is bound to a module holding the attributes.
std::string python_code(const GraphModule& gm);

}  // namespace torchcap

namespace torchcap {

// --- Pictures: the graph as Graphviz source (src/graph/dot.cpp) ---
//
// Nodes are grouped by the module calls that made them (NodeMeta's
// module_stack) as nested clusters labelled "layer1.0 (BasicBlock)"; nodes
// without a module stack are placed by the parameters they read (Note
// [Modules of nodes without a module stack] in src/graph/dot.cpp). An
// attribute read by one operator is named inside that operator's box. A
// training step's nodes are grouped first into forward, backward and
// optimizer regions (step_phases). Graphviz's layout time grows much faster
// than the picture, so a graph beyond a budget is drawn one box per module
// at the deepest module depth that fits it, with an edge wherever a value
// crosses between boxes. Deterministic; render with `dot -Tsvg`.

struct DotOptions {
  // A graph is drawn at module level when its picture would have more boxes
  // than `budget`, or more than `max_width` boxes and edges side by side at
  // its widest (what Graphviz's time follows: Note [What makes a picture
  // slow to draw] in src/graph/dot.cpp). Both keep dot within seconds on the
  // pictures measured in docs/benchmarks.md. 0: no limit.
  size_t budget = 2000;
  size_t max_width = 200;
  // Draw the modules at this depth as boxes (1: the model's children),
  // whatever the budget; 0 chooses the deepest that fits the budget.
  int depth = 0;
  // Draw every node, whatever the budget.
  bool all_nodes = false;
};

// What a picture shows, for saying so.
struct DotPicture {
  std::string source;        // the Graphviz source
  size_t nodes = 0;          // the graph's nodes
  size_t drawn = 0;          // boxes drawn: nodes, or modules and the nodes outside them
  size_t modules = 0;        // module boxes (module level) or module clusters (node level)
  size_t others = 0;         // module level: nodes drawn as themselves (inputs, outputs, ...)
  size_t folded = 0;         // node level: attributes drawn inside the box of their one reader
  int depth = 0;             // module level: the boxes' module depth; 0: every node drawn
  size_t width = 0;          // boxes and edges side by side at the widest rank (an estimate)
  bool over_budget = false;  // beyond the budget (asked for, or nothing to group by)
  bool regions = false;      // a training step's forward, backward and optimizer regions
  bool collapsed = false;    // the backward and optimizer regions drawn as one box each

  bool module_level() const { return depth > 0; }
  // "13 modules and 5 other nodes of 1,922 nodes at module depth 2", "all 195
  // nodes in 56 module clusters, 102 attributes inside the box of their reader".
  std::string summary() const;
};

DotPicture graphviz_picture(const Graph& g, const DotOptions& options = {});
// A training step (is_training_step) gets its regions.
DotPicture graphviz_picture(const GraphModule& gm, const DotOptions& options = {});
// graphviz_picture(g, options).source.
std::string graphviz_dot(const Graph& g, const DotOptions& options = {});

// Which part of a training step made each node: its forward pass (with the
// loss), the backward pass autograd ran, or the optimizer's update (Note
// [The parts of a training step] in src/graph/dot.cpp). Placeholders and the
// output are in none. Empty when `gm` is not a training step.
enum class StepPhase : uint8_t { Forward, Backward, Optimizer };
const char* step_phase_name(StepPhase phase);  // "forward", "backward", "optimizer"
std::unordered_map<const Node*, StepPhase> step_phases(const GraphModule& gm);

}  // namespace torchcap
