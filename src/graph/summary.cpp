#include <torchcap/summary.h>

#include <algorithm>
#include <cstdio>

namespace torchcap {
namespace {

std::string type_of(const Node* n) {
  std::string t = n->meta().val.str();
  return t.empty() ? "?" : t;
}

std::string human_bytes(size_t b) {
  char buf[32];
  if (b >= (1u << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / 1048576.0);
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%zu B", b);
  }
  return buf;
}

}  // namespace

GraphSummary summarize(const GraphModule& gm) {
  GraphSummary s;
  if (!gm.call.empty()) s.call = "forward" + gm.call.str(gm.in_spec);
  for (const Node* n : gm.graph()) {
    ++s.nodes;
    switch (n->op()) {
      case OpCode::Placeholder:
        ++s.placeholders;
        s.input_types.push_back(type_of(n));
        break;
      case OpCode::GetAttr:
        ++s.get_attrs;
        break;
      case OpCode::CallFunction:
        ++s.call_functions;
        ++s.ops[n->target()];
        break;
      case OpCode::Output:
        for (const Argument& a : n->args()[0].to_list()) {
          ++s.outputs;
          s.output_types.push_back(a.is_node() ? type_of(a.to_node()) : "None");
        }
        break;
    }
  }
  for (size_t i = 0; i < gm.symbols.size(); ++i) {
    const Symbol& sym = gm.symbols[i];
    s.symbols.push_back(symbol_name(i) + (sym.label == symbol_name(i) ? "" : " (" + sym.label + ")") +
                        " in [" + std::to_string(sym.min) + ", " +
                        (sym.max == kNoMaxSize ? std::string("inf") : std::to_string(sym.max)) + "]");
  }
  for (const Attribute& a : gm.attributes()) {
    auto& entry = s.attributes[a.kind];
    ++entry.first;
    if (a.value.defined()) entry.second += a.value.numel() * a.value.element_size();
    if (a.value.defined() && a.value.is_meta()) {
      ++s.weightless;
      s.weightless_bytes += a.value.numel() * a.value.element_size();
    }
  }
  return s;
}

std::string format_summary(const GraphSummary& s) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "nodes: %zu (placeholder %zu, get_attr %zu, call_function %zu, output 1)\n",
                s.nodes, s.placeholders, s.get_attrs, s.call_functions);
  out += line;
  for (const auto& [kind, entry] : s.attributes) {
    std::snprintf(line, sizeof(line), "%ss: %zu (%s)\n", attribute_kind_name(kind), entry.first,
                  human_bytes(entry.second).c_str());
    out += line;
  }
  if (s.weightless > 0) {
    std::snprintf(line, sizeof(line),
                  "weightless: %zu of the attributes (%s) hold no values; bind weights to run\n",
                  s.weightless, human_bytes(s.weightless_bytes).c_str());
    out += line;
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string j;
    for (const std::string& t : v) j += (j.empty() ? "" : ", ") + t;
    return j;
  };
  if (!s.call.empty()) out += "call: " + s.call + "\n";
  out += "inputs: " + join(s.input_types) + "\n";
  out += "outputs: " + join(s.output_types) + "\n";
  if (!s.symbols.empty()) out += "dynamic sizes: " + join(s.symbols) + "\n";
  std::vector<std::pair<std::string, size_t>> ops(s.ops.begin(), s.ops.end());
  std::stable_sort(ops.begin(), ops.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  out += "operators:\n";
  for (const auto& [name, count] : ops) {
    std::snprintf(line, sizeof(line), "  %6zu  %s\n", count, name.c_str());
    out += line;
  }
  return out;
}

}  // namespace torchcap
