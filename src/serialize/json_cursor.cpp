#include "serialize/json_cursor.h"

#include <torchcap/error.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace torchcap::format {

void fail_at(const FileInfo& file, uint64_t offset, const std::string& what) {
  throw FormatError(file.source + ": byte " + std::to_string(offset) + ": " + what);
}

std::string Entry::label() const {
  if (table == nullptr) return key == nullptr ? std::string() : "'" + std::string(key) + "'";
  std::string element = std::string(table) + "[" + std::to_string(index) + "]";
  if (name == nullptr) return element;
  if (std::strcmp(noun, "node") == 0) return "node %" + *name + " (" + element + ")";
  return std::string(noun) + " '" + *name + "' (" + element + ")";
}

void Entry::fail(const std::string& path, const std::string& what) const {
  std::string prefix = label();
  if (!path.empty()) prefix += prefix.empty() ? path : ": " + path;
  fail_at(*file, offset, prefix.empty() ? what : prefix + ": " + what);
}

// --- Cursor --------------------------------------------------------------------

std::string_view Cursor::string() {
  expect('"');
  const char* start = p_;
  bool ascii = true;
  while (true) {
    if (p_ == end_) syntax_error();
    const unsigned char c = static_cast<unsigned char>(*p_);
    if (c == '"') break;
    if (c == '\\') return escaped_string(start);
    if (c < 0x20) syntax_error();
    ascii &= c < 0x80;
    ++p_;
  }
  std::string_view out(start, static_cast<size_t>(p_ - start));
  ++p_;
  if (!ascii) {
    scratch_.assign(out);
    if (!is_valid_utf8(scratch_)) syntax_error(start);
  }
  return out;
}

Cursor::Number Cursor::number() {
  ws();
  const char* start = p_;
  auto digits = [&] {
    if (p_ == end_ || *p_ < '0' || *p_ > '9') syntax_error();
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
  };
  if (p_ < end_ && *p_ == '-') ++p_;
  if (p_ < end_ && *p_ == '0') {
    ++p_;
  } else {
    digits();
  }
  bool integral = true;
  if (p_ < end_ && *p_ == '.') {
    integral = false;
    ++p_;
    digits();
  }
  if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
    integral = false;
    ++p_;
    if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
    digits();
  }
  Number n{integral, true, 0, 0.0, std::string_view(start, static_cast<size_t>(p_ - start))};
  if (integral) {
    auto [ptr, ec] = std::from_chars(start, p_, n.i);
    n.fits = ec == std::errc() && ptr == p_;
    return n;
  }
  auto [ptr, ec] = std::from_chars(start, p_, n.d);
  if (ec == std::errc::result_out_of_range || ptr != p_) n.d = slow_double(n.text);
  if (!std::isfinite(n.d)) syntax_error(start);  // nlohmann::json's "number overflow"
  return n;
}

void Cursor::skip_value() {
  switch (peek()) {
    case '"':
      string();
      return;
    case '{':
      open('{');
      if (accept('}')) {
        left();
        return;
      }
      do {
        string();
        expect(':');
        skip_value();
      } while (accept(','));
      close('}');
      return;
    case '[':
      open('[');
      if (accept(']')) {
        left();
        return;
      }
      do {
        skip_value();
      } while (accept(','));
      close(']');
      return;
    case 't':
      literal("true");
      return;
    case 'f':
      literal("false");
      return;
    case 'n':
      literal("null");
      return;
    default:
      number();
      return;
  }
}

const char* Cursor::type_name(const char* at) const {
  switch (*at) {
    case 'n':
      return "null";
    case 't':
    case 'f':
      return "a boolean";
    case '"':
      return "a string";
    case '[':
      return "an array";
    case '{':
      return "an object";
    default:
      break;
  }
  for (const char* p = at; p < end_ && std::strchr("-+0123456789.eE", *p) != nullptr; ++p) {
    if (*p == '.' || *p == 'e' || *p == 'E') return "a float";
  }
  return "an integer";
}

void Cursor::syntax_error(const char* at) const {
  const char* where = at != nullptr ? at : p_;
  std::string what = where < end_ ? "unexpected '" + std::string(1, *where) + "'" : "unexpected end";
  fail_at(*file_, offset_of(where), "the JSON section is not valid JSON: " + what);
}

void Cursor::too_deep(const char* at) const {
  fail_at(*file_, offset_of(at),
          "the JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
}

// A number from_chars would not give: one so close to zero that it rounds to
// a subnormal or to zero, which JSON parsers read as that (strtod does).
double Cursor::slow_double(std::string_view text) const {
  std::string s(text);
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) syntax_error(text.data());
  return d;
}

namespace {

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, unsigned cp) {
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

}  // namespace

// The rest of a string from its first backslash; `start` is after the quote.
std::string_view Cursor::escaped_string(const char* start) {
  scratch_.assign(start, static_cast<size_t>(p_ - start));
  auto code_unit = [&] {
    if (end_ - p_ < 4) syntax_error();
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      int h = hex(p_[i]);
      if (h < 0) syntax_error(p_ + i);
      u = u * 16 + static_cast<unsigned>(h);
    }
    p_ += 4;
    return u;
  };
  while (true) {
    if (p_ == end_) syntax_error();
    const unsigned char c = static_cast<unsigned char>(*p_);
    if (c == '"') break;
    if (c < 0x20) syntax_error();
    if (c != '\\') {
      scratch_ += static_cast<char>(c);
      ++p_;
      continue;
    }
    if (++p_ == end_) syntax_error();
    const char e = *p_++;
    switch (e) {
      case '"': scratch_ += '"'; break;
      case '\\': scratch_ += '\\'; break;
      case '/': scratch_ += '/'; break;
      case 'b': scratch_ += '\b'; break;
      case 'f': scratch_ += '\f'; break;
      case 'n': scratch_ += '\n'; break;
      case 'r': scratch_ += '\r'; break;
      case 't': scratch_ += '\t'; break;
      case 'u': {
        unsigned cp = code_unit();
        if (cp >= 0xDC00 && cp <= 0xDFFF) syntax_error(p_ - 6);  // a lone low surrogate
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') syntax_error();
          p_ += 2;
          unsigned low = code_unit();
          if (low < 0xDC00 || low > 0xDFFF) syntax_error(p_ - 6);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        append_utf8(scratch_, cp);
        break;
      }
      default:
        syntax_error(p_ - 1);
    }
  }
  ++p_;
  if (!is_valid_utf8(scratch_)) syntax_error(start);
  return scratch_;
}

// --- Field ---------------------------------------------------------------------

std::string Field::path() const {
  std::vector<const Field*> chain;
  for (const Field* f = this; f->parent_ != nullptr; f = f->parent_) chain.push_back(f);
  std::string s;
  for (size_t i = chain.size(); i-- > 0;) {
    const Field* f = chain[i];
    if (f->key_ != nullptr) {
      s += (s.empty() ? "" : ".") + std::string(f->key_);
    } else {
      s += "[" + std::to_string(f->index_) + "]";
    }
  }
  return s;
}

void Field::fail(const std::string& what) const { entry_->fail(path(), what); }

bool Field::is_integer() const {
  return is_number() && std::strcmp(type_name(), "an integer") == 0;
}

double Field::float_value_as(const Field& as) const {
  if (is_number()) {
    Cursor::Number n = number();
    if (!n.is_integer) return n.d;  // finite: the cursor refuses others
  }
  if (!is_string()) as.fail(std::string("expected a string, got ") + type_name());
  std::string_view s = string();
  std::optional<double> d = nonfinite_double_from_string(s);
  if (!d) as.fail("'" + std::string(s) + "' is not inf, -inf, nan or the 0x bits of a NaN");
  return *d;
}

c10::ScalarType Field::dtype() const {
  std::string_view s = string();
  std::optional<c10::ScalarType> t = dtype_from_name(s);
  if (!t) fail("unknown dtype '" + std::string(s) + "'");
  return *t;
}

c10::Device Field::device() const {
  std::string_view s = string();
  // Nearly every device in a file is "cpu": skip the parser for it.
  if (s == "cpu") return c10::Device(c10::kCPU);
  std::string name(s);
  try {
    return c10::Device(name);
  } catch (const std::exception&) {
    fail("'" + name + "' is not a device");
  }
}

void Field::elements(c10::function_ref<void(size_t)> count,
                     c10::function_ref<void(const Field&)> each) const {
  if (!is_array()) fail(std::string("expected an array, got ") + type_name());
  Cursor& c = *c_;
  if (count && c.order() == Order::Contract) {
    c.seek(at_);
    size_t n = 0;
    c.open('[');
    if (c.accept(']')) {
      c.left();
    } else {
      do {
        c.skip_value();
        ++n;
      } while (c.accept(','));
      c.close(']');
    }
    count(n);
  }
  c.seek(at_);
  c.open('[');
  size_t i = 0;
  if (c.accept(']')) {
    c.left();
  } else {
    do {
      const char* element = c.value_start();
      each(Field(*this, nullptr, i, element));
      if (c.position() == element) c.skip_value();  // not read
      ++i;
    } while (c.accept(','));
    c.close(']');
  }
  if (count && c.order() == Order::Text) count(i);
}

// --- Object --------------------------------------------------------------------

// An object looked over before it is read: every member's key and where its
// value starts, the last of a repeated key winning, sorted by key so that
// check_keys reports the first unknown key as a parser's sorted object would
// show it; and the byte after the object.
struct Object::Index {
  std::vector<std::pair<std::string, const char*>> members;
  const char* end = nullptr;
};

void Object::index() {
  std::vector<std::pair<std::string, const char*>> all;
  if (!c_.accept('}')) {
    do {
      std::string key(c_.string());
      c_.expect(':');
      all.emplace_back(std::move(key), c_.value_start());
      c_.skip_value();
    } while (c_.accept(','));
    c_.expect('}');
  }
  index_ = new Index;
  index_->end = c_.position();
  // Stable, so that of equal keys the last stays last; then keep that one.
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < all.size(); ++i) {
    if (i + 1 < all.size() && all[i + 1].first == all[i].first) continue;
    index_->members.push_back(std::move(all[i]));
  }
}

void Object::drop_index() { delete index_; }

const char* Object::locate_indexed(const char* key) const {
  const auto& members = index_->members;
  auto it = std::lower_bound(members.begin(), members.end(), std::string_view(key),
                             [](const auto& m, std::string_view k) { return m.first < k; });
  if (it == members.end() || it->first != key) return nullptr;
  return it->second;
}

void Object::missing(const char* key) const { self_.fail(std::string("missing '") + key + "'"); }

size_t Object::size() const {
  TORCH_INTERNAL_ASSERT(index_ != nullptr, "only an indexed object knows its size first");
  return index_->members.size();
}

// In Order::Text keys are checked as they come (load, locate).
void Object::check_indexed_keys(const Keys& keys) const {
  const FileInfo& file = c_.file();
  if (!file.strict) return;
  for (const auto& m : index_->members) {
    if (has_key(keys, m.first, file.minor)) continue;
    unknown_key(m.first, key_since(keys, m.first));
  }
}

namespace {

// Whether two keys of the grammar are one; the same literal, most often.
bool same_key(const char* a, const char* b) { return a == b || std::strcmp(a, b) == 0; }

}  // namespace

// To the next member's key (State::AtKey), or past the object (State::End).
void Object::advance() {
  if (state_ == State::Start) {
    if (c_.accept('}')) {
      c_.left();
      state_ = State::End;
    } else {
      state_ = State::AtKey;
    }
  } else if (state_ == State::Value) {
    if (c_.position() == value_at_) c_.skip_value();  // not read
    if (c_.accept(',')) {
      state_ = State::AtKey;
    } else {
      c_.close('}');
      state_ = State::End;
    }
  }
}

// Reads the key at the cursor (State::AtKey) into pending_, skipping members
// to skip: State::Loaded, or State::End if none is left.
void Object::load() {
  while (state_ == State::AtKey) {
    std::string_view key = c_.string();
    c_.expect(':');
    value_at_ = c_.value_start();
    if (keys_ == nullptr) {
      pending_key_ = key;
      state_ = State::Loaded;
      return;
    }
    pending_ = classify(key);
    if (pending_ >= 0) {
      state_ = State::Loaded;
      return;
    }
    state_ = State::Value;  // unknown, in a newer version's file: skipped
    advance();
  }
}

const char* Object::locate(const char* key) {
  if (index_ != nullptr) return locate_indexed(key);
  const int want = next_ < key_count_ && same_key(keys_[next_].name, key) ? next_ : key_index(key);
  const uint32_t bit = 1u << want;
  advance();
  if (state_ == State::AtKey) {
    // Most often the key asked for comes next, spelled as the grammar spells it.
    if (c_.take_key(key)) {
      if (keys_[want].since > c_.file().minor) unknown_key(key, keys_[want].since);
      c_.expect(':');
      value_at_ = c_.value_start();
      pending_ = want;
      state_ = State::Loaded;
    } else {
      load();
    }
  }
  if (state_ == State::Loaded && pending_ == want) {
    if (asked_ & bit) throw ReadAgain{};  // the key twice
    asked_ |= bit;
    found_ |= bit;
    next_ = want + 1;
    state_ = State::Value;
    return value_at_;
  }
  asked_ |= bit;
  // A member asked for before comes next: the text is in another order.
  if (state_ == State::Loaded && (asked_ & (1u << pending_))) throw ReadAgain{};
  return nullptr;  // one asked for later comes next
}

bool Object::has(const char* key) {
  if (index_ != nullptr) return locate_indexed(key) != nullptr;
  const uint32_t bit = 1u << key_index(key);
  if (asked_ & bit) return (found_ & bit) != 0;
  advance();
  load();
  if (state_ == State::Loaded) {
    if (same_key(keys_[pending_].name, key)) return true;
    if (asked_ & (1u << pending_)) throw ReadAgain{};
  }
  asked_ |= bit;
  return false;
}

std::optional<std::string_view> Object::only_key() {
  if (index_ != nullptr) {
    if (index_->members.size() != 1) return std::nullopt;
    return std::string_view(index_->members[0].first);
  }
  advance();
  load();
  if (state_ != State::Loaded) return std::nullopt;
  return pending_key_;
}

Field Object::only_value(const char* key) {
  if (index_ != nullptr) return member(key, index_->members[0].second);
  state_ = State::Value;
  return member(key, value_at_);
}

void Object::members(c10::function_ref<void(const Field&)> visit) {
  TORCH_INTERNAL_ASSERT(index_ == nullptr, "members() visits an object in its text's order");
  while (true) {
    advance();
    load();
    if (state_ != State::Loaded) return;
    const uint32_t bit = 1u << pending_;
    if (asked_ & bit) throw ReadAgain{};  // the key twice
    asked_ |= bit;
    found_ |= bit;
    state_ = State::Value;
    visit(member(keys_[pending_].name, value_at_));
  }
}

void Object::close() {
  if (index_ != nullptr) {
    c_.seek(index_->end);
    c_.left();
    return;
  }
  while (true) {
    advance();
    load();
    if (state_ != State::Loaded) return;
    // Several members where one was expected, or one asked for before.
    if (keys_ == nullptr || (asked_ & (1u << pending_))) throw ReadAgain{};
    asked_ |= 1u << pending_;  // not asked for: skipped, as Order::Contract skips it
    state_ = State::Value;
  }
}

int Object::key_index(const char* key) const {
  for (int i = 0; i < key_count_; ++i) {
    if (same_key(keys_[i].name, key)) return static_cast<int>(i);
  }
  TORCH_INTERNAL_ASSERT(false, "the reader asked for a key its table does not have: ", key);
}

// The index in keys_ of a key read in Order::Text; -1 for one to skip
// (unknown, in a newer minor version's file); fails at one this version
// does not have.
int Object::classify(std::string_view key) const {
  const FileInfo& file = c_.file();
  for (int i = 0; i < key_count_; ++i) {
    const char* name = keys_[i].name;
    size_t k = 0;
    while (k < key.size() && name[k] != '\0' && name[k] == key[k]) ++k;
    if (k == key.size() && name[k] == '\0') {
      if (keys_[i].since > file.minor) unknown_key(key, keys_[i].since);
      return static_cast<int>(i);
    }
  }
  if (file.strict) unknown_key(key, -1);
  return -1;
}

void Object::unknown_key(std::string_view key, int since) const {
  // A key of a later version in a file that says it is older: say so.
  const FileInfo& file = c_.file();
  self_.fail("unknown key '" + std::string(key) + "'" +
             (since > file.minor ? " in a file of version " + std::to_string(file.major) + "." +
                                       std::to_string(file.minor) + " (version 1." +
                                       std::to_string(since) + " added it)"
                                 : std::string()));
}

}  // namespace torchcap::format
