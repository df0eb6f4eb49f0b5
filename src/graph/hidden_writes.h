// Note [Writes the schema does not declare]
// In LibTorch 1.13 a few operators write arguments their schema does not mark
// as written (no `(a!)`): native_batch_norm and the composites above it update
// running_mean and running_var in place when `training` is true. Tracing,
// dead-code elimination, CSE, the immutability check and export all need to
// know, so the list lives here, reviewed, with everything each of them needs,
// and is consulted wherever alias info is.
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/operator_name.h>
#include <torchcap/node.h>

#include <cstddef>
#include <vector>

namespace torchcap {
namespace detail {

// Whether `a` is a random generator (Generator or Generator?).
bool is_generator_argument(const c10::Argument& a);

struct HiddenWrites {
  std::vector<size_t> arguments;  // indices of the written arguments
  size_t condition;               // a bool argument: the writes happen when it is true
  // The operator without its writes, for export's functionalizing re-trace:
  // replaces the arguments on `stack` by the operator's results and returns
  // the new values of the written arguments, in the order of `arguments`.
  // Null when there is none: export then refuses the operator when it writes.
  using Functional = std::vector<at::Tensor> (*)(std::vector<c10::IValue>& stack);
  Functional functional = nullptr;
};

// The undeclared writes of `op`, or nullptr.
const HiddenWrites* hidden_writes(const c10::OperatorName& op);

// Whether the condition of `h` holds for the arguments on `stack` (the
// operator's full argument list), and so the writes happen.
bool hidden_writes_happen(const HiddenWrites& h, const std::vector<c10::IValue>& stack);

// The arguments a call_function node gives that its operator writes: those
// its schema marks written, and its hidden writes when their condition
// argument is true. Arguments the node does not give are left out.
std::vector<const Argument*> written_arguments(const Node& n);

}  // namespace detail
}  // namespace torchcap
