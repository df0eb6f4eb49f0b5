// Note [Field cursor]: the reader reads the JSON text of a `.tcg` file
// straight into what it describes, without a tree. A Cursor walks the text; a
// Field is one value in it, which knows the entry it belongs to ("node %add
// (nodes[3])", with the byte where that entry starts) and its path there
// ("args[1]", "meta.val.tensors[0].sizes"); typed reads on a Field fail with
// a FormatError naming file, byte, entry and path. Nothing of that text is
// made unless something fails: a Field is a few pointers, and its path is its
// chain of parents. An Object reads the members of an object, an array's
// elements come to a callback; both check what the format allows (RFC 8259
// to the letter, Note [Keys by version]) as they go.
//
// The text, the Cursor and the Entries belong to the reader and outlive
// every Field, Object and view made from them during one reading.
#pragma once

#include "serialize/format.h"
#include "serialize/utf8.h"

#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace torchcap::format {

// What every message from one file shares, and what Object::check_keys needs.
struct FileInfo {
  std::string source;  // the path, or the name given to load_from_buffer
  uint16_t major = 0, minor = 0;
  bool strict = true;  // a version this build knows: unknown keys are errors
};

// "SOURCE: byte OFFSET: WHAT", as a FormatError.
[[noreturn]] void fail_at(const FileInfo& file, uint64_t offset, const std::string& what);

// One element of a table ("nodes[3]", "tensors[0]") or one top-level value
// ("'signature'"), with the byte where it starts; once its name is read, it
// is called by it ("node %addmm (nodes[3])").
struct Entry {
  const FileInfo* file = nullptr;
  uint64_t offset = 0;
  const char* table = nullptr;  // "nodes", or nullptr for a top-level value
  const char* key = nullptr;    // the top-level key, if not a table element
  size_t index = 0;
  const char* noun = nullptr;   // "node", "tensor", "attribute": once named
  const std::string* name = nullptr;

  std::string label() const;
  // "LABEL: PATH: WHAT", leaving out what is empty.
  [[noreturn]] void fail(const std::string& path, const std::string& what) const;
};

// Note [Reading in the contract's order]: docs/FORMAT.md says which problem
// a loader reports when a file has several: anything wrong with the JSON
// text first, then the tensor table, the attributes, the module stacks, the
// nodes in order, the specs; inside an object, an unknown key before the
// members, and the members in the order the reader asks for them. The
// writer's text is not in that order (the nodes come before the tensors),
// and reading it as it comes, in one pass, is what makes loading fast. So
// the reader reads a file in Order::Text first, checking everything; should
// anything fail, it reads the file again in Order::Contract, where the text
// is checked whole first (json_scan.h, then nlohmann::json's parser for its
// syntax errors), every object is looked over before its members are read,
// and an array whose length is checked is counted before its elements; and
// it reports the first problem found that way. Both are the same grammar on
// the same cursor; only the order differs.
enum class Order { Text, Contract };

// Thrown in Order::Text where the text is not in the order the grammar asks
// for it (a member after one asked for later, a key twice), or where that
// order cannot decide what to report: the file is then read in
// Order::Contract, which can.
struct ReadAgain {};

class Field;
class Object;

class Cursor {
 public:
  // `begin` is at byte `offset` of the file.
  Cursor(const char* begin, const char* end, uint64_t offset, const FileInfo& file, Order order)
      : begin_(begin), end_(end), p_(begin), offset_(offset), file_(&file), order_(order) {}

  Order order() const { return order_; }
  const FileInfo& file() const { return *file_; }
  const char* begin() const { return begin_; }
  const char* position() const { return p_; }
  void seek(const char* at) { p_ = at; }
  uint64_t offset_of(const char* at) const {
    return offset_ + static_cast<uint64_t>(at - begin_);
  }

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
    if (peek() != c) syntax_error();
    ++p_;
  }
  bool accept(char c) {
    if (peek() != c) return false;
    ++p_;
    return true;
  }
  // '{' or '[', counted against kMaxJsonDepth; close() ends it.
  void open(char c) {
    expect(c);
    if (++depth_ > kMaxJsonDepth) too_deep(p_ - 1);
  }
  void close(char c) {
    expect(c);
    --depth_;
  }
  // Consumes the string `"name"` if it comes next, spelled without escapes.
  bool take_key(const char* name) {
    if (peek() != '"') return false;
    const char* q = p_ + 1;
    for (; *name != '\0'; ++name, ++q) {
      if (q == end_ || *q != *name) return false;
    }
    if (q == end_ || *q != '"') return false;
    p_ = q + 1;
    return true;
  }
  // Where the value that comes next starts.
  const char* value_start() {
    if (peek() == '\0') syntax_error();  // the end, or a NUL byte
    return p_;
  }
  // Counts the containers around the cursor as those around a top-level
  // value: for values read after the walk through the document.
  void inside_document() { depth_ = 1; }
  // The container just opened ended at once ("[]", "{}").
  void left() { --depth_; }

  // A string. The view points into the text when the string has no escapes,
  // else into the cursor's scratch; either way it is valid until the next
  // string is read.
  std::string_view string();

  // A number: an integer literal (no fraction, no exponent; `fits` false if
  // it is beyond int64_t) or any other literal, read as a double.
  struct Number {
    bool is_integer;
    bool fits;
    int64_t i;
    double d;
    std::string_view text;
  };
  Number number();

  // `word` ("true", "false", "null"), which must come next.
  void literal(std::string_view word) {
    ws();
    if (static_cast<size_t>(end_ - p_) < word.size() ||
        std::memcmp(p_, word.data(), word.size()) != 0) {
      syntax_error();
    }
    p_ += word.size();
  }

  // Reads the value that starts next, checked, and drops it.
  void skip_value();

  // What the value at `at` is, as messages name it ("an integer").
  const char* type_name(const char* at) const;

  // The text is not JSON at `at`. In Order::Contract the whole text was
  // checked first, so this is reached in Order::Text only.
  [[noreturn]] void syntax_error(const char* at = nullptr) const;

 private:
  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  std::string_view escaped_string(const char* start);
  double slow_double(std::string_view text) const;
  [[noreturn]] void too_deep(const char* at) const;

  const char* begin_;
  const char* end_;
  const char* p_;
  uint64_t offset_;
  const FileInfo* file_;
  Order order_;
  int depth_ = 0;  // containers open around the cursor, the document's own included
  std::string scratch_;
};

// One JSON value: where it is in the text, and in the file (its entry and its
// path there). A member or element Field refers to its parent Field, so it may
// not outlive it: Fields are passed down, never returned up, and an Object,
// which hands out members, is made only from a named Field. Reading a Field
// moves the cursor to it and past it.
class Field {
 public:
  // The value at `at`, the whole of `entry`.
  Field(Cursor& c, const Entry& entry, const char* at) : c_(&c), entry_(&entry), at_(at) {}
  // Member `key` of `parent`, for a message about it only.
  Field(const Field& parent, const char* key)
      : c_(parent.c_), entry_(parent.entry_), parent_(&parent), key_(key) {}

  // The same value as the whole of `entry`: a table's element as its entry.
  Field in(const Entry& entry) const { return Field(*c_, entry, at_); }

  Cursor& cursor() const { return *c_; }
  const Entry& entry() const { return *entry_; }
  const char* at() const { return at_; }
  uint64_t offset() const { return c_->offset_of(at_); }
  size_t index() const { return index_; }  // of an element
  const char* key() const { return key_; }  // of a member

  // Where this field is inside its entry: "args[1][0]".
  std::string path() const;
  [[noreturn]] void fail(const std::string& what) const;

  // --- What the value is, without reading it --------------------------------

  char first() const { return *at_; }
  bool is_null() const { return *at_ == 'n'; }
  bool is_string() const { return *at_ == '"'; }
  bool is_array() const { return *at_ == '['; }
  bool is_object() const { return *at_ == '{'; }
  bool is_boolean() const { return *at_ == 't' || *at_ == 'f'; }
  bool is_number() const { return *at_ == '-' || (*at_ >= '0' && *at_ <= '9'); }
  bool is_integer() const;  // a number without fraction or exponent
  const char* type_name() const { return c_->type_name(at_); }

  // --- Typed reads: each fails naming this field ------------------------------

  // Members in order, or looked over first (Note [Reading in the contract's
  // order]); indexed_object() always looks them over, for an object whose
  // keys depend on one of its members (a spec's on its kind).
  Object object() const&;
  Object object() const&& = delete;
  Object indexed_object() const&;
  Object indexed_object() const&& = delete;

  // `each(element)` for every element. With `count`, also `count(n)` with
  // the number of elements: before any is read in Order::Contract (so that a
  // wrong count is reported before what is wrong with an element), after
  // the last in Order::Text.
  void elements(c10::function_ref<void(const Field&)> each) const { elements(nullptr, each); }
  void elements(c10::function_ref<void(size_t)> count,
                c10::function_ref<void(const Field&)> each) const;

  std::string_view string() const {
    if (!is_string()) fail(std::string("expected a string, got ") + type_name());
    c_->seek(at_);
    return c_->string();
  }
  bool boolean() const {
    if (!is_boolean()) fail(std::string("expected a boolean, got ") + type_name());
    c_->seek(at_);
    const bool b = *at_ == 't';
    c_->literal(b ? "true" : "false");
    return b;
  }
  void null() const {
    c_->seek(at_);
    c_->literal("null");
  }
  Cursor::Number number() const {
    c_->seek(at_);
    return c_->number();
  }
  int64_t integer() const {
    if (!is_number()) fail(std::string("expected an integer, got ") + type_name());
    Cursor::Number n = number();
    if (!n.is_integer) fail("expected an integer, got a float");
    if (!n.fits) fail("integer " + std::string(n.text) + " does not fit in 64 signed bits");
    return n.i;
  }
  int64_t non_negative() const {
    int64_t i = integer();
    if (i < 0) fail("expected a non-negative integer, got " + std::to_string(i));
    return i;
  }
  // Sizes (each non-negative) or strides, into a Dims or a vector.
  template <typename Out>
  void dims(bool sizes, Out& out) const {
    out.clear();
    elements(
        [&](size_t n) {
          if (n > kMaxTensorDims) {
            fail(std::to_string(n) + " dimensions; the format allows at most " +
                 std::to_string(kMaxTensorDims));
          }
        },
        [&](const Field& d) { out.push_back(sizes ? d.non_negative() : d.integer()); });
  }
  // A float: a number with a fraction or exponent, or a string naming a
  // value that is not finite. `as` is the field a problem is reported at (a
  // spec's constant {"float": "nan"} is named by the constant's path).
  double float_value() const { return float_value_as(*this); }
  double float_value_as(const Field& as) const;
  c10::ScalarType dtype() const;
  c10::Device device() const;
  // The value this string names in `table` (Note [Wire tokens]); `what`
  // says what it names, for the message.
  template <typename T, size_t N>
  T token(const Token<T> (&table)[N], const char* what) const {
    std::string_view s = string();
    std::optional<T> value = token_value(table, s);
    if (!value) fail(std::string("unknown ") + what + " '" + std::string(s) + "'");
    return *value;
  }

  // The value's text, checked, with the cursor after it.
  std::string_view text() const {
    c_->seek(at_);
    c_->skip_value();
    return std::string_view(at_, static_cast<size_t>(c_->position() - at_));
  }

 private:
  friend class Object;
  Field(const Field& parent, const char* key, size_t index, const char* at)
      : c_(parent.c_), entry_(parent.entry_), parent_(&parent), key_(key), index_(index), at_(at) {}

  Cursor* c_;
  const Entry* entry_;
  const Field* parent_ = nullptr;  // nullptr: the entry's own value
  const char* key_ = nullptr;      // a member name, or nullptr for an index
  size_t index_ = 0;
  const char* at_ = nullptr;       // nullptr: a Field for messages only
};

// The members of an object, asked for by key. In Order::Text they are read as
// they come: each key asked for must be the next in the text, or absent (a
// key asked for later comes next); a member after one asked for later, or a
// key twice, throws ReadAgain. In Order::Contract the object is looked over
// first (keys, last of repeated keys wins, as JSON parsers do) and members are
// read in any order. Either way every member is checked against the keys
// check_keys gave, and close() leaves the cursor after the object. An Object
// refers to the Field it was made from, which must outlive it.
class Object {
 public:
  Object(const Field& self, bool indexed) : self_(self), c_(self.cursor()) {
    c_.seek(self.at());
    c_.open('{');
    if (indexed) index();
  }
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  ~Object() {
    if (index_ != nullptr) drop_index();
  }

  // Note [Keys by version]: in a file of a version this build knows, the
  // object holds no key that version does not have. In Order::Text, set
  // before any member is asked for, and checked as each comes.
  void check_keys(const Keys& keys) {
    keys_ = keys.begin();
    key_count_ = static_cast<int>(keys.size());
    if (index_ != nullptr) check_indexed_keys(keys);
  }

  // Member `key`, if there is one.
  std::optional<Field> find(const char* key) {
    const char* at = locate(key);
    if (at == nullptr) return std::nullopt;
    return member(key, at);
  }
  // Member `key`; fails if there is none.
  Field get(const char* key) {
    const char* at = locate(key);
    if (at == nullptr) missing(key);
    return member(key, at);
  }
  // Whether member `key` is there (asked for, in Order::Text, in turn).
  bool has(const char* key);
  // How many members there are (an indexed object's).
  size_t size() const;

  // For an object of exactly one member, whatever its key (a typed
  // argument): that key, or nullopt if the object has none or (as far as
  // can be told before reading on) several. The view is valid until the
  // next string is read; only_value() then gives the member, named `key`.
  std::optional<std::string_view> only_key();
  Field only_value(const char* key);

  // Order::Text: `visit(member)` for each member as it comes, its key being
  // one of check_keys' (others are refused or, in a newer minor version,
  // skipped).
  void members(c10::function_ref<void(const Field&)> visit);

  // Past the object's end; in Order::Text, past members not asked for too.
  void close();

 private:
  struct Index;
  enum class State { Start, Value, AtKey, Loaded, End };
  void index();
  void drop_index();
  void check_indexed_keys(const Keys& keys) const;
  // Where member `key`'s value starts; nullptr if there is none.
  const char* locate(const char* key);
  const char* locate_indexed(const char* key) const;
  [[noreturn]] void missing(const char* key) const;
  void advance();
  void load();
  int key_index(const char* key) const;
  int classify(std::string_view key) const;
  [[noreturn]] void unknown_key(std::string_view key, int since) const;
  Field member(const char* key, const char* at) const { return Field(self_, key, 0, at); }

  const Field& self_;
  Cursor& c_;
  const Key* keys_ = nullptr;
  int key_count_ = 0;
  Index* index_ = nullptr;  // looked over first (Order::Contract, indexed_object)
  // As they come: the keys_ asked for and found; where the cursor is (after
  // a value handed out at value_at_, at the next key, after a key read into
  // pending_, its index in keys_, or pending_key_ when there are no keys_);
  // and the key most likely asked for next.
  uint32_t asked_ = 0, found_ = 0;
  State state_ = State::Start;
  int pending_ = -1;
  int next_ = 0;
  const char* value_at_ = nullptr;
  std::string_view pending_key_;
};

inline Object Field::object() const& {
  if (!is_object()) fail(std::string("expected an object, got ") + type_name());
  return Object(*this, c_->order() == Order::Contract);
}

inline Object Field::indexed_object() const& {
  if (!is_object()) fail(std::string("expected an object, got ") + type_name());
  return Object(*this, true);
}

}  // namespace torchcap::format
