// A single pass over JSON text, before it is parsed, for what the parser does
// not give: a bound on nesting depth (checked before any recursive code sees
// the document), the refusal of NUL bytes and of integers beyond 64 bits, and
// the byte offsets of the elements of the top-level
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
  // Offset of the first NUL byte. JSON text never holds one (in strings it is
  // escaped), but nlohmann::json stops reading at one as if the text ended
  // there, so without this check anything after a NUL would be ignored.
  bool nul = false;
  uint64_t nul_at = 0;
  // The first integer literal outside int64_t's range. nlohmann::json would
  // quietly read it as a double (or, up to 2^64 - 1, as unsigned): an integer
  // argument would change kind on the way in.
  bool big_integer = false;
  uint64_t big_integer_at = 0;
  std::string big_integer_text;
  // Offset of each top-level key's value, by key (escapes in keys are kept raw).
  std::map<std::string, uint64_t> values;
  // For top-level keys whose value is an array: the offset of each element,
  // and where each ends (the offset of the comma or bracket after it).
  std::map<std::string, std::vector<uint64_t>> elements;
  std::map<std::string, std::vector<uint64_t>> element_ends;
};

JsonScan scan_json(const char* text, uint64_t size, int max_depth);

}  // namespace torchcap::format
