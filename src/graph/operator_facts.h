// What an operator's schema says about aliasing, asked by every part that
// must know which arguments a call writes or which results are views.
// Internal.
#pragma once

#include <ATen/core/function_schema.h>

#include <vector>

namespace torchcap {

class GraphModule;
class Node;

namespace detail {

// Whether `info` (or an alias set it contains, as `Tensor(a!)[]`) is written.
bool is_write(const c10::AliasInfo* info);

// Index of the argument that return `r` of `schema` writes and returns (the
// same alias set, written): in-place and out= operators. -1 for none.
int written_argument_of(const c10::FunctionSchema& schema, const c10::Argument& r);

// Index of the argument that return `r` is a view of (it shares an alias set
// without writing). -1 for none.
int aliased_argument_of(const c10::FunctionSchema& schema, const c10::Argument& r);

// The node whose memory the (first) result of `n` lives in: following
// in-place and out= operators to the tensor they wrote, and, with
// `through_views`, views to the tensor they view. `n` itself when its result
// is new memory (or `n` is no operator).
const Node* memory_root(const Node* n, bool through_views);

// Per placeholder of `g`, in order: whether the graph writes it, in place
// (directly or through a view) or by a write-back of its signature
// (`output_specs`, export.h).
std::vector<bool> written_inputs(const GraphModule& gm);

}  // namespace detail
}  // namespace torchcap
