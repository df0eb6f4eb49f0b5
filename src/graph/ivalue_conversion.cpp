#include "graph/ivalue_conversion.h"

#include <torchcap/error.h>

#include <c10/util/Exception.h>

namespace torchcap {
namespace detail {

const c10::Type& unwrap_optional(const c10::Type& t) {
  if (t.kind() == c10::TypeKind::OptionalType) {
    return *t.expectRef<c10::OptionalType>().getElementType();
  }
  return t;
}

c10::IValue constant_ivalue(const Argument& a, const c10::Type& declared) {
  const c10::Type& type = unwrap_optional(declared);
  using K = c10::TypeKind;
  if (a.is_none()) return c10::IValue();
  if (a.is_int()) {
    if (type.kind() == K::FloatType) return c10::IValue(static_cast<double>(a.to_int()));
    return c10::IValue(a.to_int());
  }
  if (a.is_double()) return c10::IValue(a.to_double());
  if (a.is_bool()) return c10::IValue(a.to_bool());
  if (a.is_string()) return c10::IValue(a.to_string());
  if (a.is_scalar_type()) return c10::IValue(a.to_scalar_type());
  if (a.is_layout()) return c10::IValue(a.to_layout());
  if (a.is_memory_format()) return c10::IValue(a.to_memory_format());
  if (a.is_device()) return c10::IValue(a.to_device());
  if (a.is_list()) {
    const c10::Type* elem = type.kind() == K::ListType
                                ? type.expectRef<c10::ListType>().getElementType().get()
                                : nullptr;
    K ek = elem != nullptr ? unwrap_optional(*elem).kind() : K::AnyType;
    const ArgumentList& l = a.to_list();
    if (ek == K::IntType || ek == K::SymIntType) {
      c10::List<int64_t> out;
      for (const Argument& e : l) out.push_back(e.to_int());
      return out;
    }
    if (ek == K::FloatType) {
      c10::List<double> out;
      for (const Argument& e : l) out.push_back(e.is_int() ? double(e.to_int()) : e.to_double());
      return out;
    }
    if (ek == K::BoolType) {
      c10::List<bool> out;
      for (const Argument& e : l) out.push_back(e.to_bool());
      return out;
    }
    if (ek == K::TensorType && l.empty()) {
      return elem->kind() == K::OptionalType
                 ? c10::IValue(c10::List<c10::optional<at::Tensor>>())
                 : c10::IValue(c10::List<at::Tensor>());
    }
    c10::impl::GenericList out(c10::AnyType::get());
    for (const Argument& e : l) out.push_back(constant_ivalue(e, elem ? *elem : declared));
    return out;
  }
  TORCH_INTERNAL_ASSERT(false, "constant_ivalue: node arguments are not constants");
}

std::vector<const Argument*> given_arguments(const Node& n) {
  const c10::FunctionSchema& schema = n.schema();
  std::vector<const Argument*> given(schema.arguments().size(), nullptr);
  for (size_t i = 0; i < n.args().size(); ++i) given[i] = &n.args()[i];
  for (const auto& kv : n.kwargs()) given[*schema.argumentIndexWithName(kv.first)] = &kv.second;
  return given;
}

c10::IValue default_ivalue(const c10::Argument& p) {
  return p.default_value() ? *p.default_value() : c10::IValue();
}

bool is_tensor_like(const c10::IValue& v) {
  if (v.isTensor()) return true;
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (is_tensor_like(e)) return true;
    }
  }
  return false;
}

void throw_unrecordable(const c10::IValue& v, const std::string& what) {
  throw TraceError(what + " is " + (v.isGenerator() ? "a random generator" : "a " + v.tagKind()) +
                   ", which a graph cannot record; pass no generator (use the default one) or "
                   "compute it outside the traced function");
}

}  // namespace detail
}  // namespace torchcap
