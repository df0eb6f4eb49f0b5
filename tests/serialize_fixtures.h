// Modules and file surgery shared by the format's tests, the Python loader's
// fixture and the fuzzer's seed generator.
//
// TcgFile takes a `.tcg` file apart by the layout docs/FORMAT.md gives (not by
// the library's own code, so the tests also check the documented layout) and
// puts it back together with a consistent header and checksums, so a test can
// damage one thing at a time: what it changes is then a hostile file, made to
// pass the checksums, and what it breaks after `bytes()` is damage.
#pragma once

#include <torchcap/graph_module.h>

#include "sample_graphs.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace torchcap::testing {

struct TcgFile {
  std::string magic;  // 8 bytes
  uint16_t major = 1, minor = 0;  // from version 1.1: a 72-byte header with checksums
  std::string json;
  uint64_t data_offset = 0;
  std::string data;

  static uint64_t get(const std::string& b, size_t offset, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(b.at(offset + i))) << (8 * i);
    }
    return v;
  }

  static void put(std::string& b, size_t offset, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) b.at(offset + i) = static_cast<char>((value >> (8 * i)) & 0xff);
  }

  static uint32_t crc(const std::string& bytes) {
    return static_cast<uint32_t>(
        ::crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
  }

  // Recomputes the header checksum of a file of version 1.1 or later after
  // its header was changed with put(): the CRC-32 of the header without
  // bytes 68 to 71, which hold it. Leaves shorter files alone.
  static void seal_header(std::string& b) {
    if (b.size() < 72 || get(b, 10, 2) < 1) return;
    uint64_t size = std::min<uint64_t>(std::max<uint64_t>(get(b, 12, 4), 72), b.size());
    put(b, 68, crc(b.substr(0, 68) + b.substr(72, size - 72)), 4);
  }

  // put() into the header, then seal_header().
  static void put_header(std::string& b, size_t offset, uint64_t value, int bytes) {
    put(b, offset, value, bytes);
    seal_header(b);
  }

  static TcgFile parse(const std::string& b) {
    if (b.size() < 64) throw std::runtime_error("TcgFile: shorter than a header");
    TcgFile f;
    f.magic = b.substr(0, 8);
    f.major = static_cast<uint16_t>(get(b, 8, 2));
    f.minor = static_cast<uint16_t>(get(b, 10, 2));
    f.json = b.substr(get(b, 24, 8), get(b, 32, 8));
    f.data_offset = get(b, 40, 8);
    f.data = b.substr(f.data_offset, get(b, 48, 8));
    return f;
  }

  // Where the JSON section starts in files of this version.
  uint64_t json_offset() const { return minor >= 1 ? 72 : 64; }

  // The file with a header, and from version 1.1 checksums, that agree with
  // the sections as they are now. The tensor table's checksums are
  // recomputed where the JSON is an object whose `tensors` entries have
  // integer `offset` and `length` inside the data and a 32-bit `crc32`;
  // otherwise the JSON text is kept as it is.
  std::string bytes() const {
    const uint64_t header = json_offset();
    std::string text = minor >= 1 ? with_tensor_checksums() : json;
    std::string b(header, '\0');
    b.replace(0, 8, magic);
    put(b, 8, major, 2);
    put(b, 10, minor, 2);
    put(b, 12, header, 4);
    uint64_t data_at = (header + text.size() + 63) / 64 * 64;
    put(b, 16, data_at + data.size(), 8);
    put(b, 24, header, 8);
    put(b, 32, text.size(), 8);
    put(b, 40, data_at, 8);
    put(b, 48, data.size(), 8);
    put(b, 56, 64, 4);
    if (minor >= 1) {
      put(b, 64, crc(text), 4);
      seal_header(b);
    }
    b += text;
    b.resize(data_at, '\0');
    return b + data;
  }

 private:
  std::string with_tensor_checksums() const {
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(json, nullptr, false);
    if (!doc.is_object() || !doc.contains("tensors") || !doc["tensors"].is_array()) return json;
    bool changed = false;
    for (auto& t : doc["tensors"]) {
      if (!t.is_object() || !t.contains("crc32") || !t["crc32"].is_number_unsigned() ||
          t["crc32"].get<uint64_t>() > 0xffffffff || !t.contains("offset") ||
          !t.contains("length") || !t["offset"].is_number_unsigned() ||
          !t["length"].is_number_unsigned()) {
        continue;
      }
      uint64_t offset = t["offset"].get<uint64_t>(), length = t["length"].get<uint64_t>();
      if (offset > data.size() || length > data.size() - offset) continue;
      uint32_t c = crc(data.substr(offset, length));
      if (t["crc32"] != c) {
        t["crc32"] = c;
        changed = true;
      }
    }
    return changed ? doc.dump() : json;
  }
};

// The offset, in compact JSON text (as both the writer and nlohmann's dump()
// produce it), where element `i` of the top-level array `key` starts.
inline uint64_t element_offset(const std::string& json, const std::string& key, size_t i) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(json);
  uint64_t at = 1;  // "{"
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    at += it.key().size() + 3;  // "key":
    if (it.key() == key) {
      at += 1;  // "["
      for (size_t k = 0; k < i; ++k) at += it.value()[k].dump().size() + 1;
      return at;
    }
    at += it.value().dump().size() + 1;
  }
  throw std::runtime_error("no array " + key);
}

// The small module the damaged files are made from. Nodes, in order:
//   0 x, 1 w, 2 mask, 3 add, 4 topk, 5 getitem, 6 where, 7 output
// Tensors: w (f32[2, 3], bytes [0, 24)), mask (bool[3], bytes [64, 67)).
inline GraphModule small_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* w = g.get_attr("w");
  Node* mask = g.get_attr("mask");
  Node* add = g.call_function("aten::add.Tensor", {x, w}, {{"alpha", 0.5}});
  Node* top = g.call_function("aten::topk", {add, 2});
  Node* vals = g.getitem(top, 0);
  Node* where = g.call_function("aten::where.self", {mask, vals, vals});
  g.output({where});
  gm.set_flat_specs();
  x->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 3}));
  top->meta().val = ValueMeta{ValueKind::Tuple, {meta(c10::kFloat, {2, 2}), meta(c10::kLong, {2, 2})}};
  gm.set_attribute("w", at::arange(6, at::kFloat).reshape({2, 3}), AttributeKind::Parameter);
  gm.set_attribute("mask", at::tensor({1, 0, 1}).to(at::kBool), AttributeKind::Buffer);
  return gm;
}

// A weightless module (version 1.3): `w` (f32[2, 3]) is a meta tensor, saved
// without bytes; `b` (f32[3]) is stored. It computes topk(x + 0.5 * w + b, 2)
// values, with operators that have meta kernels. weightless_module_bound() is
// the same module with `w` holding arange(6).
inline GraphModule weightless_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* w = g.get_attr("w");
  Node* b = g.get_attr("b");
  Node* add = g.call_function("aten::add.Tensor", {x, w}, {{"alpha", 0.5}});
  Node* shift = g.call_function("aten::add.Tensor", {add, b});
  Node* top = g.call_function("aten::topk", {shift, 2});
  Node* vals = g.getitem(top, 0);
  g.output({vals});
  gm.set_flat_specs();
  x->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 3}));
  top->meta().val = ValueMeta{ValueKind::Tuple, {meta(c10::kFloat, {2, 2}), meta(c10::kLong, {2, 2})}};
  gm.set_attribute("w", at::empty({2, 3}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta)),
                   AttributeKind::Parameter);
  gm.set_attribute("b", at::tensor({0.25f, -1.0f, 2.0f}), AttributeKind::Buffer);
  return gm;
}

inline GraphModule weightless_module_bound() {
  GraphModule gm = weightless_module();
  gm.set_attribute("w", at::arange(6, at::kFloat).reshape({2, 3}), AttributeKind::Parameter);
  return gm;
}

// A signature as export_program makes one: a user output, then the new values
// of a buffer and of an input.
inline GraphModule signature_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* mean = g.get_attr("stats.mean");
  Node* y = g.call_function("aten::mul.Tensor", {x, mean});
  Node* new_mean = g.call_function("aten::add.Tensor", {mean, x});
  Node* new_x = g.call_function("aten::mul.Scalar", {x, 2});
  g.output({y, new_mean, new_x});
  gm.in_spec = TreeSpec::tuple({TreeSpec::leaf()});
  gm.out_spec = TreeSpec::leaf();
  gm.output_specs = {OutputSpec{OutputKind::User, ""},
                     OutputSpec{OutputKind::BufferMutation, "stats.mean"},
                     OutputSpec{OutputKind::InputMutation, "x"}};
  gm.set_attribute("stats.mean", at::arange(3, at::kFloat), AttributeKind::Buffer);
  return gm;
}

// Every Argument alternative, in places where operator schemas accept them.
inline GraphModule every_argument_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* idx = g.placeholder("idx");
  ArgumentList results;

  // Every dtype, layout, device and memory format the format names.
  const c10::ScalarType dtypes[] = {
      c10::kByte,   c10::kChar,          c10::kShort,         c10::kInt,
      c10::kLong,   c10::kHalf,          c10::kFloat,         c10::kDouble,
      c10::kComplexHalf, c10::kComplexFloat, c10::kComplexDouble, c10::kBool,
      c10::kBFloat16, c10::kQInt8,       c10::kQUInt8,        c10::kQInt32,
      c10::kQUInt4x2, c10::kQUInt2x4};
  const c10::Layout layouts[] = {c10::kStrided,   c10::kSparse,    c10::kSparseCsr,
                                 c10::kSparseCsc, c10::kSparseBsr, c10::kSparseBsc,
                                 c10::kMkldnn};
  const c10::Device devices[] = {c10::Device(c10::kCPU), c10::Device(c10::kCUDA, 1),
                                 c10::Device(c10::kMeta), c10::Device(c10::kCUDA)};
  size_t i = 0;
  for (c10::ScalarType t : dtypes) {
    results.push_back(g.call_function(
        // Argument(...) spelled out: `{ArgumentList{2, 3}}` alone is one
        // argument (a list) to GCC but copies the list (two arguments) in clang.
        "aten::zeros", {Argument(ArgumentList{2, 3})},
        {{"dtype", t},
         {"layout", layouts[i % std::size(layouts)]},
         {"device", devices[i % std::size(devices)]},
         {"pin_memory", i % 2 == 0 ? Argument(false) : Argument()}}));
    ++i;
  }
  for (c10::MemoryFormat m : {c10::MemoryFormat::Contiguous, c10::MemoryFormat::Preserve,
                              c10::MemoryFormat::ChannelsLast, c10::MemoryFormat::ChannelsLast3d}) {
    results.push_back(g.call_function("aten::clone", {x}, {{"memory_format", m}}));
  }
  // Integers at the edges, bools and doubles as Scalars.
  for (Argument v : {Argument(std::numeric_limits<int64_t>::min()),
                     Argument(std::numeric_limits<int64_t>::max()), Argument(0), Argument(-1),
                     Argument(true), Argument(false), Argument(0.1), Argument(-0.0),
                     Argument(std::numeric_limits<double>::infinity()),
                     Argument(std::numeric_limits<double>::quiet_NaN())}) {
    results.push_back(g.call_function("aten::add.Scalar", {x, v}, {{"alpha", 2}}));
  }
  // Strings: escapes, control characters and non-ASCII text; and none.
  results.push_back(g.call_function(
      "aten::div.Tensor_mode", {x, x},
      {{"rounding_mode", "quote \" backslash \\ newline \n tab \t bell \x07 \xc3\xbc \xf0\x9f\x98\x80"}}));
  results.push_back(g.call_function("aten::div.Tensor_mode", {x, x}, {{"rounding_mode", ""}}));
  results.push_back(g.call_function("aten::div.Tensor_mode", {x, x}, {{"rounding_mode", Argument()}}));
  results.push_back(g.call_function("aten::clamp", {x, Argument(), 1.5}));
  // Lists: of ints, of nodes, and of optional nodes (none among them).
  results.push_back(g.call_function("aten::cat", {ArgumentList{x, x, x}, -1}));
  results.push_back(g.call_function("aten::index.Tensor", {x, ArgumentList{Argument(), idx}}));
  results.push_back(g.call_function("aten::permute", {x, ArgumentList{1, 0}}));
  results.push_back(g.call_function("aten::sum.dim_IntList", {x, ArgumentList{}, true}));
  // Several outputs: a tuple (topk) and a list (split), read by getitem.
  Node* top = g.call_function("aten::topk", {x, 1, -1, false, true});
  top->meta().val = ValueMeta{ValueKind::Tuple, {meta(c10::kFloat, {2, 1}), meta(c10::kLong, {2, 1})}};
  results.push_back(g.getitem(top, 0));
  results.push_back(g.getitem(top, 1));
  Node* parts = g.call_function("aten::split.Tensor", {x, 1});
  parts->meta().val = ValueMeta{ValueKind::List, {meta(c10::kFloat, {1, 3}), meta(c10::kFloat, {1, 3})}};
  results.push_back(g.getitem(parts, 1));
  // A node with nothing recorded as its value, and stack frames with odd text.
  Node* none = g.call_function("aten::relu", {x});
  none->meta().val = ValueMeta{ValueKind::None, {}};
  none->meta().stack_trace = StackTrace::from_frames(
      {SourceFrame{"src/m\xc3\xb6" "del.cpp", 42, "torchcap::Model::forward(at::Tensor)", {}},
       SourceFrame{"", 0, "", {}},
       SourceFrame{"main.py", std::numeric_limits<int>::max(), "main", "return run(model, x)"}});
  results.push_back(none);
  // Module stacks (version 1.2): one list shared by several nodes, an equal
  // list made separately, and a second stack; the clones have none.
  ModuleStack block({ModuleFrame{"layer1", "torch.nn.modules.container.Sequential"},
                     ModuleFrame{"layer1.0", "torchvision.models.resnet.BasicBlock"}});
  none->meta().module_stack = block;
  top->meta().module_stack = block;
  parts->meta().module_stack = ModuleStack(block.frames());
  x->meta().module_stack =
      ModuleStack({ModuleFrame{"block1-0.class", "m\xc3\xb6" "dule.Odd"}});
  x->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 3}));
  x->meta().val.tensors[0].strides = {1, 2};
  idx->meta().val = ValueMeta::tensor(TensorMeta{c10::kLong, {4}, {1}, c10::Device(c10::kCUDA, 0), nullptr});

  g.output(results);
  gm.set_flat_specs();
  return gm;
}

// Nested specs with constants of every kind, dicts with string and int keys, none.
inline GraphModule nested_spec_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* a = g.placeholder("a");
  Node* b = g.placeholder("b");
  Node* c = g.placeholder("c");
  Node* sum = g.call_function("aten::add.Tensor", {a, b});
  Node* prod = g.call_function("aten::mul.Tensor", {sum, c});
  g.output({sum, prod, c});
  using S = TreeSpec;
  gm.in_spec = S::tuple(
      {S::leaf(),
       S::tuple({S::leaf(), S::dict({c10::IValue("k"), c10::IValue("n")}, {S::leaf(), S::none()})}),
       S::list({S::constant(int64_t{3}), S::constant(2.5), S::constant(true),
                S::constant(std::string("s\xc3\xa9")),
                S::constant(std::numeric_limits<double>::infinity())}),
       S::dict({c10::IValue(int64_t{1}), c10::IValue(int64_t{-2})}, {S::constant(false), S::none()}),
       S::tuple({}), S::none()});
  gm.out_spec = S::dict({c10::IValue("sum"), c10::IValue("pair"), c10::IValue("n")},
                        {S::leaf(), S::tuple({S::leaf(), S::none()}), S::constant(int64_t{7})});
  gm.out_spec = S::tuple({gm.out_spec, S::list({S::leaf()})});
  gm.output_specs.assign(gm.out_spec.num_leaves(), OutputSpec{});
  return gm;
}

// Attributes of each kind, each storable dtype, and every layout case of
// Note [Which strides are stored]; plus an undefined one and a tied pair.
inline GraphModule attribute_zoo_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* w = g.get_attr("param.w");
  Node* rm = g.get_attr("buffer.running_mean");
  Node* k = g.get_attr("_tensor_constant0");
  Node* y = g.call_function("aten::add.Tensor", {x, w});
  y = g.call_function("aten::add.Tensor", {y, rm});
  y = g.call_function("aten::mul.Tensor", {y, k});
  g.output({y});
  gm.set_flat_specs();

  at::manual_seed(7);
  gm.set_attribute("param.w", at::randn({2, 3}), AttributeKind::Parameter);
  gm.set_attribute("buffer.running_mean", at::randn({3}), AttributeKind::Buffer);
  gm.set_attribute("_tensor_constant0", at::randn({1}), AttributeKind::Constant);

  at::Tensor f = at::randn({3, 5});
  gm.set_attribute("dtypes.float32", f, AttributeKind::Buffer);
  gm.set_attribute("dtypes.float64", f.to(at::kDouble), AttributeKind::Buffer);
  gm.set_attribute("dtypes.float16", f.to(at::kHalf), AttributeKind::Buffer);
  gm.set_attribute("dtypes.bf16", f.to(at::kBFloat16), AttributeKind::Buffer);
  at::Tensor i = at::randint(-100, 100, {7});
  gm.set_attribute("dtypes.int64", i, AttributeKind::Buffer);
  gm.set_attribute("dtypes.int32", i.to(at::kInt), AttributeKind::Buffer);
  gm.set_attribute("dtypes.int16", i.to(at::kShort), AttributeKind::Buffer);
  gm.set_attribute("dtypes.int8", i.to(at::kChar), AttributeKind::Buffer);
  gm.set_attribute("dtypes.uint8", (i + 100).to(at::kByte), AttributeKind::Buffer);
  gm.set_attribute("dtypes.bool", i > 0, AttributeKind::Buffer);
  at::Tensor c = at::complex(f, f * 2);
  gm.set_attribute("dtypes.complex64", c, AttributeKind::Buffer);
  gm.set_attribute("dtypes.complex128", c.to(at::kComplexDouble), AttributeKind::Buffer);
  gm.set_attribute("dtypes.complex32", c.to(at::kComplexHalf), AttributeKind::Buffer);

  gm.set_attribute("layout.transposed", at::randn({3, 4}).t(), AttributeKind::Parameter);
  gm.set_attribute("layout.channels_last",
                   at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast),
                   AttributeKind::Parameter);
  gm.set_attribute("layout.expanded", at::randn({3, 1}).expand({3, 5}), AttributeKind::Buffer);
  gm.set_attribute("layout.sliced", at::randn({4, 6}).slice(1, 0, 6, 2), AttributeKind::Buffer);
  gm.set_attribute("layout.scalar", at::scalar_tensor(2.5), AttributeKind::Constant);
  gm.set_attribute("layout.empty", at::zeros({0, 3}), AttributeKind::Buffer);
  gm.set_attribute("layout.conj", at::conj(c), AttributeKind::Buffer);
  gm.set_attribute("undefined", at::Tensor(), AttributeKind::Buffer);
  at::Tensor shared = at::randn({4});
  gm.set_attribute("tied.a", shared, AttributeKind::Parameter);
  gm.set_attribute("tied.b", shared, AttributeKind::Parameter);
  return gm;
}

// Attribute names torch.nn accepts that are not Python identifiers (RegNet's
// "block1-0", keywords, quotes, backslashes, spaces, non-ASCII), each read by a
// get_attr and added to the input: forward(x) = x + the sum of all six.
inline const std::vector<std::string>& odd_attribute_names() {
  static const std::vector<std::string> names = {
      "trunk_output.block1.block1-0.proj.0.weight", "class.if", "import.None",
      "say \"hi\"\\.0", "with space.m\xc3\xb6" "dule", "lambda.def.return"};
  return names;
}

inline GraphModule odd_names_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* y = g.placeholder("x");
  at::manual_seed(3);
  for (const std::string& name : odd_attribute_names()) {
    y = g.call_function("aten::add.Tensor", {y, g.get_attr(name)});
    gm.set_attribute(name, at::randn({3}), name.rfind("class", 0) == 0 ? AttributeKind::Buffer
                                                                       : AttributeKind::Parameter);
  }
  g.output({y});
  gm.set_flat_specs();
  return gm;
}

// A call of a custom operator, `torchcap_fixture::scale(Tensor x, float s) ->
// Tensor` (x * s), which the program using this must register:
// forward(x) = scale(x, 2.5) + 1.
inline GraphModule custom_operator_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* scaled = g.call_function("torchcap_fixture::scale", {x, 2.5});
  g.output({g.call_function("aten::add.Scalar", {scaled, 1})});
  gm.set_flat_specs();
  return gm;
}

}  // namespace torchcap::testing
