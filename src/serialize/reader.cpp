// Loading `.tcg` files (docs/FORMAT.md), verifying everything on the way.
//
// Note [Reading hostile files]: the reader assumes nothing about the bytes.
// Every header field, offset and length is checked against the file's real
// size with overflow-safe arithmetic before it is used (format::check_header,
// beside the header's encoding); the JSON text is bounded by the file size and
// by kMaxJsonSize, and its nesting by kMaxJsonDepth, which the cursor counts
// as it reads (and the flat scan of json_scan.h checks before anything reads
// in the contract's order); no count read from the file is used to reserve
// memory; tensors are views of the file's bytes, so their sizes cost nothing
// until read. The graph is built with the same API a user has
// (Graph::call_function resolves the operator, names are kept) and each node
// is checked against its schema as it is made, so the first problem is
// reported with the byte where its node starts.
#include <torchcap/error.h>
#include <torchcap/library.h>
#include <torchcap/serialize.h>

#include "graph/ivalue_conversion.h"
#include "graph/operator_name.h"
#include "graph/schema_check.h"
#include "serialize/format.h"
#include "serialize/json_cursor.h"
#include "serialize/json_scan.h"
#include "serialize/reader.h"
#include "serialize/shapes.h"
#include "serialize/specs.h"
#include "serialize/tensor_table.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace torchcap {
namespace {

using detail::Bytes;
using format::Entry;
using format::Field;
using format::Object;
using format::Order;

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
  std::string ns;
  try {
    ns = detail::operator_namespace(detail::parse_operator_name(target));
  } catch (const Error&) {
    return false;  // not an operator's name at all
  }
  return ns != "aten" && ns != "prim" && ns != "prims";
}

// Checks JSON syntax with nlohmann::json's own parser, building nothing, so
// that a syntax error is reported in its words, at its byte.
struct SyntaxCheck {
  using Json = nlohmann::json;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(Json::number_integer_t) { return true; }
  bool number_unsigned(Json::number_unsigned_t) { return true; }
  bool number_float(Json::number_float_t, const Json::string_t&) { return true; }
  bool string(Json::string_t&) { return true; }
  bool binary(Json::binary_t&) { return true; }
  bool start_object(size_t) { return true; }
  bool key(Json::string_t&) { return true; }
  bool end_object() { return true; }
  bool start_array(size_t) { return true; }
  bool end_array() { return true; }
  template <typename Exception>
  bool parse_error(size_t, const std::string&, const Exception& e) {
    throw e;
  }
};

class Reader {
 public:
  Reader(std::string source, std::shared_ptr<Bytes> bytes, const LoadOptions& options)
      : bytes_(std::move(bytes)), options_(options) {
    file_.source = std::move(source);
  }

  // The reading in text order alone (serialize/reader.h).
  std::optional<GraphModule> read_in_text_order_only() {
    try {
      read_header();
      return read_document(Order::Text);
    } catch (const format::ReadAgain&) {
    } catch (const std::exception&) {
    }
    return std::nullopt;
  }

  GraphModule read() {
    read_header();
    check_json_checksum();
    std::optional<GraphModule> gm;
    try {
      gm.emplace(read_document(Order::Text));
    } catch (const format::ReadAgain&) {
    } catch (const std::exception&) {
    }
    if (!gm) {
      start_over();
      gm.emplace(read_document(Order::Contract));
    }
    bind(*gm);
    return std::move(*gm);
  }

 private:
  // Note [Reading the usual file in one pass]: a file as the writer writes
  // it is read straight from its text, in one pass, into the graph: no JSON
  // tree, no scan before, and a stack trace that many nodes share made once.
  // The top-level values come as the writer orders them (module stacks,
  // nodes, then the small rest); the nodes are read where they are, the rest
  // once the text has been gone through. That is Order::Text. It checks all
  // that Order::Contract checks, with the same grammar, but not in the order
  // docs/FORMAT.md gives for reporting: so at any problem (or anything else
  // Order::Text cannot decide, format::ReadAgain) the file is read again in
  // Order::Contract (Note [Reading in the contract's order] in
  // json_cursor.h), which first checks the text whole and then reads the
  // top-level values in the contract's order, and reports what it finds
  // first. A file the writer wrote is read once; a file with a problem, or
  // in another order, twice.
  GraphModule read_document(Order order) {
    if (order == Order::Contract) check_text();
    format::Cursor c(text_, text_ + h_.json_size, h_.json_offset, file_, order);
    Entry document{&file_, h_.json_offset};
    if (c.at_end()) c.syntax_error();
    Field root(c, document, c.position());
    Object doc = root.object();
    doc.check_keys(format::keys::kDocument);
    top_.fill(nullptr);
    GraphModule gm;
    if (order == Order::Text) {
      doc.members([&](const Field& value) {
        top(value.key()) = value.at();
        if (std::strcmp(value.key(), "module_stacks") == 0) read_module_stacks(c);
        if (std::strcmp(value.key(), "nodes") == 0) read_nodes(c, gm.graph());
      });
      doc.close();
      if (!c.at_end()) c.syntax_error();
      c.inside_document();  // what is read now is a member of the document
      read_tensors(c);
      read_attributes(c);
    } else {
      for (const format::Key& k : format::keys::kDocument) {
        if (std::optional<Field> value = doc.find(k.name)) top(k.name) = value->at();
      }
      read_tensors(c);
      read_attributes(c);
      if (top("module_stacks") != nullptr) read_module_stacks(c);
      read_nodes(c, gm.graph());
    }
    finish(c, gm);
    return gm;
  }

  // Order::Contract's first step: the text is JSON, within the format's
  // limits, and holds an object (docs/FORMAT.md, "Reading", step 2).
  void check_text() const {
    format::JsonScan scan = format::scan_json(text_, h_.json_size, format::kMaxJsonDepth);
    if (scan.nul) {
      format::fail_at(file_, h_.json_offset + scan.nul_at, "the JSON section contains a NUL byte");
    }
    if (scan.big_integer) {
      format::fail_at(file_, h_.json_offset + scan.big_integer_at,
                      "integer " + scan.big_integer_text + " does not fit in 64 signed bits");
    }
    if (scan.too_deep) {
      format::fail_at(file_, h_.json_offset + scan.too_deep_at,
                      "the JSON nests deeper than " + std::to_string(format::kMaxJsonDepth) +
                          " levels");
    }
    try {
      SyntaxCheck sax;
      nlohmann::json::sax_parse(text_, text_ + h_.json_size, &sax);
    } catch (const nlohmann::json::exception& e) {
      // Syntax errors know their byte; a number too large for a double
      // (out_of_range) does not, and is reported at the section's start.
      uint64_t at = h_.json_offset;
      if (const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e)) {
        at += std::min<uint64_t>(pe->byte > 0 ? pe->byte - 1 : 0, h_.json_size);
      }
      std::string what = e.what();
      size_t bracket = what.find("] ");
      if (bracket != std::string::npos) what = what.substr(bracket + 2);
      format::fail_at(file_, at, "the JSON section is not valid JSON: " + what);
    }
    format::Cursor c(text_, text_ + h_.json_size, h_.json_offset, file_, Order::Contract);
    if (c.peek() != '{') {
      format::fail_at(file_, h_.json_offset,
                      std::string("the JSON section must hold an object, not ") +
                          c.type_name(c.position()));
    }
  }

  // Forgets what a reading that stopped had read.
  void start_over() {
    tensors_ = detail::TensorTable();
    attributes_.clear();
    attributes_read_ = false;
    attribute_metas_.clear();
    module_stacks_.clear();
    stack_traces_.clear();
    arguments_.clear();
  }

  // Where each top-level value starts in the text, by its key; nullptr if
  // the document has none.
  const char*& top(const char* key) {
    size_t i = 0;
    for (const format::Key& k : format::keys::kDocument) {
      if (std::strcmp(k.name, key) == 0) return top_[i];
      ++i;
    }
    TORCH_INTERNAL_ASSERT(false, "no top-level key ", key);
  }

  // A top-level value, such as 'signature', for messages.
  Entry top_entry(const char* key) {
    const char* at = top(key);
    Entry e{&file_, at == nullptr ? h_.json_offset : h_.json_offset + (at - text_)};
    e.key = key;
    return e;
  }

  const char* required(const char* key) {
    const char* at = top(key);
    if (at == nullptr) {
      format::fail_at(file_, h_.json_offset, "the JSON section has no '" + std::string(key) + "'");
    }
    return at;
  }

  // What follows the nodes: specs, signature, attributes and lint.
  void finish(format::Cursor& c, GraphModule& gm) {
    {
      Entry e = top_entry("in_spec");
      gm.in_spec = detail::read_tree_spec(Field(c, e, required("in_spec")));
    }
    {
      Entry e = top_entry("out_spec");
      gm.out_spec = detail::read_tree_spec(Field(c, e, required("out_spec")));
    }
    if (top("signature") != nullptr) {
      Entry e = top_entry("signature");
      gm.output_specs = detail::read_signature(Field(c, e, top("signature")));
    } else if (const Node* out = gm.graph().output_node()) {
      // A file without a signature returns user outputs only.
      gm.output_specs.assign(out->args()[0].to_list().size(), OutputSpec{});
    }
    if (top("call") != nullptr) {
      Entry e = top_entry("call");
      gm.call = detail::read_call(Field(c, e, top("call")));
      if (std::string problem = gm.call.mismatch(gm.in_spec); !problem.empty()) e.fail("", problem);
    }
    if (top("symbols") != nullptr) {
      Entry e = top_entry("symbols");
      gm.symbols = detail::read_symbols(Field(c, e, top("symbols")));
    }
    for (const PendingAttribute& a : attributes_) {
      gm.set_attribute(a.name, a.tensor < 0 ? at::Tensor() : tensors_.tensors[a.tensor], a.kind);
    }
    try {
      gm.lint();
    } catch (const LintError& e) {
      format::fail_at(file_, top_entry("nodes").offset, e.what());
    }
    // Note [Checking a file's shapes] (shapes.cpp)
    std::optional<detail::ShapeProblem> problem;
    if (options_.check_shapes) problem = detail::check_shapes(gm);
    if (problem) {
      size_t index = 0;
      for (const Node* n : gm.graph()) {
        if (n == problem->node) break;
        ++index;
      }
      Entry e{&file_, 0, "nodes", nullptr, index, "node", &problem->node->name()};
      Entry nodes = top_entry("nodes");
      Field(c, nodes, top("nodes")).elements([&](const Field& element) {
        if (element.index() == index) e.offset = element.offset();
      });
      e.fail("", problem->what);
    }
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

  // --- Header, checksum, tables ----------------------------------------------

  void read_header() {
    format::CheckedHeader checked =
        format::check_header(bytes_->data(), bytes_->size(), options_.verify_checksums);
    if (!checked.problem.empty()) format::fail_at(file_, checked.problem_at, checked.problem);
    h_ = checked.header;
    file_.major = h_.major;
    file_.minor = h_.minor;
    file_.strict = format::is_known_minor(h_.minor);
    verify_checksums_ = format::has_checksums(h_.minor) && options_.verify_checksums;
    text_ = reinterpret_cast<const char*>(bytes_->data() + h_.json_offset);
  }

  void check_json_checksum() const {
    if (!verify_checksums_) return;
    uint32_t crc = format::crc32(text_, h_.json_size);
    if (crc != h_.json_crc) {
      format::fail_at(file_, h_.json_offset,
                      "the JSON section is damaged: its CRC-32 is 0x" +
                          format::hex_digits(crc, 8) + ", the header records 0x" +
                          format::hex_digits(h_.json_crc, 8));
    }
  }

  void read_tensors(format::Cursor& c) {
    Entry table_at = top_entry("tensors");
    Field table(c, table_at, required("tensors"));
    tensors_ = detail::read_tensor_table(table, bytes_, h_, verify_checksums_);
  }

  // The table of distinct module stacks nodes refer to by index (version 1.2).
  // Each entry becomes one ModuleStack, which the nodes then share.
  void read_module_stacks(format::Cursor& c) {
    Entry table_at = top_entry("module_stacks");
    Field(c, table_at, top("module_stacks")).elements([&](const Field& element) {
      Entry e{&file_, element.offset(), "module_stacks", nullptr, element.index()};
      std::vector<ModuleFrame> frames;
      element.in(e).elements([&](const Field& f) {
        Object frame = f.object();
        frame.check_keys(format::keys::kModuleFrame);
        std::string path(frame.get("path").string());
        std::string type(frame.get("type").string());
        frame.close();
        frames.push_back(ModuleFrame{std::move(path), std::move(type)});
      });
      module_stacks_.emplace_back(std::move(frames));
    });
  }

  struct PendingAttribute {
    std::string name;
    AttributeKind kind;
    int64_t tensor;  // -1: undefined
  };

  void read_attributes(format::Cursor& c) {
    Entry table_at = top_entry("attributes");
    std::set<std::string> names;
    Field(c, table_at, required("attributes")).elements([&](const Field& element) {
      Entry e{&file_, element.offset(), "attributes", nullptr, element.index()};
      Field a = element.in(e);
      Object o = a.object();
      o.check_keys(format::keys::kAttribute);
      Field name_field = o.get("name");
      const std::string name(name_field.string());
      e.noun = "attribute";
      e.name = &name;
      // A dotted path of non-empty parts, as get_attr targets are.
      if (name.empty() || name.front() == '.' || name.back() == '.' ||
          name.find("..") != std::string::npos) {
        name_field.fail("the name is not a dotted path of non-empty parts");
      }
      if (!names.insert(name).second) name_field.fail("a second attribute has this name");
      AttributeKind kind = o.get("kind").token(format::kAttributeKinds, "attribute kind");
      Field t = o.get("tensor");
      int64_t index = -1;
      if (t.is_null()) {
        t.null();
      } else {
        index = t.integer();
        if (index < 0 || static_cast<uint64_t>(index) >= tensors_.tensors.size()) {
          t.fail("tensor index " + std::to_string(index) + " is not in the tensor table of " +
                 std::to_string(tensors_.tensors.size()));
        }
      }
      o.close();
      attributes_.push_back(PendingAttribute{name, kind, index});
    });
    attributes_read_ = true;
  }

  // --- Nodes -----------------------------------------------------------------

  void read_nodes(format::Cursor& c, Graph& g) {
    Entry table_at = top_entry("nodes");
    Field nodes(c, table_at, required("nodes"));
    nodes.elements([&](const Field& element) {
      Entry e{&file_, element.offset(), "nodes", nullptr, element.index()};
      read_node(element.in(e), e, g);
    });
    if (g.output_node() == nullptr) table_at.fail("", "the graph has no output node");
  }

  // One node: reads its fields and makes it, checked as it is made.
  void read_node(const Field& node, Entry& e, Graph& g) {
    Object o = node.object();
    o.check_keys(format::keys::kNode);
    // The strings are the reader's, kept from node to node: a target such as
    // "aten::add.Tensor" is too long for a string's own buffer.
    node_name_.assign(o.get("name").string());
    e.noun = "node";
    e.name = &node_name_;
    node_op_.assign(o.get("op").string());
    node_target_.assign(o.get("target").string());
    ArgumentList args;
    if (std::optional<Field> list = o.find("args")) args = arguments(*list, g);
    Kwargs kwargs;
    if (std::optional<Field> list = o.find("kwargs")) {
      list->elements([&](const Field& pair) {
        auto not_a_pair = [&] { pair.fail("a keyword argument is a [name, value] pair"); };
        if (!pair.is_array()) not_a_pair();
        pair.elements([&](size_t n) { if (n != 2) not_a_pair(); },
                      [&](const Field& item) {
                        if (item.index() == 0) {
                          if (!item.is_string()) not_a_pair();
                          kwarg_name_.assign(item.string());
                        } else if (item.index() == 1) {
                          kwargs.emplace_back(kwarg_name_, argument(item, g));
                        }
                      });
      });
    }
    auto fail = [&](const char* key, const std::string& what) {
      if (key == nullptr) node.fail(what);
      if (!o.has(key)) node.fail(std::string("missing '") + key + "'");
      Field(node, key).fail(what);
    };
    Node* n = make_node(g, std::move(args), std::move(kwargs), fail);
    if (std::optional<Field> meta = o.find("meta")) n->meta() = node_meta(*meta);
    o.close();
    check_arguments(n, fail);
  }

  // A list of arguments, allocated once at its size: they are read into
  // arguments_, a stack of the lists being read, nested ones above. Lists
  // nest as deep as the JSON does, which the cursor bounds.
  ArgumentList arguments(const Field& list, const Graph& g) {
    const size_t start = arguments_.size();
    list.elements([&](const Field& a) { arguments_.push_back(argument(a, g)); });
    ArgumentList out(std::make_move_iterator(arguments_.begin() + static_cast<ptrdiff_t>(start)),
                     std::make_move_iterator(arguments_.end()));
    arguments_.resize(start);
    return out;
  }

  Argument argument(const Field& f, const Graph& g) {
    switch (f.first()) {
      case 'n':
        f.null();
        return Argument();
      case 't':
      case 'f':
        return Argument(f.boolean());
      case '"':
        return Argument(std::string(f.string()));
      case '[':
        return Argument(arguments(f, g));
      case '{':
        break;
      default: {
        format::Cursor::Number n = f.number();
        if (!n.is_integer) return Argument(n.d);
        if (!n.fits) f.integer();  // fails, naming the integer
        return Argument(n.i);
      }
    }
    Object o = f.object();
    std::optional<std::string_view> kind = o.only_key();
    if (!kind) f.fail("a typed argument is an object with exactly one key");
    std::optional<format::ArgumentTag> tag = format::token_value(format::kArgumentTags, *kind);
    if (!tag) f.fail("unknown argument kind '" + std::string(*kind) + "'");
    Field value = o.only_value(format::tag(*tag));
    Argument out;
    switch (*tag) {
      case format::ArgumentTag::Node: {
        name_.assign(value.string());
        Node* n = g.find(name_);
        if (n == nullptr) value.fail("%" + name_ + " is not a node defined before this one");
        out = Argument(n);
        break;
      }
      case format::ArgumentTag::Float:
        out = Argument(value.float_value());
        break;
      case format::ArgumentTag::Dtype:
        out = Argument(value.dtype());
        break;
      case format::ArgumentTag::Device:
        out = Argument(value.device());
        break;
      case format::ArgumentTag::Layout:
        out = Argument(value.token(format::kLayouts, "layout"));
        break;
      case format::ArgumentTag::MemoryFormat:
        out = Argument(value.token(format::kMemoryFormats, "memory format"));
        break;
    }
    o.close();
    return out;
  }

  TensorMeta tensor_meta(const Field& f) const {
    Object o = f.object();
    o.check_keys(format::keys::kTensorMeta);
    TensorMeta m;
    m.dtype = o.get("dtype").dtype();
    o.get("sizes").dims(true, m.sizes);
    Field strides = o.get("strides");
    strides.dims(false, m.strides);
    if (m.strides.size() != m.sizes.size()) {
      strides.fail(std::to_string(m.strides.size()) + " strides for " +
                   std::to_string(m.sizes.size()) + " dimensions");
    }
    m.device = o.get("device").device();
    // Note [Dynamic graphs in files] (format.h)
    std::optional<Field> symbolic_sizes = o.find("symbolic_sizes");
    std::optional<Field> symbolic_strides = o.find("symbolic_strides");
    if (symbolic_sizes.has_value() != symbolic_strides.has_value()) {
      (symbolic_sizes ? *symbolic_sizes : *symbolic_strides)
          .fail("symbolic_sizes and symbolic_strides go together");
    }
    if (symbolic_sizes) {
      auto shape = std::make_shared<SymbolicShape>();
      for (auto [field, exprs] : {std::pair<const Field*, std::vector<SizeExpr>*>{&*symbolic_sizes, &shape->sizes},
                                  {&*symbolic_strides, &shape->strides}}) {
        field->elements([&](const Field& e) {
          try {
            exprs->push_back(SizeExpr::parse(std::string(e.string())));
          } catch (const FormatError&) {
            throw;
          } catch (const Error& ex) {
            e.fail(ex.what());
          }
        });
        if (exprs->size() != m.sizes.size()) {
          field->fail(std::to_string(exprs->size()) + " expressions for " + std::to_string(m.sizes.size()) +
                      " dimensions");
        }
      }
      m.symbolic = std::move(shape);
    }
    o.close();
    return m;
  }

  ValueMeta value_meta(const Field& f) const {
    Object o = f.object();
    o.check_keys(format::keys::kValue);
    ValueMeta val;
    val.kind = o.get("kind").token(format::kValueKinds, "value kind");
    const int want = format::value_kind_tensors(val.kind);  // -1: any number
    Field tensors = o.get("tensors");
    tensors.elements(
        [&](size_t n) {
          if (want >= 0 && n != static_cast<size_t>(want)) {
            tensors.fail(std::string("a value of kind '") +
                         format::token_name(format::kValueKinds, val.kind) + "' has " +
                         std::to_string(want) + " tensor(s), not " + std::to_string(n));
          }
        },
        [&](const Field& t) { val.tensors.push_back(tensor_meta(t)); });
    o.close();
    return val;
  }

  // Nodes of one line of the program share its stack trace, found by its text.
  StackTrace stack_trace(const Field& frames) {
    std::string_view text = frames.text();
    auto it = stack_traces_.find(text);
    if (it != stack_traces_.end()) return it->second;
    std::vector<SourceFrame> out;
    frames.elements([&](const Field& f) {
      Object o = f.object();
      o.check_keys(format::keys::kFrame);
      SourceFrame frame;
      frame.file.assign(o.get("file").string());
      Field line = o.get("line");
      int64_t number = line.non_negative();
      if (number > std::numeric_limits<int>::max()) line.fail("line number too large");
      frame.line = static_cast<int>(number);
      frame.function.assign(o.get("function").string());
      if (std::optional<Field> code = o.find("code")) frame.code.assign(code->string());
      o.close();
      out.push_back(std::move(frame));
    });
    StackTrace trace = StackTrace::from_frames(std::move(out));
    stack_traces_.emplace(text, trace);
    return trace;
  }

  NodeMeta node_meta(const Field& f) {
    Object o = f.object();
    o.check_keys(format::keys::kMeta);
    NodeMeta meta;
    if (std::optional<Field> val = o.find("val")) meta.val = value_meta(*val);
    if (std::optional<Field> frames = o.find("stack_trace")) meta.stack_trace = stack_trace(*frames);
    if (std::optional<Field> stack = o.find("module_stack")) {
      int64_t index = stack->integer();
      if (index < 0 || static_cast<uint64_t>(index) >= module_stacks_.size()) {
        stack->fail("module stack " + std::to_string(index) +
                    " is not in the module stack table of " +
                    std::to_string(module_stacks_.size()));
      }
      meta.module_stack = module_stacks_[static_cast<size_t>(index)];
    }
    o.close();
    return meta;
  }

  // The operator a call_function target names, looked up once per distinct
  // target; nullopt if none is registered (Graph::call_function then says so).
  std::optional<c10::OperatorHandle> find_operator(const std::string& target) {
    auto it = operators_.find(target);
    if (it != operators_.end()) return it->second;
    c10::optional<c10::OperatorHandle> handle;
    c10::OperatorName name{"", ""};
    try {
      name = detail::parse_operator_name(target);
    } catch (const Error&) {
      return std::nullopt;  // not a qualified name: Graph::call_function says so
    }
    handle = c10::Dispatcher::singleton().findSchema(name);
    // Note [Operator libraries found by their namespace] (library.h)
    if (!handle && load_library_of_namespace(detail::operator_namespace(name))) {
      handle = c10::Dispatcher::singleton().findSchema(name);
    }
    if (!handle) return std::nullopt;
    operators_.emplace(target, *handle);
    return *handle;
  }

  // Makes the node read into node_name_, node_op_ and node_target_ with the
  // graph's own API (which checks names and resolves the operator).
  // `fail(key, what)` reports a problem with the node's member `key`
  // (nullptr: the node itself) and does not return.
  template <typename Fail>
  Node* make_node(Graph& g, ArgumentList args, Kwargs kwargs, Fail&& fail) {
    const std::string& name = node_name_;
    const std::string& target = node_target_;
    if (g.output_node() != nullptr) fail(nullptr, "the node comes after the output node");
    auto no_arguments = [&](const char* what) {
      if (!args.empty() || !kwargs.empty()) fail(nullptr, std::string(what) + " takes no arguments");
    };
    Node* n = nullptr;
    const std::optional<OpCode> opcode = format::token_value(format::kOpcodes, node_op_);
    try {
      if (!opcode) fail("op", "unknown opcode '" + node_op_ + "'");
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
          if (format::is_size_target_token(target)) {
            if (file_.minor < format::kDynamicSince) {
              fail("target", "size computations ('" + target + "') came in version 1." +
                                 std::to_string(format::kDynamicSince) + "; this file is version 1." +
                                 std::to_string(file_.minor));
            }
            if (!kwargs.empty()) fail("kwargs", target + " takes no keyword arguments");
            n = g.size_computation(target, std::move(args), name);
            break;
          }
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
        std::string ns;
        try {
          ns = detail::operator_namespace(detail::parse_operator_name(target));
        } catch (const Error&) {
        }
        const std::string known = library_location_of_namespace(ns);
        what += known.empty()
                    ? "; load the library that defines it first (dlopen it or link it into the "
                      "program, as torch.ops.load_library does in Python)"
                    : "; it is " + ns + "'s, whose library torchcap loads from " + known +
                          " (Debian's python3-" + ns + ") where it is installed: install it, or "
                          "load the library that defines it first (dlopen it, as "
                          "torch.ops.load_library does in Python)";
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
      if (problem.empty() && file_.minor < format::kNumbersForTensorsSince &&
          detail::has_number_for_tensor(*n)) {
        problem = "numbers given for Tensor parameters came in version 1." +
                  std::to_string(format::kNumbersForTensorsSince) + "; this file is version 1." +
                  std::to_string(file_.minor);
      }
      if (problem.empty()) {
        problem = detail::check_trusting_kernels(
            *n, [this](const Node& in) { return recorded_meta(in); });
      }
    } else if (n->is_getitem()) {
      problem = detail::check_getitem(*n);
    } else if (n->is_size_computation()) {
      problem = detail::check_size_computation(*n);
    }
    if (!problem.empty()) fail(nullptr, problem);
  }

  // The recorded metadata of a node's tensor value, or nullptr: an
  // attribute's own, a node's `meta.val`, or a getitem's element of its
  // source's. Order::Text reads the attributes after the nodes, and reads
  // again if it needs one before.
  const TensorMeta* recorded_meta(const Node& n) {
    if (n.op() == OpCode::GetAttr) {
      if (!attributes_read_) throw format::ReadAgain{};
      auto it = attribute_metas_.find(n.target());
      if (it != attribute_metas_.end()) return &it->second;
      for (const PendingAttribute& a : attributes_) {
        if (a.name != n.target() || a.tensor < 0) continue;
        const at::Tensor& t = tensors_.tensors[a.tensor];
        return &attribute_metas_.emplace(a.name, TensorMeta::of(t)).first->second;
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

  format::FileInfo file_;
  std::shared_ptr<Bytes> bytes_;
  format::Header h_;
  const char* text_ = nullptr;  // the JSON section
  LoadOptions options_;
  bool verify_checksums_ = false;  // the file's version has checksums, and the caller wants them
  std::array<const char*, format::keys::kDocument.size()> top_{};
  detail::TensorTable tensors_;
  std::vector<PendingAttribute> attributes_;
  bool attributes_read_ = false;  // attributes_ holds the file's
  // TensorMeta::of the attributes recorded_meta looked up, by name.
  std::unordered_map<std::string, TensorMeta> attribute_metas_;
  std::vector<ModuleStack> module_stacks_;
  std::unordered_map<std::string, c10::OperatorHandle> operators_;
  // Stack traces by their text; strings being read, kept from node to node.
  std::unordered_map<std::string_view, StackTrace> stack_traces_;
  std::string name_, kwarg_name_, node_name_, node_op_, node_target_;
  ArgumentList arguments_;  // the argument lists being read
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

std::optional<GraphModule> detail::read_in_text_order(const void* data, size_t size,
                                                       const LoadOptions& options) {
  return Reader("<buffer>", std::make_shared<AlignedCopy>(data, size), options)
      .read_in_text_order_only();
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
