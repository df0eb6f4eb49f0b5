// Dynamic traces (Note [Dynamic shapes by aligned traces] in dynamic.cpp).
// Internal.
#pragma once

#include <torchcap/tracer.h>

#include <functional>
#include <vector>

namespace torchcap {
namespace detail {

// Traces the program at `inputs` (or at inputs made from them with other
// sizes of the dynamic dimensions); `meta` asks for a meta-mode trace, whose
// inputs are then meta tensors. Returns a static graph.
using TraceAt = std::function<TraceResult(const std::vector<c10::IValue>& inputs, bool meta)>;

// The dynamic graph of a program: traced by `trace_at` at several sizes of
// `dims`, aligned and fitted. `meta_allowed`: the traces after the first may
// be meta-mode ones (a failing one is retried for real). The outputs are
// those of the first trace, at the example's sizes when they are in range.
TraceResult trace_dynamic(const TraceAt& trace_at, const std::vector<c10::IValue>& inputs,
                          const std::vector<DynamicDim>& dims, bool meta_allowed);

}  // namespace detail
}  // namespace torchcap
