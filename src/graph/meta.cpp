#include <torchcap/error.h>
#include <torchcap/meta.h>

#include <ATen/core/Tensor.h>

#include <sstream>

namespace torchcap {
namespace {

struct DtypeName {
  c10::ScalarType type;
  const char* name;
};

constexpr DtypeName kDtypeNames[] = {
    {c10::ScalarType::Float, "f32"},         {c10::ScalarType::Double, "f64"},
    {c10::ScalarType::Half, "f16"},          {c10::ScalarType::BFloat16, "bf16"},
    {c10::ScalarType::Long, "i64"},          {c10::ScalarType::Int, "i32"},
    {c10::ScalarType::Short, "i16"},         {c10::ScalarType::Char, "i8"},
    {c10::ScalarType::Byte, "u8"},           {c10::ScalarType::Bool, "b8"},
    {c10::ScalarType::ComplexHalf, "c32"},   {c10::ScalarType::ComplexFloat, "c64"},
    {c10::ScalarType::ComplexDouble, "c128"}, {c10::ScalarType::QInt8, "qi8"},
    {c10::ScalarType::QUInt8, "qu8"},        {c10::ScalarType::QInt32, "qi32"},
};

void append_sizes(std::ostringstream& os, c10::IntArrayRef v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}

}  // namespace

const char* dtype_short_name(c10::ScalarType t) {
  for (const auto& d : kDtypeNames) {
    if (d.type == t) return d.name;
  }
  return c10::toString(t);
}

TensorMeta TensorMeta::of(const at::Tensor& t) {
  if (t.layout() != c10::kStrided) {
    throw Error("a " + c10::str(t.layout()) + " tensor has no strides to record; torchcap records "
                "strided (dense) tensors only: convert it with to_dense()");
  }
  TensorMeta m;
  m.dtype = t.scalar_type();
  m.sizes.assign(t.sizes().begin(), t.sizes().end());
  m.strides.assign(t.strides().begin(), t.strides().end());
  m.device = t.device();
  return m;
}

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool TensorMeta::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

std::string TensorMeta::str() const {
  std::ostringstream os;
  os << dtype_short_name(dtype);
  if (symbolic != nullptr) {
    os << '[';
    for (size_t d = 0; d < symbolic->sizes.size(); ++d) os << (d ? ", " : "") << symbolic->sizes[d].str();
    os << ']';
  } else {
    append_sizes(os, sizes);
  }
  if (device.type() != c10::kCPU) os << '@' << device.str();
  return os.str();
}

std::string ValueMeta::str() const {
  switch (kind) {
    case ValueKind::Unknown:
      return "";
    case ValueKind::None:
      return "None";
    case ValueKind::Tensor:
      return tensors.empty() ? "" : tensors[0].str();
    case ValueKind::Tuple:
    case ValueKind::List: {
      std::string s(1, kind == ValueKind::Tuple ? '(' : '[');
      for (size_t i = 0; i < tensors.size(); ++i) s += (i ? ", " : "") + tensors[i].str();
      if (kind == ValueKind::Tuple && tensors.size() == 1) s += ',';
      s += kind == ValueKind::Tuple ? ')' : ']';
      return s;
    }
  }
  return "";
}

}  // namespace torchcap

namespace torchcap {

ModuleStack::ModuleStack(std::vector<ModuleFrame> frames)
    : frames_(frames.empty() ? nullptr
                             : std::make_shared<const std::vector<ModuleFrame>>(std::move(frames))) {}

const std::vector<ModuleFrame>& ModuleStack::frames() const {
  static const std::vector<ModuleFrame> kNone;
  return frames_ ? *frames_ : kNone;
}

std::string ModuleStack::innermost_str() const {
  if (empty()) return "";
  const ModuleFrame& f = frames_->back();
  size_t dot = f.type.rfind('.');
  std::string cls = dot == std::string::npos ? f.type : f.type.substr(dot + 1);
  std::string path = f.path.empty() ? "(root)" : f.path;
  return cls.empty() ? path : path + " (" + cls + ")";
}

}  // namespace torchcap
