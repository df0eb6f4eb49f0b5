// Whether a call_function node's arguments fit its operator's schema.
// Shared by Graph::lint and the file loader.
#pragma once

#include <torchcap/node.h>

#include <c10/util/FunctionRef.h>

#include <string>

namespace torchcap {
namespace detail {

// What a node's value is, as far as its arguments' types are concerned.
enum class Produces : uint8_t { Tensor, TensorList, Tuple, Scalar, Nothing };
Produces produces(const Node& n);

// Empty if `n`'s arguments fit its schema; otherwise the first problem, naming
// the parameter ("argument 'other' of aten::add.Tensor expects Tensor, got str").
// Fitting includes the ranges of Note [Integers kernels divide by] (schema_check.cpp).
std::string check_schema_arguments(const Node& n, const c10::FunctionSchema& schema);

// The recorded metadata of a node's tensor value, or nullptr if none is known.
using MetaOf = c10::function_ref<const TensorMeta*(const Node&)>;

// Empty if `n` is none of the calls Note [Kernels that trust their arguments]
// refuses, given what `meta_of` knows of its inputs; otherwise the problem.
// The file loader's check, not lint's: it needs recorded metadata.
std::string check_trusting_kernels(const Node& n, MetaOf meta_of);

// Empty if a getitem node is well formed; otherwise the problem.
std::string check_getitem(const Node& n);
// Empty if a size computation is well formed; otherwise the problem.
std::string check_size_computation(const Node& n);

}  // namespace detail
}  // namespace torchcap
