// A single pass over JSON text, before it is parsed, for two things the parser
// does not give: a bound on nesting depth (checked before any recursive code
// sees the document) and the byte offsets of the elements of the top-level
// arrays ("nodes", "tensors", "attributes"), so that errors found later can
// name the byte where the offending node starts.
//
// The scan trusts nothing and validates nothing else: on malformed text it may
// record meaningless offsets, and the parser then reports the real problem.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace torchcap::format {

struct JsonScan {
  // Offset of the bracket that opened a container beyond the depth limit.
  bool too_deep = false;
  uint64_t too_deep_at = 0;
  // Offset of each top-level key's value, by key (escapes in keys are kept raw).
  std::map<std::string, uint64_t> values;
  // For top-level keys whose value is an array: the offset of each element.
  std::map<std::string, std::vector<uint64_t>> elements;
};

JsonScan scan_json(const char* text, uint64_t size, int max_depth);

}  // namespace torchcap::format
