#include "runtime/ivalues.h"

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

c10::IValue argument_ivalue(const Argument& a, const c10::Type& declared,
                            const std::function<c10::IValue(const Node*)>& value_of) {
  if (a.is_node()) return value_of(a.to_node());
  const c10::Type& type = unwrap_optional(declared);
  if (a.is_list() && type.kind() == c10::TypeKind::ListType) {
    bool has_nodes = false;
    a.for_each_node([&](Node*) { has_nodes = true; });
    if (has_nodes) {
      const c10::Type& elem = *type.expectRef<c10::ListType>().getElementType();
      if (elem.kind() == c10::TypeKind::OptionalType) {
        c10::List<c10::optional<at::Tensor>> out;
        for (const Argument& e : a.to_list()) {
          c10::IValue v = argument_ivalue(e, elem, value_of);
          out.push_back(v.isNone() ? c10::optional<at::Tensor>() : v.toTensor());
        }
        return out;
      }
      c10::List<at::Tensor> out;
      for (const Argument& e : a.to_list()) out.push_back(argument_ivalue(e, elem, value_of).toTensor());
      return out;
    }
  }
  return constant_ivalue(a, declared);
}

std::vector<const Argument*> given_arguments(const Node& n) {
  const c10::FunctionSchema& schema = n.schema();
  std::vector<const Argument*> given(schema.arguments().size(), nullptr);
  for (size_t i = 0; i < n.args().size(); ++i) given[i] = &n.args()[i];
  for (const auto& kv : n.kwargs()) given[*schema.argumentIndexWithName(kv.first)] = &kv.second;
  return given;
}

std::vector<c10::IValue> call_stack(const Node& n,
                                    const std::function<c10::IValue(const Node*)>& value_of) {
  const auto& params = n.schema().arguments();
  std::vector<const Argument*> given = given_arguments(n);
  std::vector<c10::IValue> stack;
  stack.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (given[i] != nullptr) {
      stack.push_back(argument_ivalue(*given[i], *params[i].real_type(), value_of));
    } else if (params[i].default_value()) {
      stack.push_back(*params[i].default_value());
    } else {
      stack.emplace_back();  // an optional without a default
    }
  }
  return stack;
}

}  // namespace detail
}  // namespace torchcap
