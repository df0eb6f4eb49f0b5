// Whether a call_function node's arguments fit its operator's schema.
// Shared by Graph::lint and the file loader.
#pragma once

#include <torchcap/node.h>

#include <string>

namespace torchcap {
namespace detail {

// What a node's value is, as far as its arguments' types are concerned.
enum class Produces : uint8_t { Tensor, TensorList, Tuple, Scalar, Nothing };
Produces produces(const Node& n);

// Empty if `n`'s arguments fit its schema; otherwise the first problem, naming
// the parameter ("argument 'other' of aten::add.Tensor expects Tensor, got str").
std::string check_schema_arguments(const Node& n, const c10::FunctionSchema& schema);

// Empty if a getitem node is well formed; otherwise the problem.
std::string check_getitem(const Node& n);

}  // namespace detail
}  // namespace torchcap
