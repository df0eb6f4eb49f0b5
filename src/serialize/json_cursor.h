// A strict, single-pass reader of JSON text for the common case of loading
// (Note [Reading the usual file in one pass] in reader.cpp): it reads values
// straight out of the text, without building a tree, and gives up, by
// throwing NotUsual, at anything it does not expect or cannot vouch for. It
// never reports what is wrong: the careful reader, run after it gives up,
// does that. So it must never accept text nlohmann::json would refuse: it
// follows RFC 8259 to the letter (and refuses, besides, integers beyond 64
// bits and numbers too large for a double, which the format refuses).
#pragma once

#include "serialize/utf8.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace torchcap::format {

// Thrown when the text is not of the shape the one-pass reader handles.
struct NotUsual {};

class JsonCursor {
 public:
  JsonCursor(const char* begin, const char* end) : p_(begin), end_(end) {}

  [[noreturn]] static void give_up() { throw NotUsual{}; }

  const char* position() const { return p_; }
  bool at_end() {
    ws();
    return p_ == end_;
  }

  // The next character after white space, without consuming it; 0 at the end.
  char peek() {
    ws();
    return p_ < end_ ? *p_ : '\0';
  }
  void expect(char c) {
    if (peek() != c) give_up();
    ++p_;
  }
  // Consumes `c` if it comes next.
  bool accept(char c) {
    if (peek() != c) return false;
    ++p_;
    return true;
  }

  // An object: `on_member(key)` for each member, with the cursor at its
  // value (`key` as `string(scratch)` gives it).
  template <typename OnMember>
  void object(std::string& scratch, OnMember&& on_member) {
    expect('{');
    if (peek() != '}') {
      do {
        std::string_view key = string(scratch);
        expect(':');
        on_member(key);
      } while (accept(','));
    }
    expect('}');
  }
  // An array, maybe empty: `on_element()` for each element, with the cursor
  // at it.
  template <typename OnElement>
  void array(OnElement&& on_element) {
    expect('[');
    if (accept(']')) return;
    do {
      on_element();
    } while (accept(','));
    expect(']');
  }

  // A string. The view points into the text when the string has no escapes,
  // else into `scratch`; either way it is valid until the next call that
  // reads a string into `scratch`.
  std::string_view string(std::string& scratch) {
    expect('"');
    const char* start = p_;
    bool ascii = true;
    while (true) {
      if (p_ == end_) give_up();
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') break;
      if (c == '\\') return escaped_string(start, scratch);
      if (c < 0x20) give_up();
      ascii &= c < 0x80;
      ++p_;
    }
    std::string_view out(start, static_cast<size_t>(p_ - start));
    ++p_;
    if (!ascii) {
      scratch.assign(out);
      if (!is_valid_utf8(scratch)) give_up();
    }
    return out;
  }

  // A JSON number that is an integer literal (no fraction, no exponent) in
  // int64_t's range.
  int64_t integer() {
    Number n = number();
    if (!n.is_integer) give_up();
    return n.i;
  }

  // A number: an integer literal in int64_t's range (is_integer) or any other
  // literal, read as a finite double.
  struct Number {
    bool is_integer;
    int64_t i;
    double d;
  };
  Number number() {
    ws();
    const char* start = p_;
    if (p_ < end_ && *p_ == '-') ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') give_up();
    if (*p_ == '0') {
      ++p_;
      if (p_ < end_ && *p_ >= '0' && *p_ <= '9') give_up();  // leading zero
    } else {
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    bool integral = true;
    if (p_ < end_ && *p_ == '.') {
      integral = false;
      ++p_;
      if (p_ == end_ || *p_ < '0' || *p_ > '9') give_up();
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      integral = false;
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || *p_ < '0' || *p_ > '9') give_up();
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    Number n{integral, 0, 0.0};
    if (integral) {
      auto [ptr, ec] = std::from_chars(start, p_, n.i);
      if (ec != std::errc() || ptr != p_) give_up();  // beyond 64 bits
      return n;
    }
    auto [ptr, ec] = std::from_chars(start, p_, n.d);
    if (ec != std::errc() || ptr != p_ || !std::isfinite(n.d)) give_up();
    return n;
  }

  // `true`, `false` or `null`, whichever `word` is, if it comes next.
  bool literal(const char* word) {
    ws();
    const size_t n = std::strlen(word);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) return false;
    p_ += n;
    return true;
  }

  // Reads any value and drops it; `depth` counts the containers around it.
  void skip_value(int depth) {
    if (depth > kMaxDepth) give_up();
    std::string scratch;
    switch (peek()) {
      case '"':
        string(scratch);
        return;
      case '{':
        ++p_;
        if (accept('}')) return;
        do {
          string(scratch);
          expect(':');
          skip_value(depth + 1);
        } while (accept(','));
        expect('}');
        return;
      case '[':
        ++p_;
        if (accept(']')) return;
        do {
          skip_value(depth + 1);
        } while (accept(','));
        expect(']');
        return;
      case 't':
        if (!literal("true")) give_up();
        return;
      case 'f':
        if (!literal("false")) give_up();
        return;
      case 'n':
        if (!literal("null")) give_up();
        return;
      default:
        number();
        return;
    }
  }

  // The text of the value that starts next, validated and skipped.
  std::string_view value_text(int depth) {
    ws();
    const char* start = p_;
    skip_value(depth);
    return std::string_view(start, static_cast<size_t>(p_ - start));
  }

  // Deeper than this the one-pass reader gives up (the careful one says why).
  static constexpr int kMaxDepth = 32;

 private:
  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  unsigned code_unit() {
    if (end_ - p_ < 4) give_up();
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      int h = hex(p_[i]);
      if (h < 0) give_up();
      u = u * 16 + static_cast<unsigned>(h);
    }
    p_ += 4;
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // The rest of a string from its first backslash; `start` is after the quote.
  std::string_view escaped_string(const char* start, std::string& scratch) {
    scratch.assign(start, static_cast<size_t>(p_ - start));
    while (true) {
      if (p_ == end_) give_up();
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') break;
      if (c < 0x20) give_up();
      if (c != '\\') {
        scratch += static_cast<char>(c);
        ++p_;
        continue;
      }
      if (++p_ == end_) give_up();
      const char e = *p_++;
      switch (e) {
        case '"': scratch += '"'; break;
        case '\\': scratch += '\\'; break;
        case '/': scratch += '/'; break;
        case 'b': scratch += '\b'; break;
        case 'f': scratch += '\f'; break;
        case 'n': scratch += '\n'; break;
        case 'r': scratch += '\r'; break;
        case 't': scratch += '\t'; break;
        case 'u': {
          unsigned cp = code_unit();
          if (cp >= 0xDC00 && cp <= 0xDFFF) give_up();  // a lone low surrogate
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') give_up();
            p_ += 2;
            unsigned low = code_unit();
            if (low < 0xDC00 || low > 0xDFFF) give_up();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(scratch, cp);
          break;
        }
        default:
          give_up();
      }
    }
    ++p_;
    if (!is_valid_utf8(scratch)) give_up();
    return scratch;
  }

  const char* p_;
  const char* end_;
};

}  // namespace torchcap::format
