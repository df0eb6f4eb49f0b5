// Note [Shapes that depend on values]
// A few operators return tensors whose shape depends on the values of their
// arguments, not only on their shapes: nonzero, masked_select, unique, ctc_loss (its log_alpha),
// bincount, indexing with a boolean mask (`x[x > 0]`, index.Tensor), and
// repeat_interleave with a tensor of repeats and no output_size. LibTorch
// 1.13 tags only some of them (dynamic_output_shape), so the list lives
// here, reviewed. A trace records the size it saw; for other inputs the
// size differs. The tracer refuses them unless the program allows data
// dependence (TraceOptions::allow_data_dependent_values), and then every
// value computed from such a result has a size that may change from run to
// run: the memory planner never places one by its recorded size.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <unordered_set>

namespace torchcap {

class Graph;
class Node;

namespace detail {

// Whether some call of the operator with schema `s` may have a result whose
// shape depends on tensor values (then ask the functions below per call).
bool may_have_data_dependent_shape(const c10::FunctionSchema& s);

// Whether a call of `op` with `args` (its whole argument list) returns a
// tensor whose shape depends on tensor values.
bool has_data_dependent_shape(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);

// Whether node `n` (a call_function node) does, from its arguments and their
// recorded metadata.
bool has_data_dependent_shape(const Node& n);

// The nodes of `g` whose results may have other shapes on other runs: those
// that have a data-dependent shape and every node that uses one of their
// results, transitively (conservative: a reduction of such a value may have
// a fixed shape, but is counted too).
std::unordered_set<const Node*> nodes_of_data_dependent_shape(const Graph& g);

}  // namespace detail
}  // namespace torchcap
