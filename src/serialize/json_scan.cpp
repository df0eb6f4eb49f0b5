#include "serialize/json_scan.h"

#include <string_view>

namespace torchcap::format {
namespace {

bool is_number_char(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

// Whether the number literal `token` is an integer outside int64_t's range.
bool is_big_integer(std::string_view token) {
  if (token.find_first_of(".eE") != std::string_view::npos) return false;  // a float
  bool negative = !token.empty() && token[0] == '-';
  if (negative) token.remove_prefix(1);
  while (token.size() > 1 && token[0] == '0') token.remove_prefix(1);
  std::string_view limit = negative ? "9223372036854775808" : "9223372036854775807";
  return token.size() > limit.size() || (token.size() == limit.size() && token > limit);
}

}  // namespace

JsonScan scan_json(const char* text, uint64_t size, int max_depth) {
  JsonScan out;
  int depth = 0;
  bool in_string = false, escaped = false;
  bool in_number = false;
  uint64_t number_start = 0;
  auto check_number = [&](uint64_t end) {
    std::string_view token(text + number_start, end - number_start);
    if (!is_big_integer(token)) return false;
    out.big_integer = true;
    out.big_integer_at = number_start;
    out.big_integer_text = std::string(token);
    return true;
  };

  for (uint64_t i = 0; i < size; ++i) {
    const char c = text[i];
    if (c == '\0') {
      out.nul = true;
      out.nul_at = i;
      return out;
    }
    if (in_number) {
      if (is_number_char(c)) continue;
      in_number = false;
      if (check_number(i)) return out;
    }
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      in_number = true;
      number_start = i;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '{':
      case '[':
        if (++depth > max_depth) {
          out.too_deep = true;
          out.too_deep_at = i;
          return out;
        }
        break;
      case '}':
      case ']':
        --depth;
        break;
      default:
        break;
    }
  }
  if (in_number) check_number(size);
  return out;
}

}  // namespace torchcap::format
