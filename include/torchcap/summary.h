// A summary of a GraphModule: what the demo and `torchcap show --summary`
// print.
#pragma once

#include <torchcap/graph_module.h>

#include <map>
#include <string>
#include <vector>

namespace torchcap {

struct GraphSummary {
  size_t nodes = 0;
  size_t placeholders = 0;
  size_t get_attrs = 0;
  size_t call_functions = 0;
  size_t outputs = 0;  // values the output node returns
  // Operators called, by qualified name ("aten::addmm"), getitem included.
  std::map<std::string, size_t> ops;
  // Attributes by kind: count and bytes.
  std::map<AttributeKind, std::pair<size_t, size_t>> attributes;
  // Of those, the weightless ones (graph_module.h): count, and the bytes
  // their values would take once bound.
  size_t weightless = 0;
  size_t weightless_bytes = 0;
  // How the program is called, "forward(x, *, scale)"; empty when the
  // module does not know (call_convention.h).
  std::string call;
  std::vector<std::string> input_types;   // "f32[1, 3, 224, 224]" per placeholder
  std::vector<std::string> output_types;  // per output value
  // A dynamic graph's symbols: "s0 (batch) in [1, 64]" (symbolic.h).
  std::vector<std::string> symbols;
};

GraphSummary summarize(const GraphModule& gm);

// Human-readable, several lines: nodes by opcode, attributes, inputs and
// outputs, then the operator histogram, most frequent first.
std::string format_summary(const GraphSummary& s);

}  // namespace torchcap
