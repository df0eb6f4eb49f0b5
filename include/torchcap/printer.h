// Printing graphs: the torch.fx-style listing and Python source.
//
// Both are deterministic: the same graph always prints the same text, so tests
// compare them with golden files.
#pragma once

#include <torchcap/graph.h>

#include <string>

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

// The graph as Graphviz source: one box per node (name, target, type), an
// edge per use. Deterministic; render with `dot -Tsvg`.
std::string graphviz_dot(const Graph& g);

}  // namespace torchcap
