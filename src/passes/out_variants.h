// How an operator node's results are written into tensors given to it: the
// overload a planned run calls instead. Internal; see memory_plan.h.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <vector>

namespace torchcap {
namespace detail {

struct OutForm {
  c10::OperatorHandle op;  // called with the node's arguments, `extra`, then the outs
  std::vector<c10::IValue> extra;
};

// The operator's own out variant (find_out_variant), or for a few operators
// whose out variant is a composite, the out variant of the operator their
// CPU kernel calls (Note [Equivalent out kernels]); nullopt if none.
std::optional<OutForm> out_form(const c10::OperatorHandle& functional);

}  // namespace detail
}  // namespace torchcap
