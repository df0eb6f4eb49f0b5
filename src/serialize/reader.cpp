// Loading `.tcg` files (docs/FORMAT.md), verifying everything on the way.
//
// Note [Reading hostile files]: the reader assumes nothing about the bytes.
// Every header field, offset and length is checked against the file's real
// size with overflow-safe arithmetic before it is used; the JSON text is
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

#include "graph/schema_check.h"
#include "serialize/format.h"
#include "serialize/json_scan.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <set>

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

// Where a value sits inside one node or table entry, for messages:
// "args[1][0]", "meta.val.tensors[0].sizes". Lives on the stack while the
// reader descends; rendered only when something fails.
struct Path {
  const Path* parent = nullptr;
  const char* key = nullptr;  // a member name, or nullptr for an index
  int64_t index = 0;

  Path at(const char* k) const { return Path{this, k, 0}; }
  Path at(int64_t i) const { return Path{this, nullptr, i}; }

  std::string str() const {
    std::vector<const Path*> chain;
    for (const Path* p = this; p != nullptr && p->parent != nullptr; p = p->parent) {
      chain.push_back(p);
    }
    std::string s;
    for (size_t i = chain.size(); i-- > 0;) {
      const Path* p = chain[i];
      if (p->key != nullptr) {
        s += (s.empty() ? "" : ".") + std::string(p->key);
      } else {
        s += "[" + std::to_string(p->index) + "]";
      }
    }
    return s;
  }
};

// What is being read: a byte offset in the file and a label ("node %addmm
// (nodes[3])", "tensor 'fc.weight' (tensors[0])").
struct Where {
  uint64_t offset = 0;
  std::string label;
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

class Reader {
 public:
  Reader(std::string source, std::shared_ptr<Bytes> bytes, const LoadOptions& options)
      : source_(std::move(source)), bytes_(std::move(bytes)), options_(options) {}

  GraphModule read() {
    read_header();
    parse_json();
    check_keys(doc_, format::keys::kDocument, top_, Path{});
    read_tensors();
    read_attributes();
    read_module_stacks();
    GraphModule gm;
    read_nodes(gm.graph());
    gm.in_spec = read_spec(top_member("in_spec"), top_where("in_spec"), Path{});
    gm.out_spec = read_spec(top_member("out_spec"), top_where("out_spec"), Path{});
    if (auto it = doc_.find("signature"); it != doc_.end()) {
      gm.output_specs = read_signature(*it, top_where("signature"));
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
      fail_at(top_where("nodes").offset, e.what());
    }
    bind(gm);
    return gm;
  }

 private:
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
      throw WeightError(source_ + ": " + what);
    }
  }

  // --- Errors ----------------------------------------------------------------

  [[noreturn]] void fail_at(uint64_t offset, const std::string& what) const {
    throw FormatError(source_ + ": byte " + std::to_string(offset) + ": " + what);
  }

  [[noreturn]] void fail(const Where& w, const Path& p, const std::string& what) const {
    std::string path = p.str();
    std::string prefix = w.label;
    if (!path.empty()) prefix += prefix.empty() ? path : ": " + path;
    fail_at(w.offset, prefix.empty() ? what : prefix + ": " + what);
  }

  // --- Header ----------------------------------------------------------------

  void read_header() {
    const uint64_t size = bytes_->size();
    const unsigned char* b = bytes_->data();
    if (size < sizeof format::kMagic ||
        std::memcmp(b, format::kMagic, sizeof format::kMagic) != 0) {
      fail_at(0, "not a torchcap graph file (the first 8 bytes are not the .tcg magic)");
    }
    if (size < format::kBaseHeaderSize) {
      fail_at(size, "the file ends after " + std::to_string(size) + " bytes, inside the " +
                        std::to_string(format::kBaseHeaderSize) + "-byte header");
    }
    h_ = format::decode_header(b, size);
    const std::string version = std::to_string(h_.major) + "." + std::to_string(h_.minor);
    if (h_.major != kFormatMajorVersion) {
      fail_at(format::field::kMajor, "format version " + version +
                                         " is not supported; this torchcap reads version " +
                                         std::to_string(kFormatMajorVersion) + ".x");
    }
    // A newer minor version may add keys and flags this reader does not know;
    // it skips them. Files of its own version must contain nothing unknown.
    strict_ = h_.minor <= kFormatMinorVersion;
    checksums_ = format::has_checksums(h_.minor);
    verify_checksums_ = checksums_ && options_.verify_checksums;
    const uint64_t header_size = format::header_size_of(h_.minor);
    if (size < header_size) {
      fail_at(size, "the file ends after " + std::to_string(size) + " bytes, inside the " +
                        std::to_string(header_size) + "-byte header of version " + version);
    }
    // A version this reader knows has exactly the header it defines; a newer
    // one may have a larger header, whose extra fields are skipped.
    if (strict_ && h_.header_size != header_size) {
      fail_at(format::field::kHeaderSize,
              "header size " + std::to_string(h_.header_size) + " is not " +
                  std::to_string(header_size) + ", the header size of version " + version);
    }
    if (h_.header_size < header_size || h_.header_size > size) {
      fail_at(format::field::kHeaderSize,
              "header size " + std::to_string(h_.header_size) + " is not between " +
                  std::to_string(header_size) + " and the file size " + std::to_string(size));
    }
    // Before any other field is believed: a damaged header is reported as
    // such, not as whichever of its fields the damage hit.
    if (verify_checksums_) {
      uint32_t crc = format::header_crc(b, h_.header_size);
      if (crc != h_.header_crc) {
        fail_at(format::field::kHeaderCrc,
                "the header is damaged: its CRC-32 is 0x" + hex_str(crc, 8) +
                    ", the header records 0x" + hex_str(h_.header_crc, 8));
      }
    }
    if (h_.file_size != size) {
      fail_at(format::field::kFileSize,
              "the header gives the file size as " + std::to_string(h_.file_size) +
                  " bytes but the file has " + std::to_string(size) +
                  (h_.file_size > size ? " (truncated)" : " (trailing bytes)"));
    }
    if (h_.alignment != format::kAlignment) {
      fail_at(format::field::kAlignment, "alignment " + std::to_string(h_.alignment) +
                                             " is not " + std::to_string(format::kAlignment));
    }
    if (strict_ && h_.flags != 0) {
      fail_at(format::field::kFlags, "unknown flags 0x" + hex_str(h_.flags) + " for version " +
                                         std::to_string(h_.major) + "." +
                                         std::to_string(h_.minor));
    }
    if (h_.json_offset < h_.header_size || h_.json_offset > size) {
      fail_at(format::field::kJsonOffset, "the JSON section's offset " +
                                              std::to_string(h_.json_offset) +
                                              " is not between the end of the header and the "
                                              "end of the file");
    }
    if (h_.json_size > size - h_.json_offset) {
      fail_at(format::field::kJsonSize,
              "the JSON section [" + std::to_string(h_.json_offset) + ", +" +
                  std::to_string(h_.json_size) + ") extends past the end of the file at " +
                  std::to_string(size));
    }
    if (h_.json_size > format::kMaxJsonSize) {
      fail_at(format::field::kJsonSize, "the JSON section is " + std::to_string(h_.json_size) +
                                            " bytes; the format allows at most " +
                                            std::to_string(format::kMaxJsonSize));
    }
    const uint64_t json_end = h_.json_offset + h_.json_size;
    if (h_.data_offset % format::kAlignment != 0 || h_.data_offset < json_end ||
        h_.data_offset > size) {
      fail_at(format::field::kDataOffset,
              "the data section's offset " + std::to_string(h_.data_offset) +
                  " is not a multiple of " + std::to_string(format::kAlignment) +
                  " between the end of the JSON section at " + std::to_string(json_end) +
                  " and the end of the file");
    }
    if (h_.data_size > size - h_.data_offset) {
      fail_at(format::field::kDataSize,
              "the data section [" + std::to_string(h_.data_offset) + ", +" +
                  std::to_string(h_.data_size) + ") extends past the end of the file at " +
                  std::to_string(size));
    }
  }

  // Hex digits of `v`, at least `width` of them (8 for a checksum, as
  // checksums are usually written).
  static std::string hex_str(uint32_t v, int width = 0) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%0*x", width, v);
    return buf;
  }

  // --- JSON ------------------------------------------------------------------

  void parse_json() {
    const char* text = reinterpret_cast<const char*>(bytes_->data() + h_.json_offset);
    if (verify_checksums_) {
      uint32_t crc = format::crc32(text, h_.json_size);
      if (crc != h_.json_crc) {
        fail_at(h_.json_offset, "the JSON section is damaged: its CRC-32 is 0x" + hex_str(crc, 8) +
                                    ", the header records 0x" + hex_str(h_.json_crc, 8));
      }
    }
    scan_ = format::scan_json(text, h_.json_size, format::kMaxJsonDepth);
    if (scan_.nul) {
      fail_at(h_.json_offset + scan_.nul_at, "the JSON section contains a NUL byte");
    }
    if (scan_.big_integer) {
      fail_at(h_.json_offset + scan_.big_integer_at,
              "integer " + scan_.big_integer_text + " does not fit in 64 signed bits");
    }
    if (scan_.too_deep) {
      fail_at(h_.json_offset + scan_.too_deep_at,
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
      fail_at(at, "the JSON section is not valid JSON: " + what);
    }
    top_ = Where{h_.json_offset, ""};
    if (!doc_.is_object()) {
      fail_at(h_.json_offset, "the JSON section must hold an object, not " +
                                  std::string(json_type(doc_)));
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
    bool in_nodes = false;
    size_t dropped = 0;
    Json doc = Json::parse(
        text, text + h_.json_size, [&](int depth, Json::parse_event_t event, Json& parsed) {
          using E = Json::parse_event_t;
          if (depth == 1 && event == E::key) in_nodes = parsed == "nodes";
          if (in_nodes && depth == 2 &&
              (event == E::object_start || event == E::array_start || event == E::value)) {
            ++dropped;
            return false;
          }
          return true;
        });
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

  Where top_where(const char* key) const {
    auto it = scan_.values.find(key);
    return Where{it == scan_.values.end() ? h_.json_offset : h_.json_offset + it->second,
                 std::string("'") + key + "'"};
  }

  const Json& top_member(const char* key) const {
    auto it = doc_.find(key);
    if (it == doc_.end()) fail_at(h_.json_offset, "the JSON section has no '" + std::string(key) + "'");
    return *it;
  }

  // The byte where element `i` of top-level array `key` starts.
  uint64_t element_offset(const char* key, size_t i) const {
    auto it = scan_.elements.find(key);
    if (it == scan_.elements.end() || i >= it->second.size()) return top_where(key).offset;
    return h_.json_offset + it->second[i];
  }

  // Note [Keys by version] in format.h.
  void check_keys(const Json& obj, const format::Keys& allowed, const Where& w,
                  const Path& p) const {
    if (!strict_) return;
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (!format::has_key(allowed, it.key(), h_.minor)) {
        // A key of a later version in a file that says it is older: say so.
        int since = format::key_since(allowed, it.key());
        fail(w, p, "unknown key '" + it.key() + "'" +
                       (since > h_.minor ? " in a file of version " + std::to_string(h_.major) +
                                               "." + std::to_string(h_.minor) +
                                               " (version 1." + std::to_string(since) +
                                               " added it)"
                                         : std::string()));
      }
    }
  }

  const Json& member(const Json& obj, const char* key, const Where& w, const Path& p) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(w, p, std::string("missing '") + key + "'");
    return *it;
  }

  const Json& object(const Json& v, const Where& w, const Path& p) const {
    if (!v.is_object()) fail(w, p, std::string("expected an object, got ") + json_type(v));
    return v;
  }

  const Json& array(const Json& v, const Where& w, const Path& p) const {
    if (!v.is_array()) fail(w, p, std::string("expected an array, got ") + json_type(v));
    return v;
  }

  const std::string& string(const Json& v, const Where& w, const Path& p) const {
    if (!v.is_string()) fail(w, p, std::string("expected a string, got ") + json_type(v));
    return v.get_ref<const std::string&>();
  }

  int64_t integer(const Json& v, const Where& w, const Path& p) const {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(w, p, "integer " + std::to_string(u) + " does not fit in 64 signed bits");
      }
      return static_cast<int64_t>(u);
    }
    if (!v.is_number_integer()) fail(w, p, std::string("expected an integer, got ") + json_type(v));
    return v.get<int64_t>();
  }

  int64_t non_negative(const Json& v, const Where& w, const Path& p) const {
    int64_t i = integer(v, w, p);
    if (i < 0) fail(w, p, "expected a non-negative integer, got " + std::to_string(i));
    return i;
  }

  std::vector<int64_t> dims(const Json& v, const Where& w, const Path& p, bool sizes) const {
    const Json& a = array(v, w, p);
    if (a.size() > format::kMaxTensorDims) {
      fail(w, p, std::to_string(a.size()) + " dimensions; the format allows at most " +
                     std::to_string(format::kMaxTensorDims));
    }
    std::vector<int64_t> out;
    for (size_t i = 0; i < a.size(); ++i) {
      out.push_back(sizes ? non_negative(a[i], w, p.at(static_cast<int64_t>(i)))
                          : integer(a[i], w, p.at(static_cast<int64_t>(i))));
    }
    return out;
  }

  double float_value(const Json& v, const Where& w, const Path& p) const {
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (!std::isfinite(d)) fail(w, p, "a float written as a number must be finite");
      return d;
    }
    const std::string& s = string(v, w, p);
    std::optional<double> d = format::nonfinite_double_from_string(s);
    if (!d) fail(w, p, "'" + s + "' is not inf, -inf, nan or the 0x bits of a NaN");
    return *d;
  }

  c10::ScalarType dtype(const Json& v, const Where& w, const Path& p) const {
    const std::string& s = string(v, w, p);
    std::optional<c10::ScalarType> t = format::dtype_from_name(s);
    if (!t) fail(w, p, "unknown dtype '" + s + "'");
    return *t;
  }

  c10::Device device(const Json& v, const Where& w, const Path& p) const {
    const std::string& s = string(v, w, p);
    try {
      return c10::Device(s);
    } catch (const std::exception&) {
      fail(w, p, "'" + s + "' is not a device");
    }
  }

  // --- Tensors ---------------------------------------------------------------

  void read_tensors() {
    const Json& table = top_member("tensors");
    Where w = top_where("tensors");
    array(table, w, Path{});
    std::set<std::string> names;
    // (offset, length, index) of every non-empty tensor, to find overlaps.
    std::vector<std::tuple<uint64_t, uint64_t, size_t>> ranges;
    for (size_t i = 0; i < table.size(); ++i) {
      Where e{element_offset("tensors", i), "tensors[" + std::to_string(i) + "]"};
      const Json& t = object(table[i], e, Path{});
      check_keys(t, format::keys::kTensor, e, Path{});
      Path root;
      const std::string& name = string(member(t, "name", e, root), e, root.at("name"));
      if (name.empty()) fail(e, root.at("name"), "the name is empty");
      e.label = "tensor '" + name + "' (" + e.label + ")";
      if (!names.insert(name).second) fail(e, root.at("name"), "a second tensor has this name");

      c10::ScalarType type = dtype(member(t, "dtype", e, root), e, root.at("dtype"));
      if (!format::is_storable_dtype(type)) {
        fail(e, root.at("dtype"), std::string("tensors of dtype ") + format::dtype_name(type) +
                                      " cannot be stored in the data section");
      }
      std::vector<int64_t> sizes = dims(member(t, "sizes", e, root), e, root.at("sizes"), true);
      std::vector<int64_t> strides =
          dims(member(t, "strides", e, root), e, root.at("strides"), true);
      if (strides.size() != sizes.size()) {
        fail(e, root.at("strides"), std::to_string(strides.size()) + " strides for " +
                                        std::to_string(sizes.size()) + " dimensions");
      }
      if (auto it = t.find("weightless"); it != t.end()) {
        read_weightless(t, *it, type, sizes, strides, e);
        tensor_names_.push_back(name);
        continue;
      }
      uint64_t offset = static_cast<uint64_t>(
          non_negative(member(t, "offset", e, root), e, root.at("offset")));
      uint64_t length = static_cast<uint64_t>(
          non_negative(member(t, "length", e, root), e, root.at("length")));
      uint32_t recorded_crc = 0;
      if (checksums_) {
        int64_t crc = non_negative(member(t, "crc32", e, root), e, root.at("crc32"));
        if (crc > int64_t{0xffffffff}) {
          fail(e, root.at("crc32"), "CRC-32 " + std::to_string(crc) + " does not fit in 32 bits");
        }
        recorded_crc = static_cast<uint32_t>(crc);
      }

      uint64_t expected = 0;
      if (!byte_span(sizes, strides, c10::elementSize(type), expected)) {
        fail(e, root, "sizes " + list_str(sizes) + " with strides " + list_str(strides) +
                          " span more bytes than 64 bits can count");
      }
      if (length != expected) {
        fail(e, root.at("length"),
             "byte length " + std::to_string(length) + " does not match dtype " +
                 format::dtype_name(type) + ", sizes " + list_str(sizes) + " and strides " +
                 list_str(strides) + ", which span " + std::to_string(expected) + " bytes");
      }
      if (offset % format::kAlignment != 0) {
        fail(e, root.at("offset"), "offset " + std::to_string(offset) +
                                       " is not a multiple of " +
                                       std::to_string(format::kAlignment));
      }
      if (offset > h_.data_size || length > h_.data_size - offset) {
        fail(e, root, "bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                          ") of the data section extend past its end at " +
                          std::to_string(h_.data_size));
      }
      if (length > 0) ranges.emplace_back(offset, length, i);

      unsigned char* data = bytes_->data() + h_.data_offset + offset;
      if (verify_checksums_) {
        uint32_t crc = format::crc32(data, length);
        if (crc != recorded_crc) {
          fail_at(h_.data_offset + offset,
                  e.label + ": its bytes are damaged: their CRC-32 is 0x" + hex_str(crc, 8) +
                      ", the tensor table records 0x" + hex_str(recorded_crc, 8));
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
        fail(Where{element_offset("tensors", later),
                   "tensor '" + tensor_names_[later] + "' (tensors[" + std::to_string(later) +
                       "])"},
             Path{}, "its bytes overlap those of tensor '" + tensor_names_[earlier] + "'");
      }
    }
  }

  // Note [Weightless tensors] in format.h: an entry with its metadata only,
  // which becomes a meta tensor (no memory) for LoadOptions::weights to bind.
  void read_weightless(const Json& t, const Json& flag, c10::ScalarType type,
                       const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                       const Where& e) {
    Path root;
    if (!flag.is_boolean() || !flag.get<bool>()) {
      fail(e, root.at("weightless"),
           std::string("expected true, got ") + (flag.is_boolean() ? "false" : json_type(flag)));
    }
    for (const char* key : {"offset", "length", "crc32"}) {
      if (t.contains(key)) {
        fail(e, root.at(key), "a weightless tensor has no bytes in the file, so no '" +
                                  std::string(key) + "'");
      }
    }
    uint64_t span = 0;
    if (!byte_span(sizes, strides, c10::elementSize(type), span)) {
      fail(e, root, "sizes " + list_str(sizes) + " with strides " + list_str(strides) +
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
  void check_bools(const unsigned char* data, uint64_t length, const Where& e) const {
    for (uint64_t k = 0; k < length; ++k) {
      if (data[k] > 1) {
        fail_at(h_.data_offset + (data + k - (bytes_->data() + h_.data_offset)),
                e.label + ": bool byte " + std::to_string(data[k]) + " is neither 0 nor 1");
      }
    }
  }

  // --- Module stacks ---------------------------------------------------------

  // The table of distinct module stacks nodes refer to by index (version 1.2).
  // Each entry becomes one ModuleStack, which the nodes then share.
  void read_module_stacks() {
    auto it = doc_.find("module_stacks");
    if (it == doc_.end()) return;
    array(*it, top_where("module_stacks"), Path{});
    for (size_t i = 0; i < it->size(); ++i) {
      Where e{element_offset("module_stacks", i), "module_stacks[" + std::to_string(i) + "]"};
      const Json& list = array((*it)[i], e, Path{});
      std::vector<ModuleFrame> frames;
      Path root;
      for (size_t k = 0; k < list.size(); ++k) {
        Path p = root.at(static_cast<int64_t>(k));
        const Json& f = object(list[k], e, p);
        check_keys(f, format::keys::kModuleFrame, e, p);
        frames.push_back(ModuleFrame{string(member(f, "path", e, p), e, p.at("path")),
                                     string(member(f, "type", e, p), e, p.at("type"))});
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
    const Json& table = top_member("attributes");
    array(table, top_where("attributes"), Path{});
    std::set<std::string> names;
    for (size_t i = 0; i < table.size(); ++i) {
      Where e{element_offset("attributes", i), "attributes[" + std::to_string(i) + "]"};
      const Json& a = object(table[i], e, Path{});
      check_keys(a, format::keys::kAttribute, e, Path{});
      Path root;
      const std::string& name = string(member(a, "name", e, root), e, root.at("name"));
      e.label = "attribute '" + name + "' (" + e.label + ")";
      // A dotted path of non-empty parts, as get_attr targets are.
      if (name.empty() || name.front() == '.' || name.back() == '.' ||
          name.find("..") != std::string::npos) {
        fail(e, root.at("name"), "the name is not a dotted path of non-empty parts");
      }
      if (!names.insert(name).second) fail(e, root.at("name"), "a second attribute has this name");
      AttributeKind k = named(format::kAttributeKinds, "attribute kind", member(a, "kind", e, root),
                              e, root.at("kind"));
      const Json& t = member(a, "tensor", e, root);
      int64_t index = -1;
      if (!t.is_null()) {
        index = integer(t, e, root.at("tensor"));
        if (index < 0 || static_cast<uint64_t>(index) >= tensors_.size()) {
          fail(e, root.at("tensor"), "tensor index " + std::to_string(index) +
                                         " is not in the tensor table of " +
                                         std::to_string(tensors_.size()));
        }
      }
      attributes_.push_back(PendingAttribute{name, k, index});
    }
  }

  // --- Nodes -----------------------------------------------------------------

  // Lists nest as deep as the JSON does, which the scan has bounded.
  Argument argument(const Json& v, const Graph& g, const Where& w, const Path& p) const {
    switch (v.type()) {
      case Json::value_t::null:
        return Argument();
      case Json::value_t::boolean:
        return Argument(v.get<bool>());
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
        return Argument(integer(v, w, p));
      case Json::value_t::number_float:
        return Argument(float_value(v, w, p));
      case Json::value_t::string:
        return Argument(v.get<std::string>());
      case Json::value_t::array: {
        ArgumentList list;
        for (size_t i = 0; i < v.size(); ++i) {
          list.push_back(argument(v[i], g, w, p.at(static_cast<int64_t>(i))));
        }
        return Argument(std::move(list));
      }
      case Json::value_t::object:
        break;
      default:
        fail(w, p, std::string("an argument cannot be ") + json_type(v));
    }
    if (v.size() != 1) fail(w, p, "a typed argument is an object with exactly one key");
    const std::string& kind = v.begin().key();
    const Json& value = v.begin().value();
    Path q = p.at(kind.c_str());
    std::optional<format::ArgumentTag> tag = format::token_value(format::kArgumentTags, kind);
    if (!tag) fail(w, p, "unknown argument kind '" + kind + "'");
    switch (*tag) {
      case format::ArgumentTag::Node: {
        const std::string& name = string(value, w, q);
        Node* n = g.find(name);
        if (n == nullptr) fail(w, q, "%" + name + " is not a node defined before this one");
        return Argument(n);
      }
      case format::ArgumentTag::Float:
        return Argument(float_value(value, w, q));
      case format::ArgumentTag::Dtype:
        return Argument(dtype(value, w, q));
      case format::ArgumentTag::Device:
        return Argument(device(value, w, q));
      case format::ArgumentTag::Layout:
        return Argument(named(format::kLayouts, "layout", value, w, q));
      case format::ArgumentTag::MemoryFormat:
        return Argument(named(format::kMemoryFormats, "memory format", value, w, q));
    }
    fail(w, p, "unknown argument kind '" + kind + "'");
  }

  // The value a string names in `table`.
  template <typename T, size_t N>
  T named(const format::Token<T> (&table)[N], const char* what, const Json& v, const Where& w,
          const Path& p) const {
    const std::string& s = string(v, w, p);
    std::optional<T> value = format::token_value(table, s);
    if (!value) fail(w, p, std::string("unknown ") + what + " '" + s + "'");
    return *value;
  }

  TensorMeta tensor_meta(const Json& v, const Where& w, const Path& p) const {
    object(v, w, p);
    check_keys(v, format::keys::kTensorMeta, w, p);
    TensorMeta m;
    m.dtype = dtype(member(v, "dtype", w, p), w, p.at("dtype"));
    m.sizes = dims(member(v, "sizes", w, p), w, p.at("sizes"), true);
    m.strides = dims(member(v, "strides", w, p), w, p.at("strides"), false);
    if (m.strides.size() != m.sizes.size()) {
      fail(w, p.at("strides"), std::to_string(m.strides.size()) + " strides for " +
                                   std::to_string(m.sizes.size()) + " dimensions");
    }
    m.device = device(member(v, "device", w, p), w, p.at("device"));
    return m;
  }

  NodeMeta node_meta(const Json& v, const Where& w, const Path& p) const {
    object(v, w, p);
    check_keys(v, format::keys::kMeta, w, p);
    NodeMeta meta;
    if (auto it = v.find("val"); it != v.end()) {
      Path q = p.at("val");
      object(*it, w, q);
      check_keys(*it, format::keys::kValue, w, q);
      const std::string& kind = string(member(*it, "kind", w, q), w, q.at("kind"));
      meta.val.kind = named(format::kValueKinds, "value kind", member(*it, "kind", w, q), w,
                            q.at("kind"));
      const int want = format::value_kind_tensors(meta.val.kind);  // -1: any number
      Path tq = q.at("tensors");
      const Json& tensors = array(member(*it, "tensors", w, q), w, tq);
      if (want >= 0 && tensors.size() != static_cast<size_t>(want)) {
        fail(w, tq, "a value of kind '" + kind + "' has " + std::to_string(want) +
                        " tensor(s), not " + std::to_string(tensors.size()));
      }
      for (size_t i = 0; i < tensors.size(); ++i) {
        meta.val.tensors.push_back(tensor_meta(tensors[i], w, tq.at(static_cast<int64_t>(i))));
      }
    }
    if (auto it = v.find("stack_trace"); it != v.end()) {
      Path q = p.at("stack_trace");
      const Json& frames = array(*it, w, q);
      std::vector<SourceFrame> out;
      for (size_t i = 0; i < frames.size(); ++i) {
        Path f = q.at(static_cast<int64_t>(i));
        object(frames[i], w, f);
        check_keys(frames[i], format::keys::kFrame, w, f);
        SourceFrame frame;
        frame.file = string(member(frames[i], "file", w, f), w, f.at("file"));
        int64_t line = non_negative(member(frames[i], "line", w, f), w, f.at("line"));
        if (line > std::numeric_limits<int>::max()) fail(w, f.at("line"), "line number too large");
        frame.line = static_cast<int>(line);
        frame.function = string(member(frames[i], "function", w, f), w, f.at("function"));
        if (auto code = frames[i].find("code"); code != frames[i].end()) {
          frame.code = string(*code, w, f.at("code"));
        }
        out.push_back(std::move(frame));
      }
      meta.stack_trace = StackTrace::from_frames(std::move(out));
    }
    if (auto it = v.find("module_stack"); it != v.end()) {
      int64_t index = integer(*it, w, p.at("module_stack"));
      if (index < 0 || static_cast<uint64_t>(index) >= module_stacks_.size()) {
        fail(w, p.at("module_stack"), "module stack " + std::to_string(index) +
                                          " is not in the module stack table of " +
                                          std::to_string(module_stacks_.size()));
      }
      meta.module_stack = module_stacks_[static_cast<size_t>(index)];
    }
    return meta;
  }

  void read_nodes(Graph& g) {
    const Json& nodes = top_member("nodes");
    array(nodes, top_where("nodes"), Path{});
    const size_t count = nodes_apart_ ? scan_.elements.at("nodes").size() : nodes.size();
    for (size_t i = 0; i < count; ++i) {
      Where w{element_offset("nodes", i), "nodes[" + std::to_string(i) + "]"};
      Json apart;
      if (nodes_apart_) apart = node_json(i);
      const Json& j = object(nodes_apart_ ? apart : nodes[i], w, Path{});
      check_keys(j, format::keys::kNode, w, Path{});
      Path root;
      const std::string& name = string(member(j, "name", w, root), w, root.at("name"));
      w.label = "node %" + name + " (" + w.label + ")";
      const std::string& op = string(member(j, "op", w, root), w, root.at("op"));
      const std::string& target = string(member(j, "target", w, root), w, root.at("target"));

      ArgumentList args;
      if (auto it = j.find("args"); it != j.end()) {
        Path p = root.at("args");
        array(*it, w, p);
        for (size_t k = 0; k < it->size(); ++k) {
          args.push_back(argument((*it)[k], g, w, p.at(static_cast<int64_t>(k))));
        }
      }
      Kwargs kwargs;
      if (auto it = j.find("kwargs"); it != j.end()) {
        Path p = root.at("kwargs");
        array(*it, w, p);
        for (size_t k = 0; k < it->size(); ++k) {
          Path q = p.at(static_cast<int64_t>(k));
          const Json& pair = (*it)[k];
          if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string()) {
            fail(w, q, "a keyword argument is a [name, value] pair");
          }
          kwargs.emplace_back(pair[0].get<std::string>(), argument(pair[1], g, w, q.at(1)));
        }
      }

      if (g.output_node() != nullptr) fail(w, root, "the node comes after the output node");
      auto no_arguments = [&](const char* what) {
        if (!args.empty() || !kwargs.empty()) fail(w, root, std::string(what) + " takes no arguments");
      };
      Node* n = nullptr;
      const std::optional<OpCode> opcode = format::token_value(format::kOpcodes, op);
      try {
        if (!opcode) fail(w, root.at("op"), "unknown opcode '" + op + "'");
        switch (*opcode) {
          case OpCode::Placeholder:
            no_arguments("a placeholder");
            if (target.empty()) fail(w, root.at("target"), "the placeholder's target is empty");
            n = g.placeholder(target, name);
            break;
          case OpCode::GetAttr:
            no_arguments("get_attr");
            n = g.get_attr(target, name);
            break;
          case OpCode::CallFunction:
            if (target != format::kGetItemTarget) {
              n = g.call_function(target, std::move(args), std::move(kwargs), name);
              break;
            }
            if (args.size() != 2 || !kwargs.empty() || !args[0].is_node() || !args[1].is_int()) {
              fail(w, root.at("args"), "getitem takes (node, index)");
            }
            n = g.getitem(args[0].to_node(), args[1].to_int(), name);
            break;
          case OpCode::Output:
            if (args.size() != 1 || !args[0].is_list() || !kwargs.empty()) {
              fail(w, root.at("args"), "the output takes one argument, the list of results");
            }
            if (target != format::kOutputTarget) {
              fail(w, root.at("target"), "the output's target is 'output'");
            }
            n = g.output(args[0].to_list());
            break;
        }
      } catch (const FormatError&) {
        throw;
      } catch (const Error& e) {
        // call_function: no such operator; get_attr: empty path.
        std::string what = e.what();
        if (opcode == OpCode::CallFunction && is_custom_operator(target) && n == nullptr) {
          // Note [Custom operators]: registered only once their library is loaded.
          what += "; load the library that defines it first (dlopen it or link it into the "
                  "program, as torch.ops.load_library does in Python)";
        }
        fail(w, root, what);
      }
      if (n->name() != name) {
        fail(w, root.at("name"), "duplicate or invalid node name '" + name + "'");
      }
      if (auto it = j.find("meta"); it != j.end()) n->meta() = node_meta(*it, w, root.at("meta"));
      // The schema check lint would make at the end, made now so the message
      // points at this node.
      std::string problem;
      if (n->is_operator()) {
        problem = detail::check_schema_arguments(*n, n->schema());
      } else if (n->is_getitem()) {
        problem = detail::check_getitem(*n);
      }
      if (!problem.empty()) fail(w, root, problem);
    }
    if (g.output_node() == nullptr) fail(top_where("nodes"), Path{}, "the graph has no output node");
  }

  // --- Signature -------------------------------------------------------------

  // What each output value is for. Whether targets exist and outputs are in
  // order is GraphModule::lint's to check, at the end.
  std::vector<OutputSpec> read_signature(const Json& v, const Where& w) const {
    object(v, w, Path{});
    check_keys(v, format::keys::kSignature, w, Path{});
    std::vector<OutputSpec> out;
    auto it = v.find("outputs");
    if (it == v.end()) return out;
    Path root;
    Path op = root.at("outputs");
    array(*it, w, op);
    for (size_t i = 0; i < it->size(); ++i) {
      Path p = op.at(static_cast<int64_t>(i));
      const Json& o = object((*it)[i], w, p);
      check_keys(o, format::keys::kOutput, w, p);
      OutputKind k = named(format::kOutputKinds, "output kind", member(o, "kind", w, p), w,
                           p.at("kind"));
      out.push_back(OutputSpec{k, string(member(o, "target", w, p), w, p.at("target"))});
    }
    return out;
  }

  // --- Specs -----------------------------------------------------------------

  c10::IValue constant(const Json& v, const Where& w, const Path& p) const {
    if (v.is_boolean()) return c10::IValue(v.get<bool>());
    if (v.is_number_integer()) return c10::IValue(integer(v, w, p));
    if (v.is_string()) return c10::IValue(v.get<std::string>());
    if (v.is_number_float() || v.is_object()) {
      const Json& f = v.is_object() ? member(v, "float", w, p) : v;
      if (v.is_object() && v.size() != 1) fail(w, p, "a float constant is {\"float\": ...}");
      return c10::IValue(float_value(f, w, p));
    }
    fail(w, p, std::string("a constant is an int, float, bool or string, not ") + json_type(v));
  }

  // As deep as the JSON, which the scan has bounded.
  TreeSpec read_spec(const Json& v, const Where& w, const Path& p) const {
    object(v, w, p);
    using K = TreeSpec::Kind;
    const K kind = named(format::kSpecKinds, "spec kind", member(v, "kind", w, p), w, p.at("kind"));
    switch (kind) {
      case K::Leaf:
      case K::None:
        check_keys(v, format::spec_keys(kind), w, p);
        return kind == K::Leaf ? TreeSpec::leaf() : TreeSpec::none();
      case K::Constant:
        check_keys(v, format::spec_keys(kind), w, p);
        return TreeSpec::constant(constant(member(v, "value", w, p), w, p.at("value")));
      case K::Tuple:
      case K::List:
      case K::Dict:
        break;
    }
    Path cp = p.at("children");
    const Json& children = array(member(v, "children", w, p), w, cp);
    std::vector<TreeSpec> specs;
    for (size_t i = 0; i < children.size(); ++i) {
      specs.push_back(read_spec(children[i], w, cp.at(static_cast<int64_t>(i))));
    }
    check_keys(v, format::spec_keys(kind), w, p);
    if (kind != K::Dict) {
      return kind == K::Tuple ? TreeSpec::tuple(std::move(specs)) : TreeSpec::list(std::move(specs));
    }
    Path kp = p.at("keys");
    const Json& keys = array(member(v, "keys", w, p), w, kp);
    if (keys.size() != specs.size()) {
      fail(w, kp, std::to_string(keys.size()) + " keys for " + std::to_string(specs.size()) +
                      " children");
    }
    // One key type per dict, as LibTorch's dicts have; no key twice.
    std::vector<c10::IValue> ivalues;
    std::set<std::string> strings;
    std::set<int64_t> ints;
    for (size_t i = 0; i < keys.size(); ++i) {
      Path q = kp.at(static_cast<int64_t>(i));
      bool fresh;
      if (keys[i].is_string() && (i == 0 || keys[0].is_string())) {
        fresh = strings.insert(keys[i].get<std::string>()).second;
        ivalues.emplace_back(keys[i].get<std::string>());
      } else if (keys[i].is_number_integer() && (i == 0 || keys[0].is_number_integer())) {
        int64_t k = integer(keys[i], w, q);
        fresh = ints.insert(k).second;
        ivalues.emplace_back(k);
      } else {
        fail(w, q, "dict keys are all strings or all integers");
      }
      if (!fresh) fail(w, q, "the key appears twice");
    }
    return TreeSpec::dict(std::move(ivalues), std::move(specs));
  }

  std::string source_;
  std::shared_ptr<Bytes> bytes_;
  format::Header h_;
  LoadOptions options_;
  bool strict_ = true;
  bool checksums_ = false;         // the file's version carries checksums
  bool verify_checksums_ = false;  // ... and the caller wants them checked
  format::JsonScan scan_;
  Json doc_;
  Where top_;
  std::vector<at::Tensor> tensors_;
  std::vector<std::string> tensor_names_;
  std::vector<PendingAttribute> attributes_;
  std::vector<ModuleStack> module_stacks_;
  bool nodes_apart_ = false;  // Note [Reading the nodes one at a time]
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
