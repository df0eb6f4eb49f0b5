#include "cli/cli_inputs.h"

#include <torchcap/error.h>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>
#include <sys/stat.h>

namespace torchcap::cli {
namespace {

struct DtypeName {
  const char* name;
  c10::ScalarType type;
};

constexpr DtypeName kDtypes[] = {
    {"float32", c10::kFloat},   {"float", c10::kFloat},       {"f32", c10::kFloat},
    {"float64", c10::kDouble},  {"double", c10::kDouble},     {"f64", c10::kDouble},
    {"float16", c10::kHalf},    {"half", c10::kHalf},         {"f16", c10::kHalf},
    {"bfloat16", c10::kBFloat16}, {"bf16", c10::kBFloat16},   {"int64", c10::kLong},
    {"long", c10::kLong},       {"i64", c10::kLong},          {"int32", c10::kInt},
    {"int", c10::kInt},         {"i32", c10::kInt},           {"int16", c10::kShort},
    {"i16", c10::kShort},       {"int8", c10::kChar},         {"i8", c10::kChar},
    {"uint8", c10::kByte},      {"u8", c10::kByte},           {"bool", c10::kBool},
    {"b8", c10::kBool},
};

at::Tensor random_tensor(c10::IntArrayRef shape, c10::ScalarType dtype) {
  if (dtype == c10::kBool) return at::randint(0, 2, shape, at::kLong).to(c10::kBool);
  if (c10::isIntegralType(dtype, /*includeBool=*/false)) return at::randint(0, 10, shape, at::TensorOptions().dtype(dtype));
  return at::randn(shape, at::TensorOptions().dtype(dtype));
}

}  // namespace

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

c10::ScalarType parse_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  throw Error("unknown dtype '" + name + "' (expected e.g. float32, float64, int64, int32, bool)");
}

std::string dtype_name(c10::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  return c10::toString(t);
}

// "a dict", "a list", "an int", ... for messages.
std::string kind_of(const c10::IValue& v) {
  if (v.isGenericDict()) return "a dict";
  if (v.isList()) return "a list";
  if (v.isTuple()) return "a tuple";
  if (v.isInt()) return "an int";
  if (v.isDouble()) return "a float";
  if (v.isBool()) return "a bool";
  if (v.isString()) return "a string";
  if (v.isNone()) return "None";
  if (v.isTensor()) return "a tensor";
  return "a " + v.tagKind();
}

c10::IValue load_value_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("input file '" + path + "': cannot read it");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // torch.save writes a zip archive (PK\3\4); older pickles, and files of
  // anything else, are refused before LibTorch's reader sees them.
  if (bytes.size() < 4 || bytes[0] != 'P' || bytes[1] != 'K' || bytes[2] != 3 || bytes[3] != 4) {
    throw Error("input file '" + path + "' is not a file written by torch.save (a zip archive)");
  }
  try {
    return torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    // LibTorch's reasons here are about pickle opcodes, or an internal assert
    // for a state dict; what matters is what the file holds.
    if (holds_ordered_dict(path)) {
      throw Error("input file '" + path + "' holds a dict (an OrderedDict, such as a state dict), "
                  "not a tensor");
    }
    throw Error("input file '" + path + "' holds Python objects LibTorch cannot read: give a "
                "tensor, or a list, tuple or dict (of two or more entries) of tensors and numbers, "
                "saved by torch.save");
  }
}

bool holds_ordered_dict(const std::string& path) {
  // torch.save pickles an OrderedDict as a call of collections.OrderedDict,
  // the first opcode after the protocol header. The name appears further in
  // in every pickled tensor too (its backward hooks), so only the start counts.
  const std::string global = "collections\nOrderedDict";
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    for (const std::string& record : reader.getAllRecords()) {
      const bool data = record == "data.pkl" ||
                        (record.size() > 9 && record.compare(record.size() - 9, 9, "/data.pkl") == 0);
      if (!data) continue;
      auto [bytes, size] = reader.getRecord(record);
      std::string head(static_cast<const char*>(bytes.get()), std::min<size_t>(size, 64));
      size_t at = head.find(global);
      return at != std::string::npos && at < 8;
    }
  } catch (const c10::Error&) {
  }
  return false;
}

at::Tensor load_tensor_file(const std::string& path) {
  c10::IValue v = load_value_file(path);
  if (!v.isTensor()) {
    throw Error("input file '" + path + "' holds " + kind_of(v) + ", not a tensor");
  }
  return v.toTensor();
}

at::Tensor parse_input(const std::string& spec, bool shapes_only, c10::ScalarType dtype) {
  if (is_file(spec)) return load_tensor_file(spec);
  struct stat st;
  if (::stat(spec.c_str(), &st) == 0) {
    throw Error("--input '" + spec + "' is a directory, not a file holding a tensor");
  }
  auto ends_with = [&](const char* suffix) {
    size_t n = std::strlen(suffix);
    return spec.size() >= n && spec.compare(spec.size() - n, n, suffix) == 0;
  };
  if (spec.find('/') != std::string::npos || ends_with(".pt") || ends_with(".pth")) {
    throw Error("--input '" + spec + "': no such file");
  }
  std::string shape_part = spec;
  size_t colon = spec.rfind(':');
  if (colon != std::string::npos) {
    shape_part = spec.substr(0, colon);
    dtype = parse_dtype(spec.substr(colon + 1));
  }
  std::vector<int64_t> shape;
  auto bad = [&]() -> Error {
    return Error("--input '" + spec +
                 "' is neither a shape such as 1x3x224x224[:float32] nor a readable file");
  };
  if (shape_part != "scalar") {
    size_t start = 0;
    while (true) {
      size_t x = shape_part.find('x', start);
      std::string dim = shape_part.substr(start, x == std::string::npos ? std::string::npos : x - start);
      if (dim.empty() || dim.size() > 12 || dim.find_first_not_of("0123456789") != std::string::npos) {
        throw bad();
      }
      shape.push_back(std::stoll(dim));
      if (x == std::string::npos) break;
      start = x + 1;
    }
  }
  if (shapes_only) return at::empty(shape, at::TensorOptions().dtype(dtype).device(c10::kMeta));
  return random_tensor(shape, dtype);
}

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::optional<int64_t> parse_int(const std::string& s) {
  std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& s) {
  std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(t.c_str(), &end);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const std::string& s) {
  std::string t = trim(s);
  if (t == "true" || t == "True" || t == "1") return true;
  if (t == "false" || t == "False" || t == "0") return false;
  return std::nullopt;
}

// "[1, 2]" or "1,2" -> {"1", "2"}; "[]" -> {}.
std::vector<std::string> list_items(const std::string& spec) {
  std::string t = trim(spec);
  if (t.size() >= 2 && t.front() == '[' && t.back() == ']') t = t.substr(1, t.size() - 2);
  std::vector<std::string> items;
  if (trim(t).empty()) return items;
  size_t start = 0;
  while (true) {
    size_t comma = t.find(',', start);
    items.push_back(t.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

bool is_none_spec(const std::string& spec) {
  std::string t = trim(spec);
  return t == "none" || t == "None";
}

c10::IValue parse_as(const std::string& spec, const c10::TypePtr& type, bool shapes_only,
                     const std::function<Error(const std::string&)>& bad) {
  if (auto opt = type->cast<c10::OptionalType>()) {
    if (is_none_spec(spec)) return c10::IValue();
    return parse_as(spec, opt->getElementType(), shapes_only, bad);
  }
  if (is_none_spec(spec)) {
    if (type->kind() == c10::NoneType::Kind) return c10::IValue();
    throw bad("None is not allowed here (the parameter is not Optional)");
  }
  switch (type->kind()) {
    case c10::TensorType::Kind:
      return parse_input(spec, shapes_only);
    case c10::IntType::Kind:
      if (auto v = parse_int(spec)) return *v;
      throw bad("expected an integer such as 3");
    case c10::FloatType::Kind:
      if (auto v = parse_float(spec)) return *v;
      throw bad("expected a number such as 0.5");
    case c10::NumberType::Kind:
      if (auto v = parse_int(spec)) return *v;
      if (auto v = parse_float(spec)) return *v;
      throw bad("expected a number such as 3 or 0.5");
    case c10::BoolType::Kind:
      if (auto v = parse_bool(spec)) return *v;
      throw bad("expected true or false");
    case c10::StringType::Kind:
      return spec;
    default:
      break;
  }
  if (auto list = type->cast<c10::ListType>()) {
    c10::TypePtr element = list->getElementType();
    auto kind = element->kind();
    if (kind == c10::IntType::Kind || kind == c10::FloatType::Kind || kind == c10::BoolType::Kind) {
      c10::impl::GenericList out(element);
      for (const std::string& item : list_items(spec)) {
        out.push_back(parse_as(item, element, shapes_only, [&](const std::string& why) {
          return bad("list element '" + trim(item) + "': " + why);
        }));
      }
      return out;
    }
  }
  if (!is_file(spec)) {
    throw bad("give a file written by torch.save holding a " + type->annotation_str());
  }
  c10::IValue v = load_value_file(spec);
  // Unpickled lists are lists of anything; a list of tensors is what a
  // List[Tensor] parameter (detection models' images) takes.
  if (auto list = type->cast<c10::ListType>(); list && v.isList() &&
      list->getElementType()->kind() == c10::TensorType::Kind) {
    c10::List<at::Tensor> tensors;
    for (const c10::IValue& item : v.toListRef()) {
      if (!item.isTensor()) throw bad("the file holds a list with " + kind_of(item) + " in it, not only tensors");
      tensors.push_back(item.toTensor());
    }
    return tensors;
  }
  if (!v.type()->isSubtypeOf(*type)) {
    throw bad("the file holds " + kind_of(v) + " of type " + v.type()->annotation_str() +
              ", not " + type->annotation_str());
  }
  return v;
}

}  // namespace

std::string describe_parameter(const c10::Argument& parameter) {
  std::string out = parameter.name() + ": " + parameter.type()->annotation_str();
  if (parameter.default_value()) {
    std::ostringstream os;
    os << *parameter.default_value();
    out += " = " + os.str();
  }
  return out;
}

c10::IValue parse_argument(const std::string& spec, const c10::Argument& parameter,
                           bool shapes_only) {
  // Tensor specs and files report their own errors, which name the --input.
  auto bad = [&](const std::string& why) {
    return Error("--input '" + spec + "' for parameter '" + describe_parameter(parameter) + "': " + why);
  };
  return parse_as(spec, parameter.type(), shapes_only, bad);
}

DynamicDim parse_dynamic(const std::string& spec) {
  auto fail = [&spec](const std::string& why) -> DynamicDim {
    throw Error("--dynamic '" + spec + "': " + why +
                "; expected INPUT:DIM[=NAME][[MIN:MAX]], e.g. 0:0=batch[1:64]");
  };
  auto integer = [&](const std::string& text, const char* what) -> int64_t {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (text.empty() || used != text.size()) fail(std::string(what) + " '" + text + "' is not an integer");
    return v;
  };
  DynamicDim d;
  std::string rest = spec;
  std::string range;
  if (size_t open = rest.find('['); open != std::string::npos) {
    if (rest.back() != ']') fail("the range must end with ]");
    range = rest.substr(open + 1, rest.size() - open - 2);
    rest = rest.substr(0, open);
  }
  if (size_t eq = rest.find('='); eq != std::string::npos) {
    d.name = rest.substr(eq + 1);
    rest = rest.substr(0, eq);
    bool identifier = !d.name.empty() && !std::isdigit(static_cast<unsigned char>(d.name[0]));
    for (char c : d.name) identifier = identifier && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!identifier) fail("the name '" + d.name + "' is not an identifier");
  }
  size_t colon = rest.find(':');
  if (colon == std::string::npos) fail("no INPUT:DIM");
  int64_t input = integer(rest.substr(0, colon), "the input");
  if (input < 0) fail("the input is a number from 0");
  d.input = static_cast<size_t>(input);
  d.dim = integer(rest.substr(colon + 1), "the dimension");
  if (!range.empty()) {
    size_t sep = range.find(':');
    if (sep == std::string::npos) fail("the range is [MIN:MAX] or [MIN:]");
    d.min = integer(range.substr(0, sep), "the minimum");
    std::string max = range.substr(sep + 1);
    if (!max.empty()) d.max = integer(max, "the maximum");
  }
  return d;
}

std::vector<at::Tensor> random_inputs_for(const GraphModule& gm) {
  std::vector<at::Tensor> out;
  for (const Node* n : gm.graph()) {
    if (n->op() != OpCode::Placeholder) continue;
    const ValueMeta& v = n->meta().val;
    if (v.kind != ValueKind::Tensor || v.tensors.empty()) {
      throw Error("input %" + n->name() + " has no recorded shape; give it with --input");
    }
    out.push_back(random_tensor(v.tensors[0].sizes, v.tensors[0].dtype));
  }
  return out;
}

namespace {

// The placeholders' recorded dtype, or float32.
c10::ScalarType dtype_of(const Node* placeholder) {
  const ValueMeta& v = placeholder->meta().val;
  return v.kind == ValueKind::Tensor && !v.tensors.empty() ? v.tensors[0].dtype : c10::kFloat;
}

// NAME when `spec` is NAME=VALUE with NAME an identifier, else "".
std::string name_in(const std::string& spec) {
  size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) return "";
  std::string name = spec.substr(0, eq);
  bool identifier = !(name[0] >= '0' && name[0] <= '9') &&
                    std::all_of(name.begin(), name.end(), [](char c) { return c == '_' || std::isalnum(static_cast<unsigned char>(c)); });
  return identifier ? name : "";
}

}  // namespace

std::vector<at::Tensor> run_inputs_for(const GraphModule& gm, const std::vector<std::string>& specs) {
  const std::vector<Node*> placeholders = gm.graph().placeholders();
  // Each argument's placeholders: a range of leaves of in_spec.
  struct Range {
    std::string name, what;
    size_t first, count;
    const TreeSpec* spec;
  };
  std::vector<Range> arguments;
  if (gm.in_spec.kind() == TreeSpec::Kind::Tuple) {
    const auto& top = gm.in_spec.children();
    size_t positional = top.size() - (gm.call.keywords ? 1 : 0), leaf = 0;
    for (size_t i = 0; i < positional; ++i) {
      if (i < gm.call.names.size()) arguments.push_back({gm.call.names[i], "argument", leaf, top[i].num_leaves(), &top[i]});
      leaf += top[i].num_leaves();
    }
    if (gm.call.keywords) {
      const TreeSpec& dict = top.back();
      for (size_t k = 0; k < dict.children().size(); ++k) {
        arguments.push_back({dict.keys()[k].toStringRef(), "keyword argument", leaf, dict.children()[k].num_leaves(),
                             &dict.children()[k]});
        leaf += dict.children()[k].num_leaves();
      }
    }
  }
  std::vector<at::Tensor> out(placeholders.size());
  std::vector<std::string> given_as(placeholders.size());
  auto known_names = [&] {
    std::string list;
    for (const Node* p : placeholders) list += (list.empty() ? "" : ", ") + p->name();
    for (const Range& a : arguments) {
      bool same = a.count == 1 && placeholders[a.first]->name() == a.name;
      if (!same) list += ", " + a.name;
    }
    return list.empty() ? std::string("none") : list;
  };
  auto set = [&](size_t i, at::Tensor t, const std::string& how) {
    if (!given_as[i].empty()) {
      throw Error("input " + std::to_string(i) + " (" + placeholders[i]->name() + ") is given twice: as " +
                  given_as[i] + " and as " + how);
    }
    out[i] = std::move(t);
    given_as[i] = how;
  };
  size_t next = 0;
  for (const std::string& spec : specs) {
    std::string name = name_in(spec);
    const Node* by_name = nullptr;
    const Range* argument = nullptr;
    if (!name.empty()) {
      for (const Node* p : placeholders) by_name = p->name() == name ? p : by_name;
      for (const Range& a : arguments) argument = a.name == name ? &a : argument;
      if (by_name == nullptr && argument == nullptr) {
        // A path holding '=' is a file, not a name.
        if (!std::ifstream(spec).good()) {
          throw Error("--input " + spec + ": the graph has no input or argument '" + name +
                      "' (it has " + known_names() + ")");
        }
        name.clear();
      }
    }
    if (name.empty()) {
      while (next < out.size() && !given_as[next].empty()) ++next;
      if (next == out.size()) {
        throw Error("--input " + spec + ": the graph takes " + std::to_string(out.size()) + " input(s) (" +
                    known_names() + "), all given already");
      }
      set(next, parse_input(spec, false, dtype_of(placeholders[next])), "--input " + spec);
      continue;
    }
    const std::string value = spec.substr(name.size() + 1);
    if (by_name != nullptr) {
      size_t i = std::find(placeholders.begin(), placeholders.end(), by_name) - placeholders.begin();
      set(i, parse_input(value, false, dtype_of(by_name)), "--input " + spec);
      continue;
    }
    if (argument->count == 1 && argument->spec->kind() == TreeSpec::Kind::Leaf) {
      set(argument->first, parse_input(value, false, dtype_of(placeholders[argument->first])), "--input " + spec);
      continue;
    }
    // A structure: a torch.save'd file of it, flattened as the argument is.
    std::vector<c10::IValue> leaves = argument->spec->flatten_like(load_value_file(value), name);
    for (size_t k = 0; k < leaves.size(); ++k) {
      set(argument->first + k, leaves[k].toTensor(), "--input " + spec);
    }
  }
  std::string missing;
  for (size_t i = 0; i < out.size(); ++i) {
    if (given_as[i].empty()) missing += (missing.empty() ? "" : ", ") + placeholders[i]->name();
  }
  if (!missing.empty()) {
    throw Error("the graph takes " + std::to_string(out.size()) + " input(s); no --input gives " + missing +
                " (give them in order, or by name as NAME=VALUE)");
  }
  return out;
}

}  // namespace torchcap::cli
