// Writing `.tcg` files (docs/FORMAT.md): header, JSON, then the tensor bytes.
#include <torchcap/error.h>
#include <torchcap/serialize.h>

#include "graph/hidden_writes.h"
#include "graph/ivalue_conversion.h"
#include "graph/operator_facts.h"
#include "serialize/format.h"
#include "serialize/json_scan.h"
#include "serialize/temp_files.h"
#include "serialize/utf8.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace torchcap {
namespace {

// ordered_json keeps keys in the order written (name, op, target, ...), which
// makes the JSON section readable; the reader does not depend on the order.
using Json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& what) { throw FormatError("save: " + what); }

std::string checked_utf8(const std::string& s, const std::string& where) {
  if (!format::is_valid_utf8(s)) fail(where + ": the string is not valid UTF-8");
  return s;
}

std::string checked_dtype(c10::ScalarType t, const std::string& where) {
  const char* name = format::dtype_name(t);
  if (name == nullptr) fail(where + ": dtype " + c10::toString(t) + " has no name in the format");
  return name;
}

Json double_json(double d) {
  if (std::isfinite(d)) return d;
  return Json{{format::tag(format::ArgumentTag::Float), format::nonfinite_double_string(d)}};
}

// Note [Writing the nodes as text]: the nodes, most of a big graph's
// document, are written straight into the JSON text, never held as JSON
// trees (that took kilobytes a node, and most of the time of a save went
// to making and freeing them). The bytes are those
// nlohmann::json's dump() gives, which the rest of the document still uses:
// the same key order, no spaces, and strings and floats that need more than
// copying written by nlohmann::json itself.
class JsonText {
 public:
  explicit JsonText(std::string& out) : out_(out) {}

  JsonText& raw(const char* text) {
    out_ += text;
    return *this;
  }
  // `"key":`, for keys that need no escaping.
  JsonText& key(const char* k) {
    out_ += '"';
    out_ += k;
    out_ += "\":";
    return *this;
  }
  JsonText& integer(int64_t v) {
    char buf[24];
    auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    out_.append(buf, end);
    return *this;
  }
  JsonText& boolean(bool b) {
    out_ += b ? "true" : "false";
    return *this;
  }
  // `s`, which must be valid UTF-8.
  JsonText& string(const std::string& s) {
    for (char c : s) {
      if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
        out_ += Json(s).dump();  // escapes, and bytes beyond ASCII
        return *this;
      }
    }
    out_ += '"';
    out_ += s;
    out_ += '"';
    return *this;
  }
  // `s` with what is not valid UTF-8 replaced (format::utf8_or_replace),
  // copied only then.
  JsonText& descriptive(const std::string& s) {
    if (format::is_valid_utf8(s)) return string(s);
    return string(format::utf8_or_replace(s));
  }
  // A finite double as a JSON number, anything else as {"float": "inf"}.
  JsonText& real(double d) {
    out_ += double_json(d).dump();
    return *this;
  }
  JsonText& integers(c10::IntArrayRef v) {
    out_ += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out_ += ',';
      integer(v[i]);
    }
    out_ += ']';
    return *this;
  }
  // {"tag":"name"}: an argument JSON has no type for.
  JsonText& tagged(format::ArgumentTag t, const std::string& name) {
    out_ += "{\"";
    out_ += format::tag(t);
    out_ += "\":";
    return string(name).raw("}");
  }

 private:
  std::string& out_;
};

// What a message about node `n` calls it; made only when one is needed.
std::string node_where(const Node* n) { return "node %" + n->name(); }

const std::string& checked_utf8(const std::string& s, const Node* n) {
  if (!format::is_valid_utf8(s)) fail(node_where(n) + ": the string is not valid UTF-8");
  return s;
}

// Arguments nest only as deep as their lists; the depth limit on the whole
// document (checked after writing) bounds this recursion for the reader.
// `level` is the JSON nesting level a container written here would have;
// `deepest` receives the deepest written.
void write_argument(JsonText& out, const Argument& a, const Node* n, int level, int& deepest) {
  using format::ArgumentTag;
  const size_t kind = a.storage().index();
  if (kind == 1 || kind >= 6 || (kind == 3 && !std::isfinite(a.to_double()))) {
    deepest = std::max(deepest, level);  // a list, or a {"tag": ...} object
  }
  switch (kind) {
    case 0:
      out.raw("null");
      return;
    case 1:
      out.tagged(ArgumentTag::Node, a.to_node()->name());
      return;
    case 2:
      out.integer(a.to_int());
      return;
    case 3:
      out.real(a.to_double());
      return;
    case 4:
      out.boolean(a.to_bool());
      return;
    case 5:
      out.string(checked_utf8(a.to_string(), n));
      return;
    case 6:
      out.tagged(ArgumentTag::Dtype, checked_dtype(a.to_scalar_type(), node_where(n)));
      return;
    case 7: {
      const char* name = format::token_name(format::kLayouts, a.to_layout());
      if (name == nullptr) {
        fail(node_where(n) + ": layout " + c10::toString(a.to_layout()) + " has no name");
      }
      out.tagged(ArgumentTag::Layout, name);
      return;
    }
    case 8:
      out.tagged(ArgumentTag::Device, a.to_device().str());
      return;
    case 9: {
      const char* name = format::token_name(format::kMemoryFormats, a.to_memory_format());
      if (name == nullptr) {
        fail(node_where(n) + ": memory format " +
             std::string(c10::toString(a.to_memory_format())) + " has no name");
      }
      out.tagged(ArgumentTag::MemoryFormat, name);
      return;
    }
    case 10: {
      out.raw("[");
      bool first = true;
      for (const Argument& e : a.to_list()) {
        if (!first) out.raw(",");
        first = false;
        write_argument(out, e, n, level + 1, deepest);
      }
      out.raw("]");
      return;
    }
  }
  fail(node_where(n) + ": unknown argument kind");
}

void write_tensor_meta(JsonText& out, const TensorMeta& m, const Node* n) {
  out.raw("{").key("dtype").string(checked_dtype(m.dtype, node_where(n)));
  out.raw(",").key("sizes").integers(m.sizes);
  out.raw(",").key("strides").integers(m.strides);
  out.raw(",").key("device").string(m.device.str());
  if (m.symbolic != nullptr) {
    // Note [Dynamic graphs in files] (format.h)
    for (const auto& [key, exprs] : {std::pair<const char*, const std::vector<SizeExpr>*>{
                                         "symbolic_sizes", &m.symbolic->sizes},
                                     {"symbolic_strides", &m.symbolic->strides}}) {
      out.raw(",").key(key).raw("[");
      for (size_t d = 0; d < exprs->size(); ++d) out.raw(d ? "," : "").string((*exprs)[d].str());
      out.raw("]");
    }
  }
  out.raw("}");
}

// `module_stack`: the stack's index in the module stack table, or -1 for
// none. Writes nothing for metadata with nothing in it.
void write_meta(JsonText& out, const NodeMeta& meta, int64_t module_stack, const Node* n) {
  const std::vector<SourceFrame>& frames = meta.stack_trace.frames();
  if (!meta.val.known() && frames.empty() && module_stack < 0) return;
  out.raw(",").key("meta").raw("{");
  const char* comma = "";
  if (meta.val.known()) {
    out.key("val").raw("{").key("kind").string(
        format::token_name(format::kValueKinds, meta.val.kind));
    out.raw(",").key("tensors").raw("[");
    for (size_t i = 0; i < meta.val.tensors.size(); ++i) {
      if (i > 0) out.raw(",");
      write_tensor_meta(out, meta.val.tensors[i], n);
    }
    out.raw("]}");
    comma = ",";
  }
  // Symbolizes now, if the trace holds raw addresses. Paths and function names
  // come from debug information and may hold any bytes; they are descriptive,
  // so invalid UTF-8 is replaced rather than refused.
  if (!frames.empty()) {
    out.raw(comma).key("stack_trace").raw("[");
    for (size_t i = 0; i < frames.size(); ++i) {
      const SourceFrame& f = frames[i];
      if (i > 0) out.raw(",");
      out.raw("{").key("file").descriptive(f.file);
      out.raw(",").key("line").integer(f.line);
      out.raw(",").key("function").descriptive(f.function);
      if (!f.code.empty()) out.raw(",").key("code").descriptive(f.code);
      out.raw("}");
    }
    out.raw("]");
    comma = ",";
  }
  if (module_stack >= 0) out.raw(comma).key("module_stack").integer(module_stack);
  out.raw("}");
}

Json constant_json(const c10::IValue& v, const std::string& where) {
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return double_json(v.toDouble());
  if (v.isBool()) return v.toBool();
  if (v.isString()) return checked_utf8(v.toStringRef(), where);
  fail(where + ": a spec constant of type " + v.type()->str() + " cannot be stored");
}

// Specs are as deep as the program's nested inputs; the document's depth limit
// bounds them.
Json spec_json(const TreeSpec& s, const std::string& where) {
  using K = TreeSpec::Kind;
  Json out{{"kind", format::token_name(format::kSpecKinds, s.kind())}};
  switch (s.kind()) {
    case K::Leaf:
    case K::None:
      break;
    case K::Constant:
      out["value"] = constant_json(s.constant_value(), where);
      break;
    case K::Tuple:
    case K::List:
    case K::Dict: {
      if (s.kind() == K::Dict) {
        Json keys = Json::array();
        for (const c10::IValue& k : s.keys()) keys.push_back(constant_json(k, where));
        out["keys"] = std::move(keys);
      }
      Json children = Json::array();
      for (const TreeSpec& c : s.children()) children.push_back(spec_json(c, where));
      out["children"] = std::move(children);
      break;
    }
  }
  return out;
}

// Elements, in units of the element size, between a tensor's first and last
// element, plus one: the bytes its view covers. Strides are never negative.
int64_t element_span(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  return span;
}

struct StoredTensor {
  std::string name;
  at::Tensor value;  // what is written: may differ in strides from the attribute
  uint64_t offset = 0;
  uint64_t length = 0;
  bool weightless = false;  // a meta tensor: metadata only (Note [Weightless tensors])
};

// Note [Which strides are stored]: a tensor whose view covers no more bytes
// than a contiguous copy would (dense in any dimension order, such as a
// transposed weight or a channels-last activation, or broadcast by zero
// strides) is stored as its bytes with its strides, so it loads exactly as it
// was. A view with gaps (a slice of a larger tensor) would drag the bytes it
// skips into the file; it is stored as a contiguous copy instead and loads
// with contiguous strides. Values are equal either way.
at::Tensor stored_form(const at::Tensor& t, const std::string& where) {
  if (t.layout() != c10::kStrided) {
    fail(where + ": only strided tensors can be stored, this one is " +
         std::string(c10::toString(t.layout())));
  }
  if (t.is_meta()) {
    // Note [Weightless tensors]: only the metadata is written. A meta
    // tensor's strides are what the tensor bound later should have.
    if (!format::is_storable_dtype(t.scalar_type())) {
      fail(where + ": tensors of dtype " + std::string(c10::toString(t.scalar_type())) +
           " cannot be stored");
    }
    return t;
  }
  if (!t.device().is_cpu()) {
    fail(where + ": the tensor is on " + t.device().str() + "; move the module to the CPU first");
  }
  if (!format::is_storable_dtype(t.scalar_type())) {
    fail(where + ": tensors of dtype " + std::string(c10::toString(t.scalar_type())) +
         " cannot be stored");
  }
  at::Tensor s = t.resolve_conj().resolve_neg();
  bool negative = false;
  for (int64_t st : s.strides()) negative |= st < 0;
  if (negative || element_span(s) > s.numel()) s = s.contiguous();
  return s;
}

// Where a file's bytes go (Note [Writing the file in one pass]): appended in
// order, then the header written over the first bytes.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void append(const void* data, size_t size) = 0;
  virtual void write_header(const char* header, size_t size) = 0;
  // Told the file's size once the JSON is written, before the tensors.
  virtual void reserve(uint64_t) {}
};

// Note [Attributes that share memory]
// The file stores each tensor's bytes on their own (both readers refuse
// overlapping bytes as damage), so distinct attributes that share memory in
// the module (a buffer and a view of it; the tracer keeps them so, Note
// [Attributes written during a trace]) are independent once loaded. That
// changes nothing while the graph only reads them; a graph that writes one
// in place would, loaded, not see the write through the other: a silent
// wrong answer, so such a module is refused.

// The get_attr nodes whose memory `n` writes, declared or not (Note [Writes
// the schema does not declare]).
std::vector<const Node*> written_attributes(const Node* n) {
  std::vector<const Node*> out;
  for (const Argument* a : detail::written_arguments(*n)) {
    if (!a->is_node()) continue;
    const Node* root = detail::memory_root(a->to_node(), /*through_views=*/true);
    if (root->op() == OpCode::GetAttr) out.push_back(root);
  }
  return out;
}

void check_no_written_attribute_shares_memory(const GraphModule& gm) {
  // Attributes on one storage as distinct tensors (tied names of one tensor
  // are stored once and stay tied).
  std::unordered_map<const c10::StorageImpl*, std::vector<const Attribute*>> by_storage;
  bool shared = false;
  for (const Attribute& a : gm.attributes()) {
    if (!a.value.defined() || a.value.is_meta() || !a.value.has_storage()) continue;
    auto& on = by_storage[a.value.storage().unsafeGetStorageImpl()];
    for (const Attribute* other : on) {
      shared = shared || !other->value.is_same(a.value);
    }
    on.push_back(&a);
  }
  if (!shared) return;
  for (const Node* n : gm.graph()) {
    for (const Node* attribute : written_attributes(n)) {
      const Attribute& a = gm.attribute(attribute->target());
      if (!a.value.defined() || a.value.is_meta() || !a.value.has_storage()) continue;
      for (const Attribute* other : by_storage.at(a.value.storage().unsafeGetStorageImpl())) {
        if (other->value.is_same(a.value)) continue;
        fail(node_where(n) + " writes attribute '" + a.name + "' in place, whose memory "
             "attribute '" + other->name + "' shares; the file stores each attribute's memory "
             "on its own, so the loaded graph would not see the write through '" + other->name +
             "'. Make one of them a tensor of its own (clone it) in the program");
      }
    }
  }
}

class Writer {
 public:
  explicit Writer(const GraphModule& gm) : gm_(gm) {}

  // Everything about the module as a whole is decided and checked before a
  // byte is written: lint, the module stack table, the JSON after the nodes
  // and where each tensor goes. The nodes are checked as they are written.
  void plan() {
    // The oldest version that holds the module (Note [Weightless tensors]).
    header_.minor = format::kOldestWrittenMinor;
    // A file that fails lint would be refused by load; refuse it here instead,
    // while the caller still has the module.
    try {
      gm_.lint();
    } catch (const LintError& e) {
      fail(std::string("the module does not pass lint: ") + e.what());
    }
    check_no_written_attribute_shares_memory(gm_);
    // The nodes are written as text (Note [Writing the nodes as text]); the
    // small rest is a tree, dumped after them. The bytes are what dumping one
    // tree of everything would give.
    head_ = "{";
    // Before the nodes that refer to it, so that a reader reading in order
    // has the table when it needs it.
    Json stacks = module_stacks_json();
    if (!stacks.empty()) head_ += "\"module_stacks\":" + stacks.dump() + ",";
    head_ += "\"nodes\":";
    Json doc = Json::object();
    Json attributes = Json::array();
    for (const Attribute& a : gm_.attributes()) {
      const std::string where = "attribute '" + a.name + "'";
      Json entry{{"name", checked_utf8(a.name, where)},
                 {"kind", format::token_name(format::kAttributeKinds, a.kind)},
                 {"tensor", nullptr}};
      if (a.value.defined()) entry["tensor"] = tensor_index(a, where);
      attributes.push_back(std::move(entry));
    }
    doc["attributes"] = std::move(attributes);
    doc["tensors"] = tensors_json();
    doc["in_spec"] = spec_json(gm_.in_spec, "the input spec");
    doc["out_spec"] = spec_json(gm_.out_spec, "the output spec");
    // Only what GraphModule stores: the rest of its signature (user inputs,
    // parameters, buffers) follows from the placeholders and attributes.
    if (gm_.has_mutation_outputs()) {
      Json outputs = Json::array();
      for (const OutputSpec& o : gm_.output_specs) {
        outputs.push_back(Json{{"kind", format::token_name(format::kOutputKinds, o.kind)},
                               {"target", checked_utf8(o.target, "the signature")}});
      }
      doc["signature"] = Json{{"outputs", std::move(outputs)}};
    }
    for (const Node* n : gm_.graph()) {
      if (detail::has_number_for_tensor(*n)) {
        // Note [Numbers for tensors in files] (format.h)
        header_.minor = std::max(header_.minor, format::kNumbersForTensorsSince);
        break;
      }
    }
    if (!gm_.call.empty()) {
      header_.minor = std::max(header_.minor, format::kCallSince);
      Json names = Json::array();
      for (const std::string& n : gm_.call.names) names.push_back(checked_utf8(n, "an argument name"));
      doc["call"] = Json{{"names", std::move(names)}, {"keywords", gm_.call.keywords}};
    }
    if (gm_.is_dynamic()) {
      // Note [Dynamic graphs in files] (format.h)
      header_.minor = std::max(header_.minor, format::kDynamicSince);
      Json symbols = Json::array();
      for (const Symbol& s : gm_.symbols) {
        Json dims = Json::array();
        for (const InputDim& d : s.dims) dims.push_back(Json::array({d.input, d.dim}));
        symbols.push_back(Json{{"label", checked_utf8(s.label, "a symbol's label")},
                               {"min", s.min},
                               {"max", s.max == kNoMaxSize ? Json(nullptr) : Json(s.max)},
                               {"dims", std::move(dims)}});
      }
      doc["symbols"] = std::move(symbols);
    }
    const std::string rest = doc.dump();
    // Note [The depth of the written JSON]: the module stack table is a fixed
    // 4 levels deep; the rest is a document of its own, and nests as it does
    // here. The nodes' objects nest no more than 8 levels; only argument
    // lists may nest deeper, and append_nodes says how deep, so the nodes'
    // text, most of a big graph's, needs no second pass.
    format::JsonScan scan = format::scan_json(rest.data(), rest.size(), format::kMaxJsonDepth);
    TORCH_INTERNAL_ASSERT(!scan.nul, "nlohmann::json wrote a raw NUL byte");
    if (scan.too_deep) too_deep();
    tail_ = "," + rest.substr(1);  // without its "{"
    header_.json_offset = format::kHeaderSize;
    header_.data_size = data_size_;
  }

  // Note [Writing the file in one pass]: the JSON section goes out a piece
  // of about a megabyte at a time, checksummed on the way, and the header,
  // which holds its size and checksum, last, over the zeros written in its
  // place. A big graph's text is tens of megabytes: held whole, or in pieces
  // until the end, it took that much fresh memory, and the first touch of
  // each of its pages (a page fault) was a large part of a save. A problem found in a node while writing (a string
  // that is not UTF-8, a dtype the format has no name for) throws with the
  // file unfinished; save() then removes it.
  void write(Sink& sink) {
    char header[format::kHeaderSize] = {};
    sink.append(header, sizeof header);
    uint64_t json_size = 0;
    uint32_t crc = 0;
    auto flush = [&](std::string& text) {
      json_size += text.size();
      if (json_size > format::kMaxJsonSize) {
        fail("the JSON section would be more than " + std::to_string(format::kMaxJsonSize) +
             " bytes, the most the format allows");
      }
      crc = format::crc32(text.data(), text.size(), crc);
      sink.append(text.data(), text.size());
      text.clear();
    };
    std::string text;
    text.reserve(kPiece);
    text = head_;
    const int node_depth = append_nodes(text, flush);
    if (node_depth > format::kMaxJsonDepth) too_deep();
    text += tail_;
    flush(text);

    header_.json_size = json_size;
    header_.json_crc = crc;
    header_.data_offset = format::align_up(header_.json_offset + header_.json_size);
    header_.file_size = header_.data_offset + header_.data_size;
    sink.reserve(header_.file_size);
    uint64_t pos = header_.json_offset + header_.json_size;
    static const char kZeros[format::kAlignment] = {};
    auto pad_to = [&](uint64_t target) {
      while (pos < target) {
        uint64_t n = std::min<uint64_t>(target - pos, sizeof kZeros);
        sink.append(kZeros, n);
        pos += n;
      }
    };
    for (const StoredTensor& t : tensors_) {
      if (t.weightless) continue;
      pad_to(header_.data_offset + t.offset);
      if (t.length > 0) sink.append(t.value.data_ptr(), t.length);
      pos += t.length;
    }
    pad_to(header_.file_size);
    format::encode_header(header_, header);
    sink.write_header(header, sizeof header);
  }

 private:
  [[noreturn]] static void too_deep() {
    fail("the graph's argument lists or specs nest deeper than the format allows (" +
         std::to_string(format::kMaxJsonDepth) + " JSON levels)");
  }

  // The JSON text goes out in pieces of about this size; a piece is handed
  // on once less than a few nodes' worth of room is left in it.
  static constexpr size_t kPiece = size_t{1} << 20;
  static constexpr size_t kFull = kPiece - (size_t{16} << 10);

  // Appends the `nodes` array to `text`, a node at a time (Note [Writing the
  // nodes as text]), passing `text` to `flush` whenever a piece is full
  // (Note [Writing the file in one pass]); returns the deepest JSON level
  // written (Note [The depth of the written JSON]).
  template <typename Flush>
  int append_nodes(std::string& text, Flush&& flush) {
    int deepest = 8;  // "meta": {"val": {"tensors": [{"sizes": [...]}]}}
    JsonText out(text);
    out.raw("[");
    bool first = true;
    for (const Node* n : gm_.graph()) {
      if (!first) out.raw(",");
      first = false;
      out.raw("{").key("name").string(checked_utf8(n->name(), n));
      out.raw(",").key("op").string(format::token_name(format::kOpcodes, n->op()));
      out.raw(",").key("target").string(checked_utf8(n->target(), n));
      out.raw(",").key("args").raw("[");
      for (size_t i = 0; i < n->args().size(); ++i) {
        if (i > 0) out.raw(",");
        write_argument(out, n->args()[i], n, 5, deepest);  // document, nodes, node, args
      }
      out.raw("]");
      if (!n->kwargs().empty()) {
        out.raw(",").key("kwargs").raw("[");
        bool first_kwarg = true;
        for (const auto& [k, v] : n->kwargs()) {
          if (!first_kwarg) out.raw(",");
          first_kwarg = false;
          out.raw("[").string(checked_utf8(k, n)).raw(",");
          write_argument(out, v, n, 6, deepest);  // ..., node, kwargs, pair
          out.raw("]");
        }
        out.raw("]");
      }
      write_meta(out, n->meta(), module_stack_index(n->meta().module_stack), n);
      out.raw("}");
      if (text.size() >= kFull) flush(text);
    }
    out.raw("]");
    return deepest;
  }

  // The distinct module stacks of the nodes, in order of first use. Nodes
  // of one module share one list (ModuleStack copies do), found by address;
  // equal lists at different addresses are merged by their contents.
  Json module_stacks_json() {
    Json table = Json::array();
    std::unordered_map<std::string, size_t> by_content;
    for (const Node* n : gm_.graph()) {
      const ModuleStack& stack = n->meta().module_stack;
      if (stack.empty()) continue;
      const std::vector<ModuleFrame>& frames = stack.frames();
      if (stack_index_.count(&frames)) continue;
      std::string key;
      for (const ModuleFrame& f : frames) key += f.path + '\0' + f.type + '\0';
      auto [it, inserted] = by_content.emplace(std::move(key), table.size());
      stack_index_.emplace(&frames, it->second);
      if (!inserted) continue;
      Json list = Json::array();
      for (const ModuleFrame& f : frames) {
        const std::string where = "node %" + n->name() + ": module '" + f.path + "'";
        list.push_back(Json{{"path", checked_utf8(f.path, where)},
                            {"type", checked_utf8(f.type, where)}});
      }
      table.push_back(std::move(list));
    }
    return table;
  }

  int64_t module_stack_index(const ModuleStack& stack) const {
    if (stack.empty()) return -1;
    return static_cast<int64_t>(stack_index_.at(&stack.frames()));
  }

  // One table entry per tensor, however many attributes name it (tied
  // weights stay tied after loading).
  int64_t tensor_index(const Attribute& a, const std::string& where) {
    auto [it, inserted] = index_.emplace(a.value.unsafeGetTensorImpl(), tensors_.size());
    if (!inserted) return static_cast<int64_t>(it->second);
    StoredTensor t;
    t.name = a.name;
    t.value = stored_form(a.value, where);
    if (t.value.is_meta()) {
      t.weightless = true;
      header_.minor = std::max(header_.minor, format::kWeightlessSince);
      tensors_.push_back(std::move(t));
      return static_cast<int64_t>(tensors_.size() - 1);
    }
    t.offset = format::align_up(data_size_);
    t.length = static_cast<uint64_t>(element_span(t.value)) * t.value.element_size();
    data_size_ = t.offset + t.length;
    tensors_.push_back(std::move(t));
    return static_cast<int64_t>(tensors_.size() - 1);
  }

  Json tensors_json() const {
    Json out = Json::array();
    for (const StoredTensor& t : tensors_) {
      if (t.weightless) {
        out.push_back(Json{{"name", t.name},
                           {"dtype", format::dtype_name(t.value.scalar_type())},
                           {"sizes", t.value.sizes().vec()},
                           {"strides", t.value.strides().vec()},
                           {"weightless", true}});
        continue;
      }
      out.push_back(Json{{"name", t.name},
                         {"dtype", format::dtype_name(t.value.scalar_type())},
                         {"sizes", t.value.sizes().vec()},
                         {"strides", t.value.strides().vec()},
                         {"offset", t.offset},
                         {"length", t.length},
                         {"crc32", format::crc32(t.value.data_ptr(), t.length)}});
    }
    return out;
  }

  const GraphModule& gm_;
  std::unordered_map<const std::vector<ModuleFrame>*, size_t> stack_index_;
  std::unordered_map<const c10::TensorImpl*, size_t> index_;
  std::vector<StoredTensor> tensors_;
  uint64_t data_size_ = 0;
  std::string head_;  // the JSON before the nodes' elements: `{..."nodes":`
  std::string tail_;  // and after them: `,"attributes":...}`
  format::Header header_;
};

using detail::system_error;

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  if (!detail::write_fully(fd, data, size)) fail(system_error("write", path));
}

class StringSink : public Sink {
 public:
  explicit StringSink(std::string& out) : out_(out) {}
  void append(const void* data, size_t size) override {
    out_.append(static_cast<const char*>(data), size);
  }
  void write_header(const char* header, size_t size) override { out_.replace(0, size, header, size); }
  void reserve(uint64_t size) override { out_.reserve(size); }

 private:
  std::string& out_;
};

class FileSink : public Sink {
 public:
  FileSink(int fd, const std::string& path) : fd_(fd), path_(path) {}
  void append(const void* data, size_t size) override { write_all(fd_, data, size, path_); }
  void write_header(const char* header, size_t size) override {
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::pwrite(fd_, header + done, size - done, static_cast<off_t>(done));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail(system_error("write", path_));
      }
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
  const std::string& path_;
};

}  // namespace

std::string save_to_string(const GraphModule& gm) {
  Writer w(gm);
  w.plan();
  std::string out;
  StringSink sink(out);
  w.write(sink);
  return out;
}

void save(const GraphModule& gm, const std::string& path) {
  Writer w(gm);
  // Every error about the module as a whole comes before the disk is
  // touched; one found in a node while writing leaves no file behind.
  w.plan();

  // Note [Temporary files and interrupts] in temp_files.cpp.
  detail::write_atomically(path, [&w](int fd, const std::string& tmp) {
    FileSink sink(fd, tmp);
    w.write(sink);
  }, [](const std::string& what) { fail(what); });
}

}  // namespace torchcap
