// Note [Writes the schema does not declare]
// In LibTorch 1.13 a few operators write arguments their schema does not mark
// as written (no `(a!)`): native_batch_norm and the composites above it update
// running_mean and running_var in place when `training` is true. Tracing,
// dead-code elimination and the immutability check all need to know, so the
// list lives here, reviewed, and is consulted wherever alias info is.
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/operator_name.h>

#include <cstddef>
#include <vector>

namespace torchcap {
namespace detail {

// Whether `a` is a random generator (Generator or Generator?).
bool is_generator_argument(const c10::Argument& a);

struct HiddenWrites {
  std::vector<size_t> arguments;  // indices of the written arguments
  size_t condition;               // a bool argument: the writes happen when it is true
};

// The undeclared writes of `op`, or nullptr.
const HiddenWrites* hidden_writes(const c10::OperatorName& op);

}  // namespace detail
}  // namespace torchcap
