// The one converter between graph arguments and c10::IValues, both ways:
// constants to what a boxed kernel expects (running a graph), and what a
// kernel was given to arguments (recording one). Internal.
#pragma once

#include <torchcap/argument.h>
#include <torchcap/node.h>

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <c10/util/FunctionRef.h>

#include <optional>
#include <string>
#include <vector>

namespace torchcap {
namespace detail {

// `t` without an Optional around it.
const c10::Type& unwrap_optional(const c10::Type& t);

// A constant argument (no node inside) as the kernel expects it for a
// parameter of type `declared` (ints where floats are declared become doubles,
// lists become typed lists).
c10::IValue constant_ivalue(const Argument& a, const c10::Type& declared);

// The reverse: a value a kernel was given for a parameter of type `declared`,
// as an argument. Tensors become nodes through `node_of(tensor, what)`;
// `what()` names the value in errors ("argument 'self' of aten::add.Tensor"),
// a callable so that the text is made only when an error needs it (the
// tracer converts every argument of every operator it records).
// Throws TraceError for values a graph cannot record (generators, objects).
template <typename NodeOf, typename What>
Argument argument_of(const c10::IValue& v, const c10::Type& declared, NodeOf&& node_of,
                     const What& what);

// For each parameter of an operator node's schema, the argument given for it
// (positionally or by keyword), or nullptr.
std::vector<const Argument*> given_arguments(const Node& n);

// The argument a kernel receives when none is given for `p`: its default, or
// none for an optional without one.
c10::IValue default_ivalue(const c10::Argument& p);

// Note [Python numbers as tensors]: the number a wrapped-number tensor `t`
// holds, for a parameter of type Tensor, or nullopt if `t` is not one (or
// holds a number no Argument can: a complex one).
std::optional<Argument> wrapped_number_argument(const at::Tensor& t);

// Whether `a`, given for a parameter of type `declared`, is a number that
// stands for a tensor (Note [Python numbers as tensors]).
bool is_number_for_tensor(const c10::Type& declared, const Argument& a);

// Whether an operator node gives a number for one of its Tensor parameters.
bool has_number_for_tensor(const Node& n);

// Whether `v` is a tensor or holds one (Tensor[], Tensor?[]).
bool is_tensor_like(const c10::IValue& v);

[[noreturn]] void throw_unrecordable(const c10::IValue& v, const std::string& what);

template <typename NodeOf, typename What>
Argument argument_of(const c10::IValue& v, const c10::Type& declared, NodeOf&& node_of,
                     const What& what) {
  using K = c10::TypeKind;
  const c10::Type& type = unwrap_optional(declared);
  if (v.isNone()) return Argument();
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return Argument();
    if (type.kind() == K::TensorType && t.unsafeGetTensorImpl()->is_wrapped_number()) {
      if (std::optional<Argument> number = wrapped_number_argument(t)) return *std::move(number);
    }
    return Argument(node_of(t, what));
  }
  if (v.isInt()) {
    switch (type.kind()) {
      case K::ScalarTypeType:
        return Argument(static_cast<c10::ScalarType>(v.toInt()));
      case K::LayoutType:
        return Argument(static_cast<c10::Layout>(v.toInt()));
      case K::MemoryFormatType:
        return Argument(static_cast<c10::MemoryFormat>(v.toInt()));
      default:
        return Argument(v.toInt());
    }
  }
  if (v.isDouble()) return Argument(v.toDouble());
  if (v.isBool()) return Argument(v.toBool());
  if (v.isString()) return Argument(v.toStringRef());
  if (v.isDevice()) return Argument(v.toDevice());
  if (v.isSymInt()) return Argument(v.toSymInt().expect_int());
  if (v.isList()) {
    const c10::Type& elem =
        type.kind() == K::ListType ? *type.expectRef<c10::ListType>().getElementType() : type;
    ArgumentList out;
    auto list = v.toListRef();
    out.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      // Type-erased, so that nested lists instantiate no new template.
      auto describe = [&what, i] { return what() + "[" + std::to_string(i) + "]"; };
      c10::function_ref<std::string()> element(describe);
      out.push_back(argument_of(list[i], elem, node_of, element));
    }
    return Argument(std::move(out));
  }
  throw_unrecordable(v, what());
}

}  // namespace detail
}  // namespace torchcap
