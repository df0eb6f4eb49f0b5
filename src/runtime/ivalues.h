// Turning recorded arguments back into the IValues a boxed kernel expects.
// Shared by the interpreter and the functionalizing re-trace. Internal.
#pragma once

#include <torchcap/argument.h>
#include <torchcap/node.h>

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <functional>
#include <vector>

namespace torchcap {
namespace detail {

// `t` without an Optional around it.
const c10::Type& unwrap_optional(const c10::Type& t);

// A constant argument (no node inside) as the kernel expects it for a
// parameter of type `declared` (ints where floats are declared become doubles,
// lists become typed lists).
c10::IValue constant_ivalue(const Argument& a, const c10::Type& declared);

// Any argument: node references are looked up with `value_of`; lists with
// nodes inside become Tensor[] or Tensor?[] lists.
c10::IValue argument_ivalue(const Argument& a, const c10::Type& declared,
                            const std::function<c10::IValue(const Node*)>& value_of);

// For each parameter of an operator node's schema, the argument given for it
// (positionally or by keyword), or nullptr.
std::vector<const Argument*> given_arguments(const Node& n);

// The full argument stack of an operator node: positional and keyword
// arguments in schema order, defaults filled in.
std::vector<c10::IValue> call_stack(const Node& n,
                                    const std::function<c10::IValue(const Node*)>& value_of);

}  // namespace detail
}  // namespace torchcap
