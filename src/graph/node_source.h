// Where a node came from, for error messages. Internal.
#pragma once

#include <torchcap/node.h>

#include <string>

namespace torchcap::detail {

// "\n" and the node's stack trace, Python-traceback style, without a final
// newline; empty when it has none.
inline std::string source_lines(const Node& n) {
  std::string trace = n.meta().stack_trace.str();
  if (trace.empty()) return "";
  if (trace.back() == '\n') trace.pop_back();
  return "\n" + trace;
}

}  // namespace torchcap::detail
