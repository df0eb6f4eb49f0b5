// Python source for a GraphModule, in the style of torch.fx's generated code.
#include <torchcap/error.h>
#include <torchcap/graph_module.h>
#include <torchcap/printer.h>

#include "graph/operator_name.h"
#include "graph/python_literals.h"

#include <unordered_map>
#include <unordered_set>

namespace torchcap {
namespace {

// "layer1.0.conv1.weight" -> getattr(self.layer1, '0').conv1.weight
std::string attribute_access(const std::string& path) {
  std::string expr = "self";
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (is_valid_node_name(part)) {  // an identifier, not a keyword or builtin
      expr += "." + part;
    } else {
      expr = "getattr(" + expr + ", " + detail::python_string_literal(part) + ")";
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return expr;
}

// "aten::add.Tensor" -> torch.ops.aten.add.Tensor; "aten::addmm" -> torch.ops.aten.addmm.default
std::string operator_access(const Node& n) {
  const c10::OperatorName& name = n.op_handle().operator_name();
  std::string out = "torch.ops." + detail::operator_namespace(name) + "." + detail::operator_stem(name);
  return out + "." + (name.overload_name.empty() ? "default" : name.overload_name);
}

struct InputBinding {
  std::vector<std::string> params;  // forward's parameters after self
  std::vector<std::string> lines;   // statements binding nested placeholders
};

// Parameters follow the top level of the input spec: a tensor argument is its
// placeholder; a nested one is unpacked into placeholders.
InputBinding bind_inputs(const GraphModule& gm, const std::vector<Node*>& placeholders,
                         std::unordered_set<std::string>& taken) {
  InputBinding b;
  const TreeSpec& spec = gm.in_spec;
  if (spec.kind() != TreeSpec::Kind::Tuple || spec.num_leaves() != placeholders.size()) {
    for (const Node* p : placeholders) b.params.push_back(p->name());
    return b;
  }
  size_t next = 0;
  for (size_t i = 0; i < spec.children().size(); ++i) {
    const TreeSpec& child = spec.children()[i];
    if (child.kind() == TreeSpec::Kind::Leaf) {
      b.params.push_back(placeholders[next++]->name());
      continue;
    }
    std::string param = "arg" + std::to_string(i);
    while (taken.count(param)) param += "_";
    taken.insert(param);
    b.params.push_back(param);
    // Walk the child's leaves with their access paths, without recursion over
    // the graph (specs are shallow, but keep one loop for clarity).
    std::vector<std::pair<const TreeSpec*, std::string>> stack = {{&child, param}};
    std::vector<std::pair<const TreeSpec*, std::string>> order;
    while (!stack.empty()) {
      auto [s, path] = stack.back();
      stack.pop_back();
      if (s->kind() == TreeSpec::Kind::Leaf) {
        order.emplace_back(s, path);
        continue;
      }
      for (size_t k = s->children().size(); k-- > 0;) {
        std::string key = s->kind() == TreeSpec::Kind::Dict
                              ? (s->keys()[k].isString()
                                     ? detail::python_string_literal(s->keys()[k].toStringRef())
                                     : std::to_string(s->keys()[k].toInt()))
                              : std::to_string(k);
        stack.emplace_back(&s->children()[k], path + "[" + key + "]");
      }
    }
    for (const auto& [leaf, path] : order) {
      b.lines.push_back(placeholders[next++]->name() + " = " + path);
    }
  }
  return b;
}

std::string build_output(const TreeSpec& s, const ArgumentList& results, size_t& next) {
  switch (s.kind()) {
    case TreeSpec::Kind::Leaf: {
      const Argument& a = results.at(next++);
      return a.is_node() ? a.to_node()->name() : "None";
    }
    case TreeSpec::Kind::None:
      return "None";
    case TreeSpec::Kind::Constant:
      return s.str();
    case TreeSpec::Kind::Tuple:
    case TreeSpec::Kind::List: {
      bool tuple = s.kind() == TreeSpec::Kind::Tuple;
      std::string out(1, tuple ? '(' : '[');
      for (size_t i = 0; i < s.children().size(); ++i) {
        out += (i ? ", " : "") + build_output(s.children()[i], results, next);
      }
      if (tuple && s.children().size() == 1) out += ',';
      return out + (tuple ? ')' : ']');
    }
    case TreeSpec::Kind::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < s.children().size(); ++i) {
        const c10::IValue& k = s.keys()[i];
        out += (i ? ", " : "") +
               (k.isString() ? detail::python_string_literal(k.toStringRef())
                             : std::to_string(k.toInt())) +
               ": " + build_output(s.children()[i], results, next);
      }
      return out + "}";
    }
  }
  return "None";
}

}  // namespace

std::string python_code(const GraphModule& gm) {
  const Graph& g = gm.graph();
  const Node* out = g.output_node();
  if (out == nullptr) throw Error("python_code: the graph has no output node");

  std::vector<Node*> placeholders = g.placeholders();
  std::unordered_set<std::string> taken;
  for (const Node* n : g) taken.insert(n->name());
  InputBinding inputs = bind_inputs(gm, placeholders, taken);

  // Free each value right after its last use, as torch.fx's code does; the
  // values the output returns are kept.
  std::unordered_map<const Node*, const Node*> last_use;
  for (const Node* n : g) {
    for (const Node* in : n->inputs()) last_use[in] = n;
  }
  std::unordered_map<const Node*, std::vector<const Node*>> freed_after;
  for (const Node* n : g) {
    if (n->op() == OpCode::Output || n->op() == OpCode::Placeholder) continue;
    auto it = last_use.find(n);
    if (it == last_use.end()) {
      freed_after[n].push_back(n);  // unused: dropped at once
    } else if (it->second->op() != OpCode::Output) {
      freed_after[it->second].push_back(n);
    }
  }
  // Inputs the graph writes back into (export.h) stay bound to the end.
  std::unordered_set<std::string> written_inputs;
  for (const OutputSpec& spec : gm.output_specs) {
    if (spec.kind == OutputKind::InputMutation) written_inputs.insert(spec.target);
  }
  for (const Node* p : placeholders) {
    auto it = last_use.find(p);
    if (it != last_use.end() && it->second->op() != OpCode::Output &&
        written_inputs.count(p->name()) == 0) {
      freed_after[it->second].push_back(p);
    }
  }

  auto name_of = [](const Node* n) { return n->name(); };
  std::string body;
  for (const std::string& line : inputs.lines) body += "    " + line + "\n";
  for (const Node* n : g) {
    std::string stmt;
    switch (n->op()) {
      case OpCode::Placeholder:
        continue;
      case OpCode::GetAttr:
        stmt = n->name() + " = " + attribute_access(n->target());
        break;
      case OpCode::CallFunction: {
        std::string call = n->is_getitem()             ? std::string("operator.getitem")
                           : !n->is_size_computation() ? operator_access(*n)
                           : n->target() == kSymSize  ? std::string("torch.ops.aten.sym_size")
                                                      : "operator." + n->target();
        call += "(";
        bool first = true;
        for (const Argument& a : n->args()) {
          call += (first ? "" : ", ") + detail::python_literal(a, name_of);
          first = false;
        }
        for (const auto& kv : n->kwargs()) {
          call += (first ? "" : ", ") + kv.first + "=" + detail::python_literal(kv.second, name_of);
          first = false;
        }
        stmt = n->name() + " = " + call + ")";
        break;
      }
      case OpCode::Output: {
        size_t next = 0;
        const ArgumentList& all_results = n->args()[0].to_list();
        const size_t num_user = gm.num_user_outputs();
        // Writes the program made (export.h): applied before returning, so
        // calling forward has the program's effect.
        for (size_t i = num_user; i < all_results.size() && i < gm.output_specs.size(); ++i) {
          const OutputSpec& spec = gm.output_specs[i];
          std::string target = spec.kind == OutputKind::BufferMutation ? attribute_access(spec.target)
                                                                        : spec.target;
          body += "    " + target + ".copy_(" + detail::python_literal(all_results[i], name_of) + ")\n";
        }
        const ArgumentList results(all_results.begin(), all_results.begin() + std::min(num_user, all_results.size()));
        if (gm.out_spec.num_leaves() == results.size() && gm.out_spec.kind() != TreeSpec::Kind::None) {
          stmt = "return " + build_output(gm.out_spec, results, next);
        } else {
          std::string tuple = "(";
          for (size_t i = 0; i < results.size(); ++i) {
            tuple += (i ? ", " : "") + detail::python_literal(results[i], name_of);
          }
          stmt = "return " + tuple + (results.size() == 1 ? ",)" : ")");
        }
        break;
      }
    }
    auto freed = freed_after.find(n);
    if (freed != freed_after.end()) {
      stmt += ";  ";
      for (const Node* f : freed->second) stmt += f->name() + " = ";
      stmt += "None";
    }
    body += "    " + stmt + "\n";
  }

  std::string params = "self";
  for (const std::string& p : inputs.params) params += ", " + p;
  return "import operator\n\nimport torch\nfrom torch import device\n\n\ndef forward(" + params +
         "):\n" + body;
}

}  // namespace torchcap
