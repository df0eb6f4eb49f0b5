#include "cli/cli_inputs.h"

#include <torchcap/error.h>

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>
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

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

at::Tensor random_tensor(const std::vector<int64_t>& shape, c10::ScalarType dtype) {
  if (dtype == c10::kBool) return at::randint(0, 2, shape, at::kLong).to(c10::kBool);
  if (c10::isIntegralType(dtype, /*includeBool=*/false)) return at::randint(0, 10, shape, at::TensorOptions().dtype(dtype));
  return at::randn(shape, at::TensorOptions().dtype(dtype));
}

}  // namespace

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

at::Tensor load_tensor_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read input file '" + path + "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue v;
  try {
    v = torch::jit::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw Error("input file '" + path + "' is not a tensor saved with torch.save: " +
                e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error("input file '" + path + "' is not a tensor saved with torch.save: " + e.what());
  }
  if (!v.isTensor()) {
    throw Error("input file '" + path + "' holds " + v.tagKind() + ", not a tensor");
  }
  return v.toTensor();
}

at::Tensor parse_input(const std::string& spec) {
  if (is_file(spec)) return load_tensor_file(spec);
  std::string shape_part = spec;
  c10::ScalarType dtype = c10::kFloat;
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
  return random_tensor(shape, dtype);
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

}  // namespace torchcap::cli
