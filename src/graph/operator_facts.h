// What torchcap knows about an operator from its registration: its name,
// which arguments a call writes (declared or not), which results are views
// or written arguments, whether a result is data read from tensors, its out
// variant. Derived once per operator and kept; every part that must know
// asks here instead of reading alias info or splitting names itself.
// Internal.
#pragma once

#include "graph/operator_name.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>

#include <optional>
#include <vector>

namespace torchcap {

class GraphModule;
class Node;

namespace detail {

struct HiddenWrites;

struct OperatorFacts {
  const OperatorIdentity* identity = nullptr;  // "aten::addmm", stem "addmm"

  // Per argument, in schema order.
  std::vector<bool> writes;   // its alias info writes it (or its elements)
  std::vector<bool> writes_elements;  // only its elements (Tensor(a!)[])
  std::vector<bool> aliased;  // it has alias info at all (written or viewed)
  // The alias sets it is in, its elements' included, the wildcard left out.
  std::vector<std::vector<c10::Symbol>> argument_sets;
  // Per return.
  std::vector<int> written_argument;  // the argument it is (in-place, out=), or -1
  std::vector<int> viewed_argument;   // the argument it is a view of, or -1
  std::vector<std::vector<c10::Symbol>> return_sets;

  // Note [Writes the schema does not declare]; null for most operators.
  const HiddenWrites* hidden = nullptr;
  bool writes_declared = false;  // some argument's alias info writes
  bool returns_written = false;  // some return is a written argument
  bool returns_view = false;     // some return is a view of an argument
  bool returns_alias = false;    // some return has alias info (view or written)
  bool any_alias = false;        // some argument or return has alias info
  bool mutable_schema = false;   // FunctionSchema::is_mutable
  bool returns_nothing = false;
  // Note [Data-dependent values] (operator_facts.cpp).
  bool returns_data = false;
  // Note [Shapes that depend on values] (data_dependence.h).
  bool maybe_data_dependent_shape = false;
  size_t positional = 0;  // arguments before the first keyword-only one
  // Operators the tracer treats apart (dispatch.cpp): aten::equal (Note
  // [Data-dependent values]) and aten::_reshape_alias (Note [Reshape
  // aliases are recorded as views]).
  bool is_equal = false;
  bool is_reshape_alias = false;
  // The `.out` overload whose schema is this one's plus one written tensor
  // per return (memory_plan.h, find_out_variant).
  std::optional<c10::OperatorHandle> out_variant;

  // Whether a call writes any argument, declared or, under a condition, not.
  bool writes_any() const { return writes_declared || hidden != nullptr; }
};

// The facts of `op`, derived on first use (Note [Operator facts kept until
// deregistered]). Thread-safe; the reference stays valid until the process
// ends.
const OperatorFacts& operator_facts(const c10::OperatorHandle& op);

// The facts of the operator node `n` calls (n.is_operator()), looked up
// once per node.
inline const OperatorFacts& facts_of(const Node& n);

// The node whose memory the (first) result of `n` lives in: following
// in-place and out= operators to the tensor they wrote, and, with
// `through_views`, views to the tensor they view. `n` itself when its result
// is new memory (or `n` is no operator).
const Node* memory_root(const Node* n, bool through_views);

// Per placeholder of `gm`, in order: whether the graph writes it, in place
// (directly or through a view) or by a write-back of its signature
// (`output_specs`, export.h).
std::vector<bool> written_inputs(const GraphModule& gm);

}  // namespace detail
}  // namespace torchcap

#include <torchcap/node.h>

namespace torchcap {
namespace detail {

inline const OperatorFacts& facts_of(const Node& n) { return n.facts(); }

}  // namespace detail
}  // namespace torchcap
