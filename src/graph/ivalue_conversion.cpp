#include "graph/ivalue_conversion.h"

#include <torchcap/error.h>

#include <ATen/ScalarOps.h>
#include <c10/util/Exception.h>

namespace torchcap {
namespace detail {

const c10::Type& unwrap_optional(const c10::Type& t) {
  if (t.kind() == c10::TypeKind::OptionalType) {
    return *t.expectRef<c10::OptionalType>().getElementType();
  }
  return t;
}

// Note [Python numbers as tensors]
// A Python number where an operator takes a tensor (`x + 0.5`, `2 * x`:
// aten::add.Tensor, aten::mul.Tensor) reaches the kernel as a "wrapped
// number": a 0-dim CPU tensor (float64, int64 or bool) whose flag tells type
// promotion to treat it as a Python scalar, so that an int64 tensor plus 0.5
// is float32 (the default dtype), not float64, and a float32 tensor times 2.5
// stays float32. LibTorch's own composites make them too (add.Scalar calls
// add.Tensor with one). The flag is a property of the TensorImpl that no
// copy keeps, and no file recorded it: a graph that lifted the number as a
// tensor constant computed float64 once saved and loaded (issue 58). So a
// graph never holds a wrapped number as a tensor: the tracer records the
// number itself as the argument (as make_fx does: aten.add.Tensor(x, 0.5)),
// and whatever runs the graph gives the kernel a wrapped number again, made
// here (constant_ivalue), once per node. A torch.fx module calling
// torch.ops.aten.add.Tensor(x, 0.5) gets one from torch's own argument
// parsing. Files hold such numbers from version 1.6 (Note [Numbers for
// tensors in files] in serialize/format.h). Only a whole Tensor or Tensor?
// parameter takes one, never an element of a list: LibTorch makes none there.

std::optional<Argument> wrapped_number_argument(const at::Tensor& t) {
  if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number() || !t.device().is_cpu() ||
      t.dim() != 0 || !t.has_storage()) {
    return std::nullopt;
  }
  // Read without the dispatcher: a trace that is recording must not see it.
  switch (t.scalar_type()) {
    case c10::ScalarType::Double:
      return Argument(*static_cast<const double*>(t.unsafeGetTensorImpl()->data()));
    case c10::ScalarType::Long:
      return Argument(*static_cast<const int64_t*>(t.unsafeGetTensorImpl()->data()));
    case c10::ScalarType::Bool:
      return Argument(*static_cast<const bool*>(t.unsafeGetTensorImpl()->data()));
    default:
      return std::nullopt;  // a complex number: lifted as a tensor constant
  }
}

bool is_number_for_tensor(const c10::Type& declared, const Argument& a) {
  return unwrap_optional(declared).kind() == c10::TypeKind::TensorType &&
         (a.is_int() || a.is_double() || a.is_bool() ||
          (a.is_node() && a.to_node()->is_size_computation()));
}

bool has_number_for_tensor(const Node& n) {
  if (!n.is_operator()) return false;
  const auto& params = n.schema().arguments();
  const std::vector<const Argument*> given = given_arguments(n);
  for (size_t i = 0; i < params.size(); ++i) {
    if (given[i] != nullptr && is_number_for_tensor(*params[i].real_type(), *given[i])) return true;
  }
  return false;
}

namespace {

// A wrapped number holding `a`'s value (Note [Python numbers as tensors]).
// Made without the dispatcher, as scalar_operators.cpp explains.
at::Tensor wrapped_number_tensor(const Argument& a) {
  const c10::Scalar value = a.is_double() ? c10::Scalar(a.to_double())
                            : a.is_int()  ? c10::Scalar(a.to_int())
                                          : c10::Scalar(a.to_bool());
  return at::native::wrapped_scalar_tensor(value);
}

}  // namespace

c10::IValue constant_ivalue(const Argument& a, const c10::Type& declared) {
  const c10::Type& type = unwrap_optional(declared);
  using K = c10::TypeKind;
  if (a.is_none()) return c10::IValue();
  if (type.kind() == K::TensorType && (a.is_int() || a.is_double() || a.is_bool())) {
    return wrapped_number_tensor(a);
  }
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
