#include "graph/schema_check.h"

#include <ATen/core/function_schema.h>
#include <ATen/core/jit_type.h>
#include <c10/util/SmallVector.h>

#include <unordered_set>

namespace torchcap {
namespace detail {

Produces produces(const Node& n) {
  switch (n.op()) {
    case OpCode::Placeholder:
    case OpCode::GetAttr:
      return Produces::Tensor;
    case OpCode::Output:
      return Produces::Nothing;
    case OpCode::CallFunction:
      break;
  }
  if (n.is_getitem()) return Produces::Tensor;
  const auto& returns = n.schema().returns();
  if (returns.empty()) return Produces::Nothing;
  if (returns.size() > 1) return Produces::Tuple;
  const c10::TypePtr& t = returns[0].real_type();
  if (t->kind() == c10::TypeKind::TensorType) return Produces::Tensor;
  if (t->kind() == c10::TypeKind::ListType &&
      t->expectRef<c10::ListType>().getElementType()->kind() == c10::TypeKind::TensorType) {
    return Produces::TensorList;
  }
  return Produces::Scalar;
}

namespace {

const char* describe(const Argument& a) {
  if (a.is_node()) {
    switch (produces(*a.to_node())) {
      case Produces::Tensor:
        return "a Tensor node";
      case Produces::TensorList:
        return "a Tensor[] node";
      case Produces::Tuple:
        return "a node with several outputs (use getitem)";
      case Produces::Scalar:
        return "a scalar node";
      case Produces::Nothing:
        return "a node without a value";
    }
  }
  return a.kind_name();
}

bool is_tensor_node(const Argument& a) {
  return a.is_node() && produces(*a.to_node()) == Produces::Tensor;
}

// Whether `a` is acceptable where the schema says `type`.
bool fits(const c10::Type& type, const Argument& a) {
  using K = c10::TypeKind;
  switch (type.kind()) {
    case K::OptionalType:
      return a.is_none() || fits(*type.expectRef<c10::OptionalType>().getElementType(), a);
    case K::TensorType:
      return is_tensor_node(a);
    case K::IntType:
    case K::SymIntType:
      return a.is_int();
    case K::FloatType:
      return a.is_double() || a.is_int();
    case K::BoolType:
      return a.is_bool();
    case K::NumberType:
      return a.is_int() || a.is_double() || a.is_bool();
    case K::StringType:
      return a.is_string();
    case K::ScalarTypeType:
      return a.is_scalar_type();
    case K::LayoutType:
      return a.is_layout();
    case K::MemoryFormatType:
      return a.is_memory_format();
    case K::DeviceObjType:
      return a.is_device();
    case K::ListType: {
      const c10::Type& elem = *type.expectRef<c10::ListType>().getElementType();
      if (elem.kind() == K::TensorType && a.is_node()) {
        return produces(*a.to_node()) == Produces::TensorList;
      }
      if (!a.is_list()) return false;
      for (const Argument& e : a.to_list()) {
        if (!fits(elem, e)) return false;
      }
      return true;
    }
    default:
      return false;  // generators (other than none), streams, objects, ...
  }
}

}  // namespace

std::string check_schema_arguments(const Node& n, const c10::FunctionSchema& schema) {
  const std::string& op = n.target();
  const auto& params = schema.arguments();
  size_t positional = 0;
  while (positional < params.size() && !params[positional].kwarg_only()) ++positional;

  if (n.args().size() > positional) {
    return op + " takes at most " + std::to_string(positional) + " positional argument(s), got " +
           std::to_string(n.args().size());
  }
  // Inline for the usual schema (a reader checks every node it makes, and
  // lint again): no allocation per node.
  c10::SmallVector<const Argument*, 16> given(params.size(), nullptr);
  for (size_t i = 0; i < n.args().size(); ++i) given[i] = &n.args()[i];
  for (const auto& kv : n.kwargs()) {
    auto idx = schema.argumentIndexWithName(kv.first);
    if (!idx) return op + " has no argument named '" + kv.first + "'";
    if (given[*idx] != nullptr) {
      return op + " got argument '" + kv.first + "' both positionally and by keyword";
    }
    given[*idx] = &kv.second;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const c10::Argument& p = params[i];
    if (given[i] == nullptr) {
      if (!p.default_value().has_value() && p.real_type()->kind() != c10::TypeKind::OptionalType) {
        return op + " is missing required argument '" + p.name() + "'";
      }
      continue;
    }
    if (!fits(*p.real_type(), *given[i])) {
      return "argument '" + p.name() + "' of " + op + " expects " + p.real_type()->str() +
             ", got " + describe(*given[i]);
    }
  }
  return "";
}

std::string check_getitem(const Node& n) {
  if (n.args().size() != 2 || !n.kwargs().empty() || !n.args()[0].is_node() ||
      !n.args()[1].is_int()) {
    return "getitem takes (node, index)";
  }
  const Node& src = *n.args()[0].to_node();
  Produces p = produces(src);
  if (p != Produces::Tuple && p != Produces::TensorList) {
    return "getitem reads %" + src.name() + ", which has a single value (" + describe(n.args()[0]) +
           ")";
  }
  int64_t index = n.args()[1].to_int();
  int64_t count = -1;
  if (p == Produces::Tuple) {
    count = static_cast<int64_t>(src.schema().returns().size());
  } else if (src.meta().val.kind == ValueKind::List) {
    count = static_cast<int64_t>(src.meta().val.tensors.size());
  }
  if (index < 0 || (count >= 0 && index >= count)) {
    return "getitem index " + std::to_string(index) + " is out of range for %" + src.name() +
           (count >= 0 ? ", which has " + std::to_string(count) + " values" : "");
  }
  return "";
}

}  // namespace detail
}  // namespace torchcap
