// Loading `.tcg` files (docs/FORMAT.md), verifying everything on the way.
//
// Note [Reading hostile files]: the reader assumes nothing about the bytes.
// Every header field, offset and length is checked against the file's real
// size with overflow-safe arithmetic before it is used (format::check_header,
// beside the header's encoding); the JSON text is
// bounded by the file size and by kMaxJsonSize, and its nesting by
// kMaxJsonDepth, checked by a flat scan before the parser or any recursive
// function sees it; no count read from the file is used to reserve memory;
// tensors are views of the file's bytes, so their sizes cost nothing until
// read. The graph is built with the same API a user has (Graph::call_function
// resolves the operator, names are kept) and each node is
// checked against its schema as it is made, so the first problem is reported
// with the byte where its node starts.
#include <torchcap/error.h>
#include <torchcap/serialize.h>

#include "graph/operator_name.h"
#include "graph/schema_check.h"
#include "serialize/format.h"
#include "serialize/json_cursor.h"
#include "serialize/json_scan.h"
#include "serialize/reader.h"
#include "serialize/shapes.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace torchcap {
namespace {

using Json = nlohmann::json;

// The bytes being read. Every loaded tensor holds a reference, so they live
// as long as the last tensor that points into them.
class Bytes {
 public:
  virtual ~Bytes() = default;
  unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }

 protected:
  unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

// Note [Copy-on-write mapping]: the file is mapped MAP_PRIVATE with write
// permission. Pages are read from the page cache on first touch and shared
// with every other process mapping the file; a write (a BatchNorm running
// mean updated in place, say) copies that one page for this process and
// never reaches the file.
class MappedFile : public Bytes {
 public:
  MappedFile(void* addr, uint64_t size) {
    data_ = static_cast<unsigned char*>(addr);
    size_ = size;
  }
  ~MappedFile() override { ::munmap(data_, size_); }
};

// A copy of caller-owned bytes, aligned like a mapping so that tensors in it
// are aligned as the format promises.
class AlignedCopy : public Bytes {
 public:
  AlignedCopy(const void* src, uint64_t size) {
    // aligned_alloc needs a size that is a multiple of the alignment, and > 0.
    data_ = static_cast<unsigned char*>(
        std::aligned_alloc(format::kAlignment, std::max<uint64_t>(format::align_up(size), 64)));
    if (data_ == nullptr) throw std::bad_alloc();
    if (size > 0) std::memcpy(data_, src, size);
    size_ = size;
  }
  ~AlignedCopy() override { std::free(data_); }
};
// An operator outside LibTorch's own namespaces (torchvision::nms, a user's
// library): present only if its library was loaded into the process.
bool is_custom_operator(const std::string& target) {
  if (target.find("::") == std::string::npos) return false;
  for (const char* ns : {"aten::", "prim::", "prims::"}) {
    if (target.rfind(ns, 0) == 0) return false;
  }
  return true;
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const char* json_type(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a float";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a binary value";
  }
}

// What every message from one file shares, and what check_keys needs.
struct FileInfo {
  std::string source;  // the path, or the name given to load_from_buffer
  uint16_t major = 0, minor = 0;
  bool strict = true;  // a version this build knows: unknown keys are errors
};

[[noreturn]] void fail_at(const FileInfo& file, uint64_t offset, const std::string& what) {
  throw FormatError(file.source + ": byte " + std::to_string(offset) + ": " + what);
}

// Note [Field cursor]: what the reader is reading, and where. An Entry is one
// element of a table ("nodes[3]", "tensors[0]") or one top-level value
// ("'signature'"), with the byte where it starts; once its name is read, it
// is called by it ("node %addmm (nodes[3])"). A Field is a JSON value inside
// an entry with its path there ("args[1][0]", "meta.val.tensors[0].sizes").
// Typed reads on a Field (`node["name"].string()`) fail with a FormatError
// naming file, byte, entry and path. Nothing of that text is made unless
// something fails: a Field is a few pointers, and its path is its chain of
// parents.
struct Entry {
  const FileInfo* file = nullptr;
  uint64_t offset = 0;
  const char* table = nullptr;  // "nodes", or nullptr for a top-level value
  const char* key = nullptr;    // the top-level key, if not a table element
  size_t index = 0;
  const char* noun = nullptr;   // "node", "tensor", "attribute": once named
  const std::string* name = nullptr;

  std::string label() const {
    if (table == nullptr) return key == nullptr ? std::string() : "'" + std::string(key) + "'";
    std::string element = std::string(table) + "[" + std::to_string(index) + "]";
    if (name == nullptr) return element;
    if (std::strcmp(noun, "node") == 0) return "node %" + *name + " (" + element + ")";
    return std::string(noun) + " '" + *name + "' (" + element + ")";
  }

  // "LABEL: PATH: WHAT", leaving out what is empty.
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    std::string prefix = label();
    if (!path.empty()) prefix += prefix.empty() ? path : ": " + path;
    fail_at(*file, offset, prefix.empty() ? what : prefix + ": " + what);
  }
};

// A Field refers to its parent, as a std::string_view to its string: it may
// not outlive the Field it was reached from. Members and elements are
// therefore only reached from named Fields (`f["a"]` on a temporary does not
// compile), and Fields are passed down, never returned up.
class Field {
 public:
  Field(const Json& v, const Entry& entry) : v_(&v), entry_(&entry) {}

  const Json& json() const { return *v_; }
  const Entry& entry() const { return *entry_; }

  // Member `key`; fails if there is none.
  Field operator[](const char* key) const& {
    auto it = v_->find(key);
    if (it == v_->end()) fail(std::string("missing '") + key + "'");
    return Field(*it, this, key, 0);
  }
  Field operator[](const char* key) const&& = delete;
  // Element `i` of an array that has it.
  Field operator[](size_t i) const& { return Field((*v_)[i], this, nullptr, i); }
  Field operator[](size_t i) const&& = delete;
  // Member `key`, if there is one.
  std::optional<Field> find(const char* key) const& {
    auto it = v_->find(key);
    if (it == v_->end()) return std::nullopt;
    return Field(*it, this, key, 0);
  }
  std::optional<Field> find(const char* key) const&& = delete;
  bool has(const char* key) const { return v_->contains(key); }
  size_t size() const { return v_->size(); }

  // Where this field is inside its entry: "args[1][0]".
  std::string path() const {
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

  [[noreturn]] void fail(const std::string& what) const { entry_->fail(path(), what); }

  // --- Typed reads: each fails naming this field ---------------------------

  const Field& object() const {
    if (!v_->is_object()) fail(std::string("expected an object, got ") + json_type(*v_));
    return *this;
  }

  const Field& array() const {
    if (!v_->is_array()) fail(std::string("expected an array, got ") + json_type(*v_));
    return *this;
  }

  const std::string& string() const {
    if (!v_->is_string()) fail(std::string("expected a string, got ") + json_type(*v_));
    return v_->get_ref<const std::string&>();
  }

  int64_t integer() const {
    if (v_->is_number_unsigned()) {
      uint64_t u = v_->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail("integer " + std::to_string(u) + " does not fit in 64 signed bits");
      }
      return static_cast<int64_t>(u);
    }
    if (!v_->is_number_integer()) fail(std::string("expected an integer, got ") + json_type(*v_));
    return v_->get<int64_t>();
  }

  int64_t non_negative() const {
    int64_t i = integer();
    if (i < 0) fail("expected a non-negative integer, got " + std::to_string(i));
    return i;
  }

  // Sizes (each non-negative) or strides.
  std::vector<int64_t> dims(bool sizes) const {
    array();
    if (size() > format::kMaxTensorDims) {
      fail(std::to_string(size()) + " dimensions; the format allows at most " +
           std::to_string(format::kMaxTensorDims));
    }
    std::vector<int64_t> out;
    out.reserve(size());
    for (size_t i = 0; i < size(); ++i) {
      Field d = (*this)[i];
      out.push_back(sizes ? d.non_negative() : d.integer());
    }
    return out;
  }

  double float_value() const { return float_value_of(*v_); }

  // The float `v` holds, reported as this field: a spec's constant
  // {"float": "nan"} is named by the constant's path.
  double float_value_of(const Json& v) const {
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (!std::isfinite(d)) fail("a float written as a number must be finite");
      return d;
    }
    if (!v.is_string()) fail(std::string("expected a string, got ") + json_type(v));
    const std::string& s = v.get_ref<const std::string&>();
    std::optional<double> d = format::nonfinite_double_from_string(s);
    if (!d) fail("'" + s + "' is not inf, -inf, nan or the 0x bits of a NaN");
    return *d;
  }

  c10::ScalarType dtype() const {
    const std::string& s = string();
    std::optional<c10::ScalarType> t = format::dtype_from_name(s);
    if (!t) fail("unknown dtype '" + s + "'");
    return *t;
  }

  c10::Device device() const {
    const std::string& s = string();
    // Nearly every device in a file is "cpu": skip the parser for it.
    if (s == "cpu") return c10::Device(c10::kCPU);
    try {
      return c10::Device(s);
    } catch (const std::exception&) {
      fail("'" + s + "' is not a device");
    }
  }

  // The value this string names in `table` (Note [Wire tokens]); `what`
  // says what it names, for the message.
  template <typename T, size_t N>
  T token(const format::Token<T> (&table)[N], const char* what) const {
    const std::string& s = string();
    std::optional<T> value = format::token_value(table, s);
    if (!value) fail(std::string("unknown ") + what + " '" + s + "'");
    return *value;
  }

  // Note [Keys by version] in format.h: in a file of a version this build
  // knows, an object holds no key that version does not have.
  void check_keys(const format::Keys& allowed) const {
    const FileInfo& file = *entry_->file;
    if (!file.strict) return;
    for (auto it = v_->begin(); it != v_->end(); ++it) {
      if (format::has_key(allowed, it.key(), file.minor)) continue;
      // A key of a later version in a file that says it is older: say so.
      int since = format::key_since(allowed, it.key());
      fail("unknown key '" + it.key() + "'" +
           (since > file.minor ? " in a file of version " + std::to_string(file.major) + "." +
                                     std::to_string(file.minor) + " (version 1." +
                                     std::to_string(since) + " added it)"
                               : std::string()));
    }
  }

 private:
  Field(const Json& v, const Field* parent, const char* key, size_t index)
      : v_(&v), entry_(parent->entry_), parent_(parent), key_(key), index_(index) {}

  const Json* v_;
  const Entry* entry_;
  const Field* parent_ = nullptr;  // nullptr: the entry's own value
  const char* key_ = nullptr;      // a member name, or nullptr for an index
  size_t index_ = 0;
};

// Builds the JSON document as nlohmann::json's own parser does (last of
// repeated keys wins; its syntax errors, with their messages), except for the
// elements of the top-level array "nodes", which it counts and drops without
// making values of them (Note [Reading the nodes one at a time]).
class WithoutNodes {
 public:
  explicit WithoutNodes(Json& root) : root_(root) {}

  size_t dropped() const { return dropped_; }

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return put(Json(v)); }
  bool string(Json::string_t& v) { return put(Json(std::move(v))); }
  bool binary(Json::binary_t& v) { return put(Json::binary(std::move(v))); }
  bool start_object(size_t) { return open(Json::object()); }
  bool start_array(size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(Json::string_t& k) {
    if (skipping_ > 0) return true;
    key_ = std::move(k);
    return true;
  }
  template <typename Exception>
  bool parse_error(size_t, const std::string&, const Exception& e) {
    throw e;
  }

 private:
  // Whether the value starting now is an element of "nodes": then it is
  // dropped, and with it everything until it ends.
  bool drop() {
    if (skipping_ > 0) return true;
    if (!stack_.empty() && stack_.back() == nodes_) {
      ++dropped_;
      return true;
    }
    return false;
  }

  bool put(Json&& v) {
    if (!drop()) place(std::move(v));
    return true;
  }

  bool open(Json&& container) {
    if (drop()) {
      ++skipping_;
      return true;
    }
    const bool nodes = stack_.size() == 1 && stack_.back()->is_object() && key_ == "nodes" &&
                       container.is_array();
    Json* placed = place(std::move(container));
    if (nodes) nodes_ = placed;
    stack_.push_back(placed);
    return true;
  }

  bool close() {
    if (skipping_ > 0) {
      --skipping_;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  Json* place(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    Json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }

  Json& root_;
  std::vector<Json*> stack_;
  std::string key_;
  Json* nodes_ = nullptr;  // the top-level "nodes" array, once it starts
  size_t dropped_ = 0;
  int skipping_ = 0;  // depth inside a dropped element
};

class Reader {
 public:
  Reader(std::string source, std::shared_ptr<Bytes> bytes, const LoadOptions& options)
      : bytes_(std::move(bytes)), options_(options) {
    file_.source = std::move(source);
  }

  // The one-pass reading alone, for the Python loader (serialize/reader.h).
  std::optional<detail::OnePassRead> read_in_one_pass_only() {
    check_shapes_ = false;  // the Python loader does not check them
    try {
      read_header();
    } catch (const FormatError&) {
      return std::nullopt;
    }
    std::optional<GraphModule> gm = read_in_one_pass();
    if (!gm) return std::nullopt;
    return detail::OnePassRead{std::move(*gm), nodes_begin_, nodes_end_};
  }

  GraphModule read() {
    read_header();
    std::optional<GraphModule> gm = read_in_one_pass();
    if (!gm) {
      start_over();
      gm = read_carefully();
    }
    bind(*gm);
    return std::move(*gm);
  }

 private:
  // Note [Reading the usual file in one pass]: a file as the writer writes
  // it is read straight from its text, in one pass, into the graph (a
  // format::JsonCursor: no JSON tree for the nodes, no scan before, and a
  // stack trace that many nodes share made once). That reader is strict and
  // says nothing: at anything unusual (a key out of the writer's order,
  // escapes it cannot vouch for, a number beyond 64 bits) or wrong (any check
  // that fails) it gives up, and the file is read again by the careful
  // reader, which finds and names the problem. Both build the graph with the
  // same functions (make_node, check_arguments, read_tensors, ...), so they
  // agree on every file the first accepts.
  std::optional<GraphModule> read_in_one_pass() {
    const char* text = reinterpret_cast<const char*>(bytes_->data() + h_.json_offset);
    if (verify_checksums_ && format::crc32(text, h_.json_size) != h_.json_crc) return std::nullopt;
    try {
      format::JsonCursor c(text, text + h_.json_size);
      GraphModule gm;
      bool nodes = false;
      std::string key;
      c.object(scratch_, [&](std::string_view k) {
        key.assign(k);
        if (format::key_since(format::keys::kDocument, key) > h_.minor ||
            (file_.strict && !format::has_key(format::keys::kDocument, key, h_.minor))) {
          format::JsonCursor::give_up();
        }
        if (doc_.contains(key) || (key == "nodes" && nodes)) format::JsonCursor::give_up();
        if (key == "nodes") {
          nodes = true;
          read_module_stacks();
          c.peek();
          nodes_begin_ = static_cast<uint64_t>(c.position() - text);
          read_nodes_in_one_pass(c, gm.graph());
          nodes_end_ = static_cast<uint64_t>(c.position() - text);
        } else if (format::key_since(format::keys::kDocument, key) < 0) {
          c.skip_value(1);  // a later version's: skipped, as the careful reader does
        } else {
          if (key == "module_stacks" && nodes) format::JsonCursor::give_up();
          std::string_view value = c.value_text(1);
          doc_[key] = Json::parse(value.begin(), value.end());
        }
      });
      if (!nodes || !c.at_end()) format::JsonCursor::give_up();
      read_tensors();
      read_attributes();
      finish(gm);
      return gm;
    } catch (const std::exception&) {
      return std::nullopt;
    } catch (const format::NotUsual&) {
      return std::nullopt;
    }
  }

  // Forgets what a reading that gave up had read.
  void start_over() {
    doc_ = Json();
    scan_ = format::JsonScan();
    tensors_.clear();
    tensor_names_.clear();
    attributes_.clear();
    attributes_read_ = false;
    attribute_metas_.clear();
    module_stacks_.clear();
    nodes_apart_ = false;
    stack_traces_.clear();
  }

  GraphModule read_carefully() {
    parse_json();
    Entry document{&file_, h_.json_offset};
    Field(doc_, document).check_keys(format::keys::kDocument);
    read_tensors();
    read_attributes();
    read_module_stacks();
    GraphModule gm;
    read_nodes(gm.graph());
    finish(gm);
    return gm;
  }

  // What follows the nodes: specs, signature, attributes and lint.
  void finish(GraphModule& gm) {
    {
      Entry e = top_entry("in_spec");
      gm.in_spec = read_spec(Field(top_member("in_spec"), e));
    }
    {
      Entry e = top_entry("out_spec");
      gm.out_spec = read_spec(Field(top_member("out_spec"), e));
    }
    if (auto it = doc_.find("signature"); it != doc_.end()) {
      Entry e = top_entry("signature");
      gm.output_specs = read_signature(Field(*it, e));
    } else if (const Node* out = gm.graph().output_node()) {
      // A file without a signature returns user outputs only.
      gm.output_specs.assign(out->args()[0].to_list().size(), OutputSpec{});
    }
    for (const PendingAttribute& a : attributes_) {
      gm.set_attribute(a.name, a.tensor < 0 ? at::Tensor() : tensors_[a.tensor], a.kind);
    }
    try {
      gm.lint();
    } catch (const LintError& e) {
      fail_at(file_, top_entry("nodes").offset, e.what());
    }
    // Note [Checking a file's shapes] (shapes.cpp)
    std::optional<detail::ShapeProblem> problem;
    if (check_shapes_) problem = detail::check_shapes(gm);
    if (problem) {
      size_t index = 0;
      for (const Node* n : gm.graph()) {
        if (n == problem->node) break;
        ++index;
      }
      Entry e = table_entry("nodes", index);
      e.noun = "node";
      e.name = &problem->node->name();
      e.fail("", problem->what);
    }
  }

  // --- Nodes in one pass (Note [Reading the usual file in one pass]) ---------

  [[noreturn]] static void give_up() { format::JsonCursor::give_up(); }

  // The minor version that added `key` to `keys` if a file of this version
  // may hold it, 0 for a key to skip (unknown, in a later version's file);
  // gives up otherwise.
  int allowed_key(const format::Keys& keys, std::string_view key) const {
    for (const format::Key& k : keys) {
      if (key == k.name) {
        if (k.since > h_.minor) give_up();
        return 1;
      }
    }
    if (file_.strict) give_up();
    return 0;
  }

  void read_nodes_in_one_pass(format::JsonCursor& c, Graph& g) {
    c.expect('[');
    if (c.peek() == ']') give_up();
    do {
      read_node_in_one_pass(c, g);
    } while (c.accept(','));
    c.expect(']');
    if (g.output_node() == nullptr) give_up();
  }

  void read_node_in_one_pass(format::JsonCursor& c, Graph& g) {
    // The strings are the reader's, kept from node to node: a target such as
    // "aten::add.Tensor" is too long for a string's own buffer.
    std::string& name = node_name_;
    std::string& op = node_op_;
    std::string& target = node_target_;
    ArgumentList args;
    Kwargs kwargs;
    NodeMeta meta;
    unsigned seen = 0;
    auto once = [&](unsigned bit) {
      if (seen & bit) give_up();
      seen |= bit;
    };
    c.object(scratch_, [&](std::string_view key) {
      if (!allowed_key(format::keys::kNode, key)) {
        c.skip_value(2);
      } else if (key == "name") {
        once(1);
        name.assign(c.string(scratch_));
      } else if (key == "op") {
        once(2);
        op.assign(c.string(scratch_));
      } else if (key == "target") {
        once(4);
        target.assign(c.string(scratch_));
      } else if (key == "args") {
        once(8);
        args = arguments_in_one_pass(c, g, 3);
      } else if (key == "kwargs") {
        once(16);
        c.array([&] {
          c.expect('[');
          std::string k(c.string(scratch_));
          c.expect(',');
          kwargs.emplace_back(std::move(k), argument_in_one_pass(c, g, 4));
          c.expect(']');
        });
      } else {  // meta
        once(32);
        meta = node_meta_in_one_pass(c);
      }
    });
    if ((seen & 7) != 7) give_up();
    auto fail = [](const char*, const std::string&) { give_up(); };
    Node* n = make_node(g, name, op, target, std::move(args), std::move(kwargs), fail);
    n->meta() = std::move(meta);
    check_arguments(n, fail);
  }

  // A list of arguments, allocated once at its size: they are read into
  // arguments_, a stack of the lists being read, nested ones above.
  ArgumentList arguments_in_one_pass(format::JsonCursor& c, const Graph& g, int depth) {
    const size_t start = arguments_.size();
    c.array([&] { arguments_.push_back(argument_in_one_pass(c, g, depth)); });
    ArgumentList list(std::make_move_iterator(arguments_.begin() + static_cast<ptrdiff_t>(start)),
                      std::make_move_iterator(arguments_.end()));
    arguments_.resize(start);
    return list;
  }

  Argument argument_in_one_pass(format::JsonCursor& c, const Graph& g, int depth) {
    switch (c.peek()) {
      case 'n':
        if (!c.literal("null")) give_up();
        return Argument();
      case 't':
        if (!c.literal("true")) give_up();
        return Argument(true);
      case 'f':
        if (!c.literal("false")) give_up();
        return Argument(false);
      case '"':
        return Argument(std::string(c.string(scratch_)));
      case '[': {
        if (depth > format::JsonCursor::kMaxDepth) give_up();
        return Argument(arguments_in_one_pass(c, g, depth + 1));
      }
      case '{':
        break;
      default: {
        format::JsonCursor::Number n = c.number();
        return n.is_integer ? Argument(n.i) : Argument(n.d);
      }
    }
    c.expect('{');
    std::string_view kind = c.string(scratch_);
    std::optional<format::ArgumentTag> tag =
        format::token_value(format::kArgumentTags, std::string(kind));
    if (!tag) give_up();
    c.expect(':');
    Argument out;
    if (*tag == format::ArgumentTag::Float && c.peek() != '"') {
      format::JsonCursor::Number n = c.number();
      if (n.is_integer) give_up();
      out = Argument(n.d);
    } else {
      name_.assign(c.string(scratch_));
      switch (*tag) {
        case format::ArgumentTag::Node: {
          Node* n = g.find(name_);
          if (n == nullptr) give_up();
          out = Argument(n);
          break;
        }
        case format::ArgumentTag::Float: {
          std::optional<double> d = format::nonfinite_double_from_string(name_);
          if (!d) give_up();
          out = Argument(*d);
          break;
        }
        case format::ArgumentTag::Dtype: {
          std::optional<c10::ScalarType> t = format::dtype_from_name(name_);
          if (!t) give_up();
          out = Argument(*t);
          break;
        }
        case format::ArgumentTag::Device:
          out = Argument(device_in_one_pass(name_));
          break;
        case format::ArgumentTag::Layout: {
          std::optional<c10::Layout> l = format::token_value(format::kLayouts, name_);
          if (!l) give_up();
          out = Argument(*l);
          break;
        }
        case format::ArgumentTag::MemoryFormat: {
          std::optional<c10::MemoryFormat> m = format::token_value(format::kMemoryFormats, name_);
          if (!m) give_up();
          out = Argument(*m);
          break;
        }
      }
    }
    c.expect('}');
    return out;
  }

  static c10::Device device_in_one_pass(const std::string& s) {
    if (s == "cpu") return c10::Device(c10::kCPU);
    try {
      return c10::Device(s);
    } catch (const std::exception&) {
      give_up();
    }
  }

  // Sizes (each non-negative) or strides, read straight into `out` (inline up
  // to five dimensions, so most tensors allocate nothing here).
  static void dims_in_one_pass(format::JsonCursor& c, bool sizes, Dims& out) {
    out.clear();
    c.array([&] {
      int64_t d = c.integer();
      if (sizes && d < 0) give_up();
      if (out.size() == format::kMaxTensorDims) give_up();
      out.push_back(d);
    });
  }

  TensorMeta tensor_meta_in_one_pass(format::JsonCursor& c) {
    TensorMeta m;
    unsigned seen = 0;
    c.object(scratch_, [&](std::string_view key) {
      unsigned bit = 0;
      if (!allowed_key(format::keys::kTensorMeta, key)) {
        c.skip_value(6);
      } else if (key == "dtype") {
        bit = 1;
        std::optional<c10::ScalarType> t = format::dtype_from_name(std::string(c.string(scratch_)));
        if (!t) give_up();
        m.dtype = *t;
      } else if (key == "sizes") {
        bit = 2;
        dims_in_one_pass(c, true, m.sizes);
      } else if (key == "strides") {
        bit = 4;
        dims_in_one_pass(c, false, m.strides);
      } else {  // device
        bit = 8;
        name_.assign(c.string(scratch_));
        m.device = device_in_one_pass(name_);
      }
      if (seen & bit) give_up();
      seen |= bit;
    });
    if (seen != 15 || m.sizes.size() != m.strides.size()) give_up();
    return m;
  }

  ValueMeta value_meta_in_one_pass(format::JsonCursor& c) {
    ValueMeta val;
    unsigned seen = 0;
    c.object(scratch_, [&](std::string_view key) {
      unsigned bit = 0;
      if (!allowed_key(format::keys::kValue, key)) {
        c.skip_value(4);
      } else if (key == "kind") {
        bit = 1;
        std::optional<ValueKind> k =
            format::token_value(format::kValueKinds, std::string(c.string(scratch_)));
        if (!k) give_up();
        val.kind = *k;
      } else {  // tensors
        bit = 2;
        c.array([&] { val.tensors.push_back(tensor_meta_in_one_pass(c)); });
      }
      if (seen & bit) give_up();
      seen |= bit;
    });
    const int want = format::value_kind_tensors(val.kind);
    if (seen != 3 || (want >= 0 && val.tensors.size() != static_cast<size_t>(want))) give_up();
    return val;
  }

  // Nodes of one line of the program share its stack trace, found by its text.
  StackTrace stack_trace_in_one_pass(format::JsonCursor& c) {
    const char* start = c.position();
    std::string_view text = c.value_text(3);
    auto it = stack_traces_.find(text);
    if (it != stack_traces_.end()) return it->second;
    format::JsonCursor frames(start, text.data() + text.size());
    std::vector<SourceFrame> out;
    frames.array([&] {
        SourceFrame f;
        unsigned seen = 0;
        frames.object(scratch_, [&](std::string_view key) {
          unsigned bit = 0;
          if (!allowed_key(format::keys::kFrame, key)) {
            frames.skip_value(5);
          } else if (key == "file") {
            bit = 1;
            f.file.assign(frames.string(scratch_));
          } else if (key == "line") {
            bit = 2;
            int64_t line = frames.integer();
            if (line < 0 || line > std::numeric_limits<int>::max()) give_up();
            f.line = static_cast<int>(line);
          } else if (key == "function") {
            bit = 4;
            f.function.assign(frames.string(scratch_));
          } else {  // code
            bit = 8;
            f.code.assign(frames.string(scratch_));
          }
          if (seen & bit) give_up();
          seen |= bit;
        });
        if ((seen & 7) != 7) give_up();
        out.push_back(std::move(f));
    });
    StackTrace trace = StackTrace::from_frames(std::move(out));
    stack_traces_.emplace(text, trace);
    return trace;
  }

  NodeMeta node_meta_in_one_pass(format::JsonCursor& c) {
    NodeMeta meta;
    unsigned seen = 0;
    c.object(scratch_, [&](std::string_view key) {
      unsigned bit = 0;
      if (!allowed_key(format::keys::kMeta, key)) {
        c.skip_value(3);
      } else if (key == "val") {
        bit = 1;
        meta.val = value_meta_in_one_pass(c);
      } else if (key == "stack_trace") {
        bit = 2;
        meta.stack_trace = stack_trace_in_one_pass(c);
      } else {  // module_stack
        bit = 4;
        int64_t index = c.integer();
        if (index < 0 || static_cast<uint64_t>(index) >= module_stacks_.size()) give_up();
        meta.module_stack = module_stacks_[static_cast<size_t>(index)];
      }
      if (seen & bit) give_up();
      seen |= bit;
    });
    return meta;
  }

  // Binds LoadOptions::weights. A weightless file loaded without weights
  // keeps its meta tensors (it can be shown, not run); given weights, every
  // weightless tensor needs one. The file's name leads the message.
  void bind(GraphModule& gm) const {
    if (options_.weights.empty()) return;
    try {
      gm.bind_weights(options_.weights, BindOptions{options_.strict_weights});
    } catch (const WeightError& e) {
      std::string what = e.what();
      const std::string hint = "BindOptions::strict = false";
      if (auto at = what.find(hint); at != std::string::npos) {
        what.replace(at, hint.size(), "LoadOptions::strict_weights = false");
      }
      throw WeightError(file_.source + ": " + what);
    }
  }

  // --- Header and JSON -------------------------------------------------------

  void read_header() {
    format::CheckedHeader checked =
        format::check_header(bytes_->data(), bytes_->size(), options_.verify_checksums);
    if (!checked.problem.empty()) fail_at(file_, checked.problem_at, checked.problem);
    h_ = checked.header;
    file_.major = h_.major;
    file_.minor = h_.minor;
    file_.strict = format::is_known_minor(h_.minor);
    checksums_ = format::has_checksums(h_.minor);
    verify_checksums_ = checksums_ && options_.verify_checksums;
  }

  void parse_json() {
    const char* text = reinterpret_cast<const char*>(bytes_->data() + h_.json_offset);
    if (verify_checksums_) {
      uint32_t crc = format::crc32(text, h_.json_size);
      if (crc != h_.json_crc) {
        fail_at(file_, h_.json_offset,
                "the JSON section is damaged: its CRC-32 is 0x" + format::hex_digits(crc, 8) +
                    ", the header records 0x" + format::hex_digits(h_.json_crc, 8));
      }
    }
    scan_ = format::scan_json(text, h_.json_size, format::kMaxJsonDepth);
    if (scan_.nul) {
      fail_at(file_, h_.json_offset + scan_.nul_at, "the JSON section contains a NUL byte");
    }
    if (scan_.big_integer) {
      fail_at(file_, h_.json_offset + scan_.big_integer_at,
              "integer " + scan_.big_integer_text + " does not fit in 64 signed bits");
    }
    if (scan_.too_deep) {
      fail_at(file_, h_.json_offset + scan_.too_deep_at,
              "the JSON nests deeper than " + std::to_string(format::kMaxJsonDepth) + " levels");
    }
    try {
      doc_ = parse_without_nodes(text);
    } catch (const Json::exception& e) {
      // Syntax errors know their byte; a number too large for a double
      // (out_of_range) does not, and is reported at the section's start.
      uint64_t at = h_.json_offset;
      if (const auto* pe = dynamic_cast<const Json::parse_error*>(&e)) {
        at += std::min<uint64_t>(pe->byte > 0 ? pe->byte - 1 : 0, h_.json_size);
      }
      std::string what = e.what();
      size_t bracket = what.find("] ");
      if (bracket != std::string::npos) what = what.substr(bracket + 2);
      fail_at(file_, at, "the JSON section is not valid JSON: " + what);
    }
    if (!doc_.is_object()) {
      fail_at(file_, h_.json_offset,
              "the JSON section must hold an object, not " + std::string(json_type(doc_)));
    }
  }

  // Note [Reading the nodes one at a time]: the nodes are most of a big
  // graph's JSON, and a parsed JSON tree takes several times its text. The
  // document is parsed (and so checked) whole, but without the elements of
  // "nodes", which read_nodes then parses one at a time from the offsets the
  // scan found. Should the scan and the parser disagree on those elements
  // (a key spelled with escapes, "nod\u0065s"), the document is parsed again
  // whole and the nodes read from it.
  Json parse_without_nodes(const char* text) {
    Json doc;
    WithoutNodes sax(doc);
    Json::sax_parse(text, text + h_.json_size, &sax);
    const size_t dropped = sax.dropped();
    auto starts = scan_.elements.find("nodes");
    auto ends = scan_.element_ends.find("nodes");
    const bool found = starts != scan_.elements.end() && ends != scan_.element_ends.end() &&
                       starts->second.size() == dropped && ends->second.size() == dropped;
    if (dropped > 0 && !found) return Json::parse(text, text + h_.json_size);
    nodes_apart_ = dropped > 0;
    return doc;
  }

  // Node `i`, parsed from its text alone (Note [Reading the nodes one at a time]).
  Json node_json(size_t i) const {
    const char* text = reinterpret_cast<const char*>(bytes_->data() + h_.json_offset);
    return Json::parse(text + scan_.elements.at("nodes")[i],
                       text + scan_.element_ends.at("nodes")[i]);
  }

  // A top-level value, such as 'signature', for messages.
  Entry top_entry(const char* key) const {
    auto it = scan_.values.find(key);
    Entry e{&file_, it == scan_.values.end() ? h_.json_offset : h_.json_offset + it->second};
    e.key = key;
    return e;
  }

  // Element `i` of top-level array `table`, for messages.
  Entry table_entry(const char* table, size_t i) const {
    Entry e{&file_, top_entry(table).offset};
    auto it = scan_.elements.find(table);
    if (it != scan_.elements.end() && i < it->second.size()) {
      e.offset = h_.json_offset + it->second[i];
    }
    e.table = table;
    e.index = i;
    return e;
  }

  const Json& top_member(const char* key) const {
    auto it = doc_.find(key);
    if (it == doc_.end()) {
      fail_at(file_, h_.json_offset, "the JSON section has no '" + std::string(key) + "'");
    }
    return *it;
  }

  // --- Tensors ---------------------------------------------------------------

  void read_tensors() {
    Entry table_at = top_entry("tensors");
    Field table(top_member("tensors"), table_at);
    table.array();
    std::set<std::string> names;
    // (offset, length, index) of every non-empty tensor, to find overlaps.
    std::vector<std::tuple<uint64_t, uint64_t, size_t>> ranges;
    for (size_t i = 0; i < table.size(); ++i) {
      Entry e = table_entry("tensors", i);
      Field t(table.json()[i], e);
      t.object().check_keys(format::keys::kTensor);
      const std::string& name = t["name"].string();
      if (name.empty()) t["name"].fail("the name is empty");
      e.noun = "tensor";
      e.name = &name;
      if (!names.insert(name).second) t["name"].fail("a second tensor has this name");

      Field dtype = t["dtype"];
      c10::ScalarType type = dtype.dtype();
      if (!format::is_storable_dtype(type)) {
        dtype.fail(std::string("tensors of dtype ") + format::dtype_name(type) +
                   " cannot be stored in the data section");
      }
      std::vector<int64_t> sizes = t["sizes"].dims(true);
      Field strides_field = t["strides"];
      std::vector<int64_t> strides = strides_field.dims(true);
      if (strides.size() != sizes.size()) {
        strides_field.fail(std::to_string(strides.size()) + " strides for " +
                           std::to_string(sizes.size()) + " dimensions");
      }
      if (auto flag = t.find("weightless")) {
        read_weightless(t, *flag, type, sizes, strides);
        tensor_names_.push_back(name);
        continue;
      }
      Field offset_field = t["offset"];
      const uint64_t offset = static_cast<uint64_t>(offset_field.non_negative());
      Field length_field = t["length"];
      const uint64_t length = static_cast<uint64_t>(length_field.non_negative());
      uint32_t recorded_crc = 0;
      if (checksums_) {
        Field crc_field = t["crc32"];
        int64_t crc = crc_field.non_negative();
        if (crc > int64_t{0xffffffff}) {
          crc_field.fail("CRC-32 " + std::to_string(crc) + " does not fit in 32 bits");
        }
        recorded_crc = static_cast<uint32_t>(crc);
      }

      uint64_t expected = 0;
      if (!byte_span(sizes, strides, c10::elementSize(type), expected)) {
        t.fail("sizes " + list_str(sizes) + " with strides " + list_str(strides) +
               " span more bytes than 64 bits can count");
      }
      if (length != expected) {
        length_field.fail("byte length " + std::to_string(length) + " does not match dtype " +
                          format::dtype_name(type) + ", sizes " + list_str(sizes) +
                          " and strides " + list_str(strides) + ", which span " +
                          std::to_string(expected) + " bytes");
      }
      if (offset % format::kAlignment != 0) {
        offset_field.fail("offset " + std::to_string(offset) + " is not a multiple of " +
                          std::to_string(format::kAlignment));
      }
      if (offset > h_.data_size || length > h_.data_size - offset) {
        t.fail("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
               ") of the data section extend past its end at " + std::to_string(h_.data_size));
      }
      if (length > 0) ranges.emplace_back(offset, length, i);

      unsigned char* data = bytes_->data() + h_.data_offset + offset;
      if (verify_checksums_) {
        uint32_t crc = format::crc32(data, length);
        if (crc != recorded_crc) {
          fail_at(file_, h_.data_offset + offset,
                  e.label() + ": its bytes are damaged: their CRC-32 is 0x" +
                      format::hex_digits(crc, 8) + ", the tensor table records 0x" +
                      format::hex_digits(recorded_crc, 8));
        }
      }
      if (type == c10::ScalarType::Bool) check_bools(data, length, e);
      std::shared_ptr<Bytes> keep = bytes_;
      tensors_.push_back(at::from_blob(
          data, sizes, strides, [keep](void*) mutable { keep.reset(); },
          at::TensorOptions().dtype(type)));
      tensor_names_.push_back(name);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t k = 1; k < ranges.size(); ++k) {
      auto [prev_offset, prev_length, prev_index] = ranges[k - 1];
      auto [offset, length, index] = ranges[k];
      if (offset < prev_offset + prev_length) {
        // Named at the later of the two table entries, as if read in order.
        size_t later = std::max(index, prev_index), earlier = std::min(index, prev_index);
        Entry e = table_entry("tensors", later);
        e.noun = "tensor";
        e.name = &tensor_names_[later];
        e.fail("", "its bytes overlap those of tensor '" + tensor_names_[earlier] + "'");
      }
    }
  }

  // Note [Weightless tensors] in format.h: an entry with its metadata only,
  // which becomes a meta tensor (no memory) for LoadOptions::weights to bind.
  void read_weightless(const Field& t, const Field& flag, c10::ScalarType type,
                       const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
    const Json& v = flag.json();
    if (!v.is_boolean() || !v.get<bool>()) {
      flag.fail(std::string("expected true, got ") + (v.is_boolean() ? "false" : json_type(v)));
    }
    for (const char* key : {"offset", "length", "crc32"}) {
      if (t.has(key)) {
        t[key].fail("a weightless tensor has no bytes in the file, so no '" + std::string(key) +
                    "'");
      }
    }
    uint64_t span = 0;
    if (!byte_span(sizes, strides, c10::elementSize(type), span)) {
      t.fail("sizes " + list_str(sizes) + " with strides " + list_str(strides) +
             " span more bytes than 64 bits can count");
    }
    tensors_.push_back(at::empty_strided(
        sizes, strides, at::TensorOptions().dtype(type).device(c10::kMeta)));
  }

  // The bytes a view covers, from its first to its last element; false on overflow.
  static bool byte_span(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                        size_t item, uint64_t& out) {
    for (int64_t s : sizes) {
      if (s == 0) {
        out = 0;
        return true;
      }
    }
    uint64_t span = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      uint64_t step;
      if (__builtin_mul_overflow(static_cast<uint64_t>(sizes[d] - 1),
                                 static_cast<uint64_t>(strides[d]), &step) ||
          __builtin_add_overflow(span, step, &span)) {
        return false;
      }
    }
    // LibTorch counts elements and bytes in int64_t.
    if (__builtin_mul_overflow(span, item, &out) ||
        out > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    // The number of elements must fit too, even where strides overlap.
    uint64_t numel = 1;
    for (int64_t s : sizes) {
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(s), &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return false;
      }
    }
    return true;
  }

  // A bool that is neither 0 nor 1 is undefined behaviour in the kernels that
  // read it; bool tensors are small, so their bytes are checked.
  void check_bools(const unsigned char* data, uint64_t length, const Entry& e) const {
    for (uint64_t k = 0; k < length; ++k) {
      if (data[k] > 1) {
        fail_at(file_, h_.data_offset + (data + k - (bytes_->data() + h_.data_offset)),
                e.label() + ": bool byte " + std::to_string(data[k]) + " is neither 0 nor 1");
      }
    }
  }

  // --- Module stacks ---------------------------------------------------------

  // The table of distinct module stacks nodes refer to by index (version 1.2).
  // Each entry becomes one ModuleStack, which the nodes then share.
  void read_module_stacks() {
    auto it = doc_.find("module_stacks");
    if (it == doc_.end()) return;
    Entry table_at = top_entry("module_stacks");
    Field table(*it, table_at);
    table.array();
    for (size_t i = 0; i < table.size(); ++i) {
      Entry e = table_entry("module_stacks", i);
      Field list(table.json()[i], e);
      list.array();
      std::vector<ModuleFrame> frames;
      for (size_t k = 0; k < list.size(); ++k) {
        Field f = list[k];
        f.object().check_keys(format::keys::kModuleFrame);
        frames.push_back(ModuleFrame{f["path"].string(), f["type"].string()});
      }
      module_stacks_.emplace_back(std::move(frames));
    }
  }

  // --- Attributes ------------------------------------------------------------

  struct PendingAttribute {
    std::string name;
    AttributeKind kind;
    int64_t tensor;  // -1: undefined
  };

  void read_attributes() {
    Entry table_at = top_entry("attributes");
    Field table(top_member("attributes"), table_at);
    table.array();
    std::set<std::string> names;
    for (size_t i = 0; i < table.size(); ++i) {
      Entry e = table_entry("attributes", i);
      Field a(table.json()[i], e);
      a.object().check_keys(format::keys::kAttribute);
      Field name_field = a["name"];
      const std::string& name = name_field.string();
      e.noun = "attribute";
      e.name = &name;
      // A dotted path of non-empty parts, as get_attr targets are.
      if (name.empty() || name.front() == '.' || name.back() == '.' ||
          name.find("..") != std::string::npos) {
        name_field.fail("the name is not a dotted path of non-empty parts");
      }
      if (!names.insert(name).second) name_field.fail("a second attribute has this name");
      AttributeKind k = a["kind"].token(format::kAttributeKinds, "attribute kind");
      Field t = a["tensor"];
      int64_t index = -1;
      if (!t.json().is_null()) {
        index = t.integer();
        if (index < 0 || static_cast<uint64_t>(index) >= tensors_.size()) {
          t.fail("tensor index " + std::to_string(index) + " is not in the tensor table of " +
                 std::to_string(tensors_.size()));
        }
      }
      attributes_.push_back(PendingAttribute{name, k, index});
    }
    attributes_read_ = true;
  }

  // --- Nodes -----------------------------------------------------------------

  // Lists nest as deep as the JSON does, which the scan has bounded.
  Argument argument(const Field& f, const Graph& g) const {
    const Json& v = f.json();
    switch (v.type()) {
      case Json::value_t::null:
        return Argument();
      case Json::value_t::boolean:
        return Argument(v.get<bool>());
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
        return Argument(f.integer());
      case Json::value_t::number_float:
        return Argument(f.float_value());
      case Json::value_t::string:
        return Argument(v.get<std::string>());
      case Json::value_t::array: {
        ArgumentList list;
        list.reserve(v.size());
        for (size_t i = 0; i < v.size(); ++i) list.push_back(argument(f[i], g));
        return Argument(std::move(list));
      }
      case Json::value_t::object:
        break;
      default:
        f.fail(std::string("an argument cannot be ") + json_type(v));
    }
    if (v.size() != 1) f.fail("a typed argument is an object with exactly one key");
    const std::string& kind = v.begin().key();
    std::optional<format::ArgumentTag> tag = format::token_value(format::kArgumentTags, kind);
    if (!tag) f.fail("unknown argument kind '" + kind + "'");
    Field value = f[kind.c_str()];
    switch (*tag) {
      case format::ArgumentTag::Node: {
        const std::string& name = value.string();
        Node* n = g.find(name);
        if (n == nullptr) value.fail("%" + name + " is not a node defined before this one");
        return Argument(n);
      }
      case format::ArgumentTag::Float:
        return Argument(value.float_value());
      case format::ArgumentTag::Dtype:
        return Argument(value.dtype());
      case format::ArgumentTag::Device:
        return Argument(value.device());
      case format::ArgumentTag::Layout:
        return Argument(value.token(format::kLayouts, "layout"));
      case format::ArgumentTag::MemoryFormat:
        return Argument(value.token(format::kMemoryFormats, "memory format"));
    }
    f.fail("unknown argument kind '" + kind + "'");
  }

  TensorMeta tensor_meta(const Field& f) const {
    f.object().check_keys(format::keys::kTensorMeta);
    TensorMeta m;
    m.dtype = f["dtype"].dtype();
    m.sizes = f["sizes"].dims(true);
    Field strides = f["strides"];
    m.strides = strides.dims(false);
    if (m.strides.size() != m.sizes.size()) {
      strides.fail(std::to_string(m.strides.size()) + " strides for " +
                   std::to_string(m.sizes.size()) + " dimensions");
    }
    m.device = f["device"].device();
    return m;
  }

  ValueMeta value_meta(const Field& f) const {
    f.object().check_keys(format::keys::kValue);
    Field kind_field = f["kind"];
    ValueMeta val;
    val.kind = kind_field.token(format::kValueKinds, "value kind");
    const int want = format::value_kind_tensors(val.kind);  // -1: any number
    Field tensors = f["tensors"];
    tensors.array();
    if (want >= 0 && tensors.size() != static_cast<size_t>(want)) {
      tensors.fail("a value of kind '" + kind_field.string() + "' has " + std::to_string(want) +
                   " tensor(s), not " + std::to_string(tensors.size()));
    }
    val.tensors.reserve(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) val.tensors.push_back(tensor_meta(tensors[i]));
    return val;
  }

  StackTrace stack_trace(const Field& frames) const {
    frames.array();
    std::vector<SourceFrame> out;
    out.reserve(frames.size());
    for (size_t i = 0; i < frames.size(); ++i) {
      Field f = frames[i];
      f.object().check_keys(format::keys::kFrame);
      SourceFrame frame;
      frame.file = f["file"].string();
      Field line = f["line"];
      int64_t number = line.non_negative();
      if (number > std::numeric_limits<int>::max()) line.fail("line number too large");
      frame.line = static_cast<int>(number);
      frame.function = f["function"].string();
      if (auto code = f.find("code")) frame.code = code->string();
      out.push_back(std::move(frame));
    }
    return StackTrace::from_frames(std::move(out));
  }

  NodeMeta node_meta(const Field& f) const {
    f.object().check_keys(format::keys::kMeta);
    NodeMeta meta;
    if (auto val = f.find("val")) meta.val = value_meta(*val);
    if (auto frames = f.find("stack_trace")) meta.stack_trace = stack_trace(*frames);
    if (auto stack = f.find("module_stack")) {
      int64_t index = stack->integer();
      if (index < 0 || static_cast<uint64_t>(index) >= module_stacks_.size()) {
        stack->fail("module stack " + std::to_string(index) +
                    " is not in the module stack table of " +
                    std::to_string(module_stacks_.size()));
      }
      meta.module_stack = module_stacks_[static_cast<size_t>(index)];
    }
    return meta;
  }

  // The operator a call_function target names, looked up once per distinct
  // target; nullopt if none is registered (Graph::call_function then says so).
  std::optional<c10::OperatorHandle> find_operator(const std::string& target) {
    auto it = operators_.find(target);
    if (it != operators_.end()) return it->second;
    c10::optional<c10::OperatorHandle> handle;
    try {
      handle = c10::Dispatcher::singleton().findSchema(detail::parse_operator_name(target));
    } catch (const Error&) {
      return std::nullopt;  // not a qualified name: Graph::call_function says so
    }
    if (!handle) return std::nullopt;
    operators_.emplace(target, *handle);
    return *handle;
  }

  // Makes one node from its fields with the graph's own API (which checks
  // names and resolves the operator). `fail(key, what)` reports a problem
  // with the node's member `key` (nullptr: the node itself) and does not
  // return.
  template <typename Fail>
  Node* make_node(Graph& g, const std::string& name, const std::string& op,
                  const std::string& target, ArgumentList args, Kwargs kwargs, Fail&& fail) {
    if (g.output_node() != nullptr) fail(nullptr, "the node comes after the output node");
    auto no_arguments = [&](const char* what) {
      if (!args.empty() || !kwargs.empty()) fail(nullptr, std::string(what) + " takes no arguments");
    };
    Node* n = nullptr;
    const std::optional<OpCode> opcode = format::token_value(format::kOpcodes, op);
    try {
      if (!opcode) fail("op", "unknown opcode '" + op + "'");
      switch (*opcode) {
        case OpCode::Placeholder:
          no_arguments("a placeholder");
          if (target.empty()) fail("target", "the placeholder's target is empty");
          n = g.placeholder(target, name);
          break;
        case OpCode::GetAttr:
          no_arguments("get_attr");
          n = g.get_attr(target, name);
          break;
        case OpCode::CallFunction:
          if (target != format::kGetItemTarget) {
            if (auto handle = find_operator(target)) {
              n = g.call_function(*handle, std::move(args), std::move(kwargs), name);
            } else {
              n = g.call_function(target, std::move(args), std::move(kwargs), name);
            }
            break;
          }
          if (args.size() != 2 || !kwargs.empty() || !args[0].is_node() || !args[1].is_int()) {
            fail("args", "getitem takes (node, index)");
          }
          n = g.getitem(args[0].to_node(), args[1].to_int(), name);
          break;
        case OpCode::Output:
          if (args.size() != 1 || !args[0].is_list() || !kwargs.empty()) {
            fail("args", "the output takes one argument, the list of results");
          }
          if (target != format::kOutputTarget) fail("target", "the output's target is 'output'");
          n = g.output(args[0].to_list());
          break;
      }
    } catch (const FormatError&) {
      throw;
    } catch (const Error& ex) {
      // call_function: no such operator; get_attr: empty path.
      std::string what = ex.what();
      if (opcode == OpCode::CallFunction && is_custom_operator(target) && n == nullptr) {
        // Note [Custom operators]: registered only once their library is loaded.
        what += "; load the library that defines it first (dlopen it or link it into the "
                "program, as torch.ops.load_library does in Python)";
      }
      fail(nullptr, what);
    }
    if (n->name() != name) fail("name", "duplicate or invalid node name '" + name + "'");
    return n;
  }

  // Checks a made node's arguments against its schema, as lint would at the
  // end, so that the message points at the node; then what only the
  // loader checks (Note [Kernels that trust their arguments]).
  template <typename Fail>
  void check_arguments(const Node* n, Fail&& fail) {
    std::string problem;
    if (n->is_operator()) {
      problem = detail::check_schema_arguments(*n, n->schema());
      if (problem.empty()) {
        problem = detail::check_trusting_kernels(
            *n, [this](const Node& in) { return recorded_meta(in); });
      }
    } else if (n->is_getitem()) {
      problem = detail::check_getitem(*n);
    }
    if (!problem.empty()) fail(nullptr, problem);
  }

  // The recorded metadata of a node's tensor value, or nullptr: an
  // attribute's own, a node's `meta.val`, or a getitem's element of its
  // source's. The one-pass reader reads attributes after the nodes, and gives
  // up if it needs one before.
  const TensorMeta* recorded_meta(const Node& n) {
    if (n.op() == OpCode::GetAttr) {
      if (!attributes_read_) give_up();
      auto it = attribute_metas_.find(n.target());
      if (it != attribute_metas_.end()) return &it->second;
      for (const PendingAttribute& a : attributes_) {
        if (a.name != n.target() || a.tensor < 0) continue;
        return &attribute_metas_.emplace(a.name, TensorMeta::of(tensors_[a.tensor])).first->second;
      }
      return nullptr;
    }
    const ValueMeta& v = n.meta().val;
    if (v.kind == ValueKind::Tensor && v.tensors.size() == 1) return &v.tensors[0];
    if (n.is_getitem()) {
      const ValueMeta& source = n.args()[0].to_node()->meta().val;
      const int64_t i = n.args()[1].to_int();
      if ((source.kind == ValueKind::Tuple || source.kind == ValueKind::List) && i >= 0 &&
          static_cast<size_t>(i) < source.tensors.size()) {
        return &source.tensors[static_cast<size_t>(i)];
      }
    }
    return nullptr;
  }

  // One node: reads its fields and makes it, checked as it is made.
  void read_node(const Field& node, Entry& e, Graph& g) {
    node.object().check_keys(format::keys::kNode);
    const std::string& name = node["name"].string();
    e.noun = "node";
    e.name = &name;
    const std::string& op = node["op"].string();
    const std::string& target = node["target"].string();

    ArgumentList args;
    if (auto list = node.find("args")) {
      list->array();
      args.reserve(list->size());
      for (size_t k = 0; k < list->size(); ++k) args.push_back(argument((*list)[k], g));
    }
    Kwargs kwargs;
    if (auto list = node.find("kwargs")) {
      list->array();
      for (size_t k = 0; k < list->size(); ++k) {
        Field pair = (*list)[k];
        const Json& p = pair.json();
        if (!p.is_array() || p.size() != 2 || !p[0].is_string()) {
          pair.fail("a keyword argument is a [name, value] pair");
        }
        kwargs.emplace_back(p[0].get<std::string>(), argument(pair[size_t{1}], g));
      }
    }
    auto fail = [&](const char* key, const std::string& what) {
      if (key == nullptr) node.fail(what);
      node[key].fail(what);
    };
    Node* n = make_node(g, name, op, target, std::move(args), std::move(kwargs), fail);
    if (auto meta = node.find("meta")) n->meta() = node_meta(*meta);
    check_arguments(n, fail);
  }

  void read_nodes(Graph& g) {
    Entry table_at = top_entry("nodes");
    Field nodes(top_member("nodes"), table_at);
    nodes.array();
    const size_t count = nodes_apart_ ? scan_.elements.at("nodes").size() : nodes.size();
    for (size_t i = 0; i < count; ++i) {
      Entry e = table_entry("nodes", i);
      if (nodes_apart_) {
        Json apart = node_json(i);
        read_node(Field(apart, e), e, g);
      } else {
        read_node(Field(nodes.json()[i], e), e, g);
      }
    }
    if (g.output_node() == nullptr) table_at.fail("", "the graph has no output node");
  }

  // --- Signature -------------------------------------------------------------

  // What each output value is for. Whether targets exist and outputs are in
  // order is GraphModule::lint's to check, at the end.
  std::vector<OutputSpec> read_signature(const Field& sig) const {
    sig.object().check_keys(format::keys::kSignature);
    std::vector<OutputSpec> out;
    auto outputs = sig.find("outputs");
    if (!outputs) return out;
    outputs->array();
    for (size_t i = 0; i < outputs->size(); ++i) {
      Field o = (*outputs)[i];
      o.object().check_keys(format::keys::kOutput);
      OutputKind k = o["kind"].token(format::kOutputKinds, "output kind");
      out.push_back(OutputSpec{k, o["target"].string()});
    }
    return out;
  }

  // --- Specs -----------------------------------------------------------------

  c10::IValue constant(const Field& f) const {
    const Json& v = f.json();
    if (v.is_boolean()) return c10::IValue(v.get<bool>());
    if (v.is_number_integer()) return c10::IValue(f.integer());
    if (v.is_string()) return c10::IValue(v.get<std::string>());
    if (v.is_number_float()) return c10::IValue(f.float_value());
    if (v.is_object()) {
      auto it = v.find("float");
      if (it == v.end()) f.fail("missing 'float'");
      if (v.size() != 1) f.fail("a float constant is {\"float\": ...}");
      return c10::IValue(f.float_value_of(*it));
    }
    f.fail(std::string("a constant is an int, float, bool or string, not ") + json_type(v));
  }

  // As deep as the JSON, which the scan has bounded.
  TreeSpec read_spec(const Field& f) const {
    f.object();
    using K = TreeSpec::Kind;
    const K kind = f["kind"].token(format::kSpecKinds, "spec kind");
    switch (kind) {
      case K::Leaf:
      case K::None:
        f.check_keys(format::spec_keys(kind));
        return kind == K::Leaf ? TreeSpec::leaf() : TreeSpec::none();
      case K::Constant:
        f.check_keys(format::spec_keys(kind));
        return TreeSpec::constant(constant(f["value"]));
      case K::Tuple:
      case K::List:
      case K::Dict:
        break;
    }
    Field children = f["children"];
    children.array();
    std::vector<TreeSpec> specs;
    for (size_t i = 0; i < children.size(); ++i) specs.push_back(read_spec(children[i]));
    f.check_keys(format::spec_keys(kind));
    if (kind != K::Dict) {
      return kind == K::Tuple ? TreeSpec::tuple(std::move(specs)) : TreeSpec::list(std::move(specs));
    }
    Field keys = f["keys"];
    keys.array();
    if (keys.size() != specs.size()) {
      keys.fail(std::to_string(keys.size()) + " keys for " + std::to_string(specs.size()) +
                " children");
    }
    // One key type per dict, as LibTorch's dicts have; no key twice.
    const Json& k = keys.json();
    std::vector<c10::IValue> ivalues;
    std::set<std::string> strings;
    std::set<int64_t> ints;
    for (size_t i = 0; i < keys.size(); ++i) {
      Field key = keys[i];
      bool fresh;
      if (k[i].is_string() && (i == 0 || k[0].is_string())) {
        fresh = strings.insert(k[i].get<std::string>()).second;
        ivalues.emplace_back(k[i].get<std::string>());
      } else if (k[i].is_number_integer() && (i == 0 || k[0].is_number_integer())) {
        int64_t value = key.integer();
        fresh = ints.insert(value).second;
        ivalues.emplace_back(value);
      } else {
        key.fail("dict keys are all strings or all integers");
      }
      if (!fresh) key.fail("the key appears twice");
    }
    return TreeSpec::dict(std::move(ivalues), std::move(specs));
  }

  FileInfo file_;
  std::shared_ptr<Bytes> bytes_;
  format::Header h_;
  LoadOptions options_;
  bool checksums_ = false;         // the file's version carries checksums
  bool verify_checksums_ = false;  // ... and the caller wants them checked
  format::JsonScan scan_;
  Json doc_;
  std::vector<at::Tensor> tensors_;
  std::vector<std::string> tensor_names_;
  std::vector<PendingAttribute> attributes_;
  bool attributes_read_ = false;  // attributes_ holds the file's
  // TensorMeta::of the attributes recorded_meta looked up, by name.
  std::unordered_map<std::string, TensorMeta> attribute_metas_;
  std::vector<ModuleStack> module_stacks_;
  std::unordered_map<std::string, c10::OperatorHandle> operators_;
  bool check_shapes_ = true;  // Note [Checking a file's shapes]
  bool nodes_apart_ = false;  // Note [Reading the nodes one at a time]
  // Note [Reading the usual file in one pass]: stack traces by their text,
  // and strings being read.
  std::unordered_map<std::string_view, StackTrace> stack_traces_;
  std::string scratch_, name_;
  std::string node_name_, node_op_, node_target_;
  ArgumentList arguments_;      // the argument lists being read
  uint64_t nodes_begin_ = 0, nodes_end_ = 0;  // of the "nodes" array, in the JSON
};

std::string errno_message() { return std::strerror(errno); }

}  // namespace

NamedTensors named_tensors(const ModuleState& state) {
  NamedTensors out;
  for (const auto& [name, t] : state.parameters) out.emplace(name, t);
  for (const auto& [name, t] : state.buffers) out.emplace(name, t);
  return out;
}

GraphModule load_from_buffer(const void* data, size_t size, const std::string& source,
                             const LoadOptions& options) {
  auto bytes = std::make_shared<AlignedCopy>(data, size);
  return Reader(source, std::move(bytes), options).read();
}

std::optional<detail::OnePassRead> detail::read_in_one_pass(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < format::kHeaderSize) {
    ::close(fd);
    return std::nullopt;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) return std::nullopt;
  LoadOptions options;
  options.verify_checksums = false;  // the caller verifies them
  try {
    return Reader(path, std::make_shared<MappedFile>(addr, size), options).read_in_one_pass_only();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

GraphModule load(const std::string& path, const LoadOptions& options) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw FormatError(path + ": cannot open: " + errno_message());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string why = errno_message();
    ::close(fd);
    throw FormatError(path + ": cannot stat: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FormatError(path + ": not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < format::kHeaderSize) {
    // Too short to map usefully (and an empty file cannot be mapped): read
    // what there is, so the reader reports what is wrong with it.
    char small[format::kHeaderSize];
    ssize_t n = ::pread(fd, small, sizeof small, 0);
    ::close(fd);
    if (n < 0) throw FormatError(path + ": cannot read: " + errno_message());
    return load_from_buffer(small, static_cast<size_t>(n), path, options);
  }
  // Not MAP_POPULATE, though the checksums read every page: on a private
  // writable mapping it write-faults each page, copying the whole file.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  std::string why = errno_message();
  ::close(fd);  // the mapping keeps the file's pages reachable
  if (addr == MAP_FAILED) throw FormatError(path + ": cannot map: " + why);
  return Reader(path, std::make_shared<MappedFile>(addr, size), options).read();
}

}  // namespace torchcap
