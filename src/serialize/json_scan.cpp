#include "serialize/json_scan.h"

namespace torchcap::format {

JsonScan scan_json(const char* text, uint64_t size, int max_depth) {
  JsonScan out;
  int depth = 0;
  bool in_string = false, escaped = false;
  bool in_key = false;      // reading a key of the top-level object
  bool expect_key = false;  // the next string at depth 1 is a key
  bool want_value = false;  // the next token is a top-level value
  std::string key;
  // The top-level array being indexed, and whether its next element starts at
  // the next token.
  std::vector<uint64_t>* array = nullptr;
  bool want_element = false;

  for (uint64_t i = 0; i < size; ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
        if (in_key) key += c;
      } else if (c == '\\') {
        escaped = true;
        if (in_key) key += c;
      } else if (c == '"') {
        in_string = in_key = false;
      } else if (in_key) {
        key += c;
      }
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;

    if (want_element) {
      want_element = false;
      if (c != ']') array->push_back(i);
    }
    if (want_value) {
      want_value = false;
      out.values[key] = i;
      if (c == '[') {
        array = &out.elements[key];
        array->clear();  // a repeated key: the parser keeps the last one
        want_element = true;
      }
    }
    switch (c) {
      case '"':
        in_string = true;
        if (depth == 1 && expect_key) {
          in_key = true;
          expect_key = false;
          key.clear();
        }
        break;
      case '{':
      case '[':
        if (++depth > max_depth) {
          out.too_deep = true;
          out.too_deep_at = i;
          return out;
        }
        if (depth == 1) expect_key = c == '{';
        break;
      case '}':
      case ']':
        if (array != nullptr && depth == 2) array = nullptr;
        --depth;
        break;
      case ',':
        if (depth == 1) expect_key = true;
        if (array != nullptr && depth == 2) want_element = true;
        break;
      case ':':
        if (depth == 1) want_value = true;
        break;
      default:
        break;
    }
  }
  return out;
}

}  // namespace torchcap::format
