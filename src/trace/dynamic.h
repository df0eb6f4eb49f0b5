// Dynamic traces (Note [Dynamic shapes by aligned traces] in dynamic.cpp).
// Internal.
#pragma once

#include <torchcap/tracer.h>

#include <functional>
#include <vector>

namespace torchcap {
namespace detail {

// How one of the traces runs: `meta` asks for a meta-mode trace, whose
// inputs are then meta tensors; `structure_only` says that only the graph's
// nodes, arguments and shapes will be read (every trace but the first), so
// stack traces and module stacks need not be recorded.
struct TraceAtOptions {
  bool meta = false;
  bool structure_only = false;
};

// Traces the program at `inputs` (or at inputs made from them with other
// sizes of the dynamic dimensions). Returns a static graph.
using TraceAt = std::function<TraceResult(const std::vector<c10::IValue>& inputs, TraceAtOptions how)>;

// The dynamic graph of a program: traced by `trace_at` at several sizes of
// `dims`, aligned and fitted. `meta_allowed`: the traces after the first may
// be meta-mode ones (a failing one is retried for real). The outputs are
// those of the first trace, at the example's sizes when they are in range.
TraceResult trace_dynamic(const TraceAt& trace_at, const std::vector<c10::IValue>& inputs,
                          const std::vector<DynamicDim>& dims, bool meta_allowed);

}  // namespace detail
}  // namespace torchcap
