// Functional forms of operators that write arguments their schema does not
// declare (Note [Writes the schema does not declare], graph/hidden_writes.h).
// Internal.
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

namespace torchcap {
namespace detail {

// Note [Functional BatchNorm]
// native_batch_norm in training mode updates running_mean and running_var in
// place without saying so in its schema, so functionalization cannot see the
// writes. Export's re-trace therefore computes it as: batch statistics from
// native_batch_norm without running stats (the same output as eager), and the
// running-stat updates written out as the functional computation LibTorch
// performs. The caller writes the new values back (export turns that write
// into buffer-mutation outputs). PyTorch 2 does the same with
// _native_batch_norm_legit_functional.
//
// `stack` holds native_batch_norm's 8 arguments; they are replaced by its 3
// results, and {new running_mean, new running_var} is returned.
std::vector<at::Tensor> functional_native_batch_norm(std::vector<c10::IValue>& stack);

}  // namespace detail
}  // namespace torchcap
