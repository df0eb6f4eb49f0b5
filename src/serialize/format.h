// The constants and tables of the `.tcg` format, shared by the writer and the
// reader. docs/FORMAT.md is the specification; this file must agree with it.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/serialize.h>

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace torchcap::format {

// PNG's trick: a high byte first (catches 7-bit transfers), then CR LF, ^Z and
// LF (catch newline translation and `type` on DOS). The letters say what it is.
inline constexpr char kMagic[8] = {'\x89', 'T', 'C', 'G', '\r', '\n', '\x1a', '\n'};

// The header of version 1.0: the fields every version has.
inline constexpr uint64_t kBaseHeaderSize = 64;
// Version 1.1 adds two checksums after them; this build writes that header.
inline constexpr uint64_t kHeaderSize = 72;
// Every tensor starts at a multiple of this, counted from the start of the
// file (so also from the start of a page-aligned mapping): enough for any
// vector instruction LibTorch's kernels use.
inline constexpr uint64_t kAlignment = 64;

// Limits the reader enforces; the writer refuses to produce a file beyond them.
// JSON nesting: the deepest legitimate value is an argument list nested in a
// node (depth 5 plus the list nesting) or a tree spec (two levels per spec
// level); 64 leaves plenty for both and keeps every recursive walk shallow.
inline constexpr int kMaxJsonDepth = 64;
// The JSON section may not exceed this, whatever the header says: the parsed
// document takes several times the text's size in memory.
inline constexpr uint64_t kMaxJsonSize = uint64_t{1} << 30;
inline constexpr size_t kMaxTensorDims = 64;

// The fixed header, all integers little-endian:
//   0  magic[8]
//   8  u16 major version      10  u16 minor version
//  12  u32 header size (72; 64 in 1.0)
//  16  u64 file size
//  24  u64 JSON offset        32  u64 JSON size
//  40  u64 data offset        48  u64 data size
//  56  u32 alignment (64)     60  u32 flags (0)
// from version 1.1:
//  64  u32 CRC-32 of the JSON section
//  68  u32 CRC-32 of the header without these 4 bytes
struct Header {
  uint16_t major = kFormatMajorVersion;
  uint16_t minor = kFormatMinorVersion;
  uint32_t header_size = kHeaderSize;
  uint64_t file_size = 0;
  uint64_t json_offset = kHeaderSize;
  uint64_t json_size = 0;
  uint64_t data_offset = 0;
  uint64_t data_size = 0;
  uint32_t alignment = kAlignment;
  uint32_t flags = 0;
  uint32_t json_crc = 0;
  uint32_t header_crc = 0;
};

namespace field {
inline constexpr uint64_t kMagic = 0, kMajor = 8, kMinor = 10, kHeaderSize = 12, kFileSize = 16,
                          kJsonOffset = 24, kJsonSize = 32, kDataOffset = 40, kDataSize = 48,
                          kAlignment = 56, kFlags = 60, kJsonCrc = 64, kHeaderCrc = 68;
}

// Note [Keys by version]: each JSON object of the format has a fixed set of
// keys, and each key the minor version that added it. A reader refuses, in a
// file of a version it knows, any key that version does not have; in a file of
// a newer minor version it skips unknown keys. Writer and reader (and, through
// `torchcap_format_tables`, the Python loader) use these tables.
struct Key {
  const char* name;
  uint16_t since;  // the minor version that added the key
};
using Keys = std::initializer_list<Key>;

namespace keys {
inline constexpr Keys kDocument = {{"module_stacks", 2}, {"nodes", 0},    {"attributes", 0},
                                   {"tensors", 0},       {"in_spec", 0},  {"out_spec", 0},
                                   {"signature", 0},     {"symbols", 4},   {"call", 5}};
inline constexpr Keys kNode = {{"name", 0}, {"op", 0},     {"target", 0},
                               {"args", 0}, {"kwargs", 0}, {"meta", 0}};
inline constexpr Keys kMeta = {{"val", 0}, {"stack_trace", 0}, {"module_stack", 2}};
inline constexpr Keys kValue = {{"kind", 0}, {"tensors", 0}};
inline constexpr Keys kTensorMeta = {{"dtype", 0},          {"sizes", 0},           {"strides", 0},
                                     {"device", 0},         {"symbolic_sizes", 4}, {"symbolic_strides", 4}};
inline constexpr Keys kSymbol = {{"label", 4}, {"min", 4}, {"max", 4}, {"dims", 4}};
inline constexpr Keys kFrame = {{"file", 0}, {"line", 0}, {"function", 0}, {"code", 2}};
inline constexpr Keys kModuleFrame = {{"path", 2}, {"type", 2}};
inline constexpr Keys kTensor = {{"name", 0},   {"dtype", 0},  {"sizes", 0}, {"strides", 0},
                                 {"offset", 0}, {"length", 0}, {"crc32", 1}, {"weightless", 3}};
inline constexpr Keys kAttribute = {{"name", 0}, {"kind", 0}, {"tensor", 0}};
inline constexpr Keys kSignature = {{"outputs", 0}};
inline constexpr Keys kOutput = {{"kind", 0}, {"target", 0}};
inline constexpr Keys kCall = {{"names", 5}, {"keywords", 5}};
// Tree specs: the keys depend on the kind.
inline constexpr Keys kLeafSpec = {{"kind", 0}};
inline constexpr Keys kConstantSpec = {{"kind", 0}, {"value", 0}};
inline constexpr Keys kSequenceSpec = {{"kind", 0}, {"children", 0}};
inline constexpr Keys kDictSpec = {{"kind", 0}, {"keys", 0}, {"children", 0}};

// Every table above by the name the Python loader knows it by.
inline constexpr std::pair<const char*, Keys> kAll[] = {
    {"document", kDocument},     {"node", kNode},
    {"meta", kMeta},             {"value", kValue},
    {"tensor_meta", kTensorMeta}, {"frame", kFrame},
    {"module_frame", kModuleFrame}, {"tensor", kTensor},
    {"attribute", kAttribute},   {"signature", kSignature},
    {"output", kOutput},         {"leaf_spec", kLeafSpec},
    {"constant_spec", kConstantSpec}, {"sequence_spec", kSequenceSpec},
    {"dict_spec", kDictSpec},    {"symbol", kSymbol},
    {"call", kCall}};
}  // namespace keys

// Whether `name` is one of `keys` in a file of version 1.`minor`.
inline bool has_key(const Keys& keys, std::string_view name, uint16_t minor) {
  for (const Key& k : keys) {
    if (name == k.name) return k.since <= minor;
  }
  return false;
}

// The minor version that added key `name` to `keys`, or -1 if none did.
inline int key_since(const Keys& keys, std::string_view name) {
  for (const Key& k : keys) {
    if (name == k.name) return k.since;
  }
  return -1;
}

// Note [Weightless tensors]: from version 1.3 a tensor table entry may be
// weightless, `"weightless": true` in place of `offset`, `length` and
// `crc32`: the file records the tensor's dtype, sizes and strides but not its
// values (a model saved from the meta device). Such a tensor loads as a meta
// tensor and is bound to real values when loading (LoadOptions::weights). The
// writer writes version 1.3 only for files that have one, and 1.2 otherwise,
// so that readers of 1.2 still read every other file it writes.
inline constexpr uint16_t kWeightlessSince = 3;
// Note [Dynamic graphs in files]: from version 1.4 a file may hold a dynamic
// graph (symbolic.h): the top-level `symbols`, tensor metadata with
// `symbolic_sizes` and `symbolic_strides` (SizeExpr::str() of each), and
// call_function nodes whose target is a size computation (kSizeTargets).
// The writer writes 1.4 only for dynamic graphs.
inline constexpr uint16_t kDynamicSince = 4;
// From version 1.5 the top-level `call` holds the calling convention
// (call_convention.h): the positional arguments' names and whether the last
// element of in_spec is a dict of keyword arguments. The writer writes 1.5
// only for modules that know it (traced from Python or TorchScript).
inline constexpr uint16_t kCallSince = 5;
// Note [Numbers for tensors in files]: from version 1.6 an operator's Tensor
// parameter may be given a number, a Python number in tensor arithmetic that
// the kernel gets as a wrapped number (Note [Python numbers as tensors] in
// graph/ivalue_conversion.cpp). Earlier versions held it as a tensor
// constant without its flag, which computed in float64 where eager computes
// in float32. The writer writes 1.6 only for graphs that have one; a reader
// refuses one in a file of an earlier version, which no writer made.
inline constexpr uint16_t kNumbersForTensorsSince = 6;
// The oldest version the writer writes: checksums and module stacks.
inline constexpr uint16_t kOldestWrittenMinor = 2;

// Files of version 1.1 and later carry checksums: the header's, the JSON
// section's, and one per tensor in the tensor table.
inline bool has_checksums(uint16_t minor) { return minor >= 1; }
// The header size version 1.`minor` defines.
inline uint64_t header_size_of(uint16_t minor) {
  return has_checksums(minor) ? kHeaderSize : kBaseHeaderSize;
}

// CRC-32 (ISO-HDLC, as zlib and Python's zlib.crc32 compute it) of `size`
// bytes, continuing from `crc` (0 to start).
uint32_t crc32(const void* data, uint64_t size, uint32_t crc = 0);
// The header's checksum: the CRC-32 of its `header_size` bytes without the
// four that hold it, [kHeaderCrc, kHeaderCrc + 4). `header` must hold them.
uint32_t header_crc(const unsigned char* header, uint64_t header_size);

// `out` receives h.header_size bytes (kBaseHeaderSize or kHeaderSize); from
// version 1.1 with the header checksum computed and h.header_crc ignored.
void encode_header(const Header& h, char* out);
// Reads the fields of the first `available` bytes of `in` (at least
// kBaseHeaderSize); the checksums only if the header reaches them. Checks
// nothing.
Header decode_header(const unsigned char* in, uint64_t available);

// A header read from a file and checked, or the first problem with it: the
// byte of the field that is wrong and what is wrong with it.
struct CheckedHeader {
  Header header;
  uint64_t problem_at = 0;
  std::string problem;  // empty if the header is sound
};
// Reads and checks the header of the `size` bytes of `file` (Note [Reading
// hostile files] in reader.cpp): the magic, the version, the header's size
// and, if `verify_checksum` and the version has one, its CRC-32; then every
// offset and size against the file's real size, with overflow-safe
// arithmetic. A newer minor version may have a larger header and flags this
// reader does not know; they are skipped.
CheckedHeader check_header(const unsigned char* file, uint64_t size, bool verify_checksum);
// Whether a file of version 1.`minor` may hold only keys, flags and header
// fields this build knows (Note [Keys by version]).
inline bool is_known_minor(uint16_t minor) { return minor <= kFormatMinorVersion; }

// Hex digits of `v`, at least `width` of them (8 for a checksum, as
// checksums are usually written).
std::string hex_digits(uint32_t v, int width = 0);

inline uint64_t align_up(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// Note [Wire tokens]: every word the format spells in a file has one entry in
// one of these tables, which the writer, the reader and (generated by the
// `format_tables` tool into python/torchcap/_format_tables.py) the Python
// loader use. They are the format's own tables, not the printer's or the
// graph's: names in files must never change.
template <typename T>
struct Token {
  T value;
  const char* name;
};

// The name of `value` in `table`, or nullptr.
template <typename T, size_t N>
const char* token_name(const Token<T> (&table)[N], T value) {
  for (const Token<T>& t : table) {
    if (t.value == value) return t.name;
  }
  return nullptr;
}

// The value named `name` in `table`, or nullopt.
template <typename T, size_t N>
std::optional<T> token_value(const Token<T> (&table)[N], std::string_view name) {
  for (const Token<T>& t : table) {
    if (name == t.name) return t.value;
  }
  return std::nullopt;
}

// Dtypes: torch's Python names (torch.float32), so the Python loader can
// getattr them. Storable ones can be tensors in the data section: fixed-size
// elements with no side information (quantized tensors would need scales).
struct DtypeToken {
  c10::ScalarType value;
  const char* name;
  bool storable;
};
inline constexpr DtypeToken kDtypes[] = {
    {c10::ScalarType::Byte, "uint8", true},
    {c10::ScalarType::Char, "int8", true},
    {c10::ScalarType::Short, "int16", true},
    {c10::ScalarType::Int, "int32", true},
    {c10::ScalarType::Long, "int64", true},
    {c10::ScalarType::Half, "float16", true},
    {c10::ScalarType::Float, "float32", true},
    {c10::ScalarType::Double, "float64", true},
    {c10::ScalarType::ComplexHalf, "complex32", true},
    {c10::ScalarType::ComplexFloat, "complex64", true},
    {c10::ScalarType::ComplexDouble, "complex128", true},
    {c10::ScalarType::Bool, "bool", true},
    {c10::ScalarType::BFloat16, "bfloat16", true},
    {c10::ScalarType::QInt8, "qint8", false},
    {c10::ScalarType::QUInt8, "quint8", false},
    {c10::ScalarType::QInt32, "qint32", false},
    {c10::ScalarType::QUInt4x2, "quint4x2", false},
    {c10::ScalarType::QUInt2x4, "quint2x4", false},
};
const char* dtype_name(c10::ScalarType t);  // nullptr if the format has none
std::optional<c10::ScalarType> dtype_from_name(std::string_view name);
bool is_storable_dtype(c10::ScalarType t);

// Layouts and memory formats: torch's Python names (torch.strided, torch.channels_last).
inline constexpr Token<c10::Layout> kLayouts[] = {
    {c10::Layout::Strided, "strided"},      {c10::Layout::Sparse, "sparse_coo"},
    {c10::Layout::SparseCsr, "sparse_csr"}, {c10::Layout::SparseCsc, "sparse_csc"},
    {c10::Layout::SparseBsr, "sparse_bsr"}, {c10::Layout::SparseBsc, "sparse_bsc"},
    {c10::Layout::Mkldnn, "_mkldnn"},
};
inline constexpr Token<c10::MemoryFormat> kMemoryFormats[] = {
    {c10::MemoryFormat::Contiguous, "contiguous_format"},
    {c10::MemoryFormat::Preserve, "preserve_format"},
    {c10::MemoryFormat::ChannelsLast, "channels_last"},
    {c10::MemoryFormat::ChannelsLast3d, "channels_last_3d"},
};
// A node's `op`.
inline constexpr Token<OpCode> kOpcodes[] = {
    {OpCode::Placeholder, "placeholder"},
    {OpCode::GetAttr, "get_attr"},
    {OpCode::CallFunction, "call_function"},
    {OpCode::Output, "output"},
};
// An attribute's `kind`.
inline constexpr Token<AttributeKind> kAttributeKinds[] = {
    {AttributeKind::Parameter, "parameter"},
    {AttributeKind::Buffer, "buffer"},
    {AttributeKind::Constant, "constant"},
};
// The `kind` of a signature's output.
inline constexpr Token<OutputKind> kOutputKinds[] = {
    {OutputKind::User, "user"},
    {OutputKind::BufferMutation, "buffer_mutation"},
    {OutputKind::InputMutation, "input_mutation"},
};
// The `kind` of `meta.val`; ValueKind::Unknown is written as no `val`.
inline constexpr Token<ValueKind> kValueKinds[] = {
    {ValueKind::Tensor, "tensor"},
    {ValueKind::Tuple, "tuple"},
    {ValueKind::List, "list"},
    {ValueKind::None, "none"},
};
// How many tensors a value of each kind has; -1: any number.
inline int value_kind_tensors(ValueKind k) {
  return k == ValueKind::Tensor ? 1 : k == ValueKind::None ? 0 : -1;
}
// Arguments that JSON has no type for are objects of one key, the tag:
// {"node": "add"}, {"float": "inf"}, {"dtype": "float32"}, ...
enum class ArgumentTag : uint8_t { Node, Float, Dtype, Device, Layout, MemoryFormat };
inline constexpr Token<ArgumentTag> kArgumentTags[] = {
    {ArgumentTag::Node, "node"},     {ArgumentTag::Float, "float"},
    {ArgumentTag::Dtype, "dtype"},   {ArgumentTag::Device, "device"},
    {ArgumentTag::Layout, "layout"}, {ArgumentTag::MemoryFormat, "memory_format"},
};
inline const char* tag(ArgumentTag t) { return token_name(kArgumentTags, t); }
// The `kind` of a tree spec.
inline constexpr Token<TreeSpec::Kind> kSpecKinds[] = {
    {TreeSpec::Kind::Leaf, "leaf"},         {TreeSpec::Kind::None, "none"},
    {TreeSpec::Kind::Constant, "constant"}, {TreeSpec::Kind::Tuple, "tuple"},
    {TreeSpec::Kind::List, "list"},         {TreeSpec::Kind::Dict, "dict"},
};
// The keys each spec kind has (Note [Keys by version]).
const Keys& spec_keys(TreeSpec::Kind k);
// The target of a call that reads one output of a node with several, and
// the output node's target.
inline constexpr const char* kGetItemTarget = "getitem";
inline constexpr const char* kOutputTarget = "output";
// The targets of size computations (Note [Dynamic graphs in files]), as
// node.h names them.
inline constexpr const char* kSizeTargets[] = {"sym_size", "add", "sub", "mul", "floordiv"};
inline bool is_size_target_token(std::string_view t) {
  for (const char* s : kSizeTargets) {
    if (t == s) return true;
  }
  return false;
}

// Doubles that JSON numbers cannot hold (infinities and NaNs) are written as
// strings: "inf", "-inf", "nan" (the quiet NaN 0x7ff8000000000000), or, for
// any other NaN, "0x" and the 16 hex digits of its bits.
std::string nonfinite_double_string(double d);
std::optional<double> nonfinite_double_from_string(std::string_view s);

}  // namespace torchcap::format
