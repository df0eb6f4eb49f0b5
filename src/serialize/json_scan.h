// A single pass over JSON text, before anything reads it in the contract's
// order (Note [Reading in the contract's order] in json_cursor.h), for what a
// parser does not report, or reports elsewhere: a bound on nesting depth
// (checked before any recursive code sees the document), and the refusal of
// NUL bytes and of integers beyond 64 bits, each at its byte. The writer uses
// it too, on the text it made.
//
// The scan trusts nothing and validates nothing else: on malformed text it
// may miss these, and the parser then reports the real problem.
#pragma once

#include <cstdint>
#include <string>

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
};

JsonScan scan_json(const char* text, uint64_t size, int max_depth);

}  // namespace torchcap::format
