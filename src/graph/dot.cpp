// The graph as Graphviz source.
#include <torchcap/printer.h>

namespace torchcap {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string graphviz_dot(const Graph& g) {
  std::string out =
      "digraph torchcap {\n"
      "  rankdir=TB;\n"
      "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", fontname=\"monospace\", "
      "fontsize=10];\n"
      "  edge [color=\"#555555\"];\n";
  for (const Node* n : g) {
    std::string label = n->name();
    std::string attrs;
    switch (n->op()) {
      case OpCode::Placeholder:
        label += "\ninput";
        attrs = ", shape=ellipse, fillcolor=\"#dbeafe\"";
        break;
      case OpCode::GetAttr:
        label += "\n" + n->target();
        attrs = ", fillcolor=\"#f3f4f6\"";
        break;
      case OpCode::CallFunction:
        label += "\n" + n->target();
        break;
      case OpCode::Output:
        label = "output";
        attrs = ", shape=ellipse, fillcolor=\"#dcfce7\"";
        break;
    }
    std::string type = n->meta().val.str();
    if (!type.empty()) label += "\n" + type;
    out += "  \"" + escape(n->name()) + "\" [label=\"" + escape(label) + "\"" + attrs + "];\n";
  }
  for (const Node* n : g) {
    for (const Node* in : n->inputs()) {
      out += "  \"" + escape(in->name()) + "\" -> \"" + escape(n->name()) + "\";\n";
    }
  }
  return out + "}\n";
}

}  // namespace torchcap
