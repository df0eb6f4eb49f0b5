#include <torchcap/error.h>
#include <torchcap/evaluator.h>

#include "graph/ivalue_conversion.h"

#include <ATen/core/Tensor.h>

namespace torchcap {
namespace detail {

std::vector<BoundArgument> bind_arguments(const Node& n) {
  const auto& params = n.schema().arguments();
  std::vector<const Argument*> given = detail::given_arguments(n);
  std::vector<BoundArgument> bound(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    BoundArgument& b = bound[i];
    const Argument* a = given[i];
    if (a == nullptr) {
      b.constant = detail::default_ivalue(params[i]);
      continue;
    }
    if (a->is_node()) {
      b.kind = BoundArgument::Kind::Node;
      b.node = a->to_node();
      continue;
    }
    const c10::Type& type = detail::unwrap_optional(*params[i].real_type());
    bool has_nodes = false;
    a->for_each_node([&](Node*) { has_nodes = true; });
    if (has_nodes && a->is_list() && type.kind() == c10::TypeKind::ListType) {
      const c10::Type& elem = *type.expectRef<c10::ListType>().getElementType();
      b.kind = elem.kind() == c10::TypeKind::OptionalType ? BoundArgument::Kind::OptionalTensorList
                                                          : BoundArgument::Kind::TensorList;
      for (const Argument& e : a->to_list()) b.elements.push_back(e.is_node() ? e.to_node() : nullptr);
      continue;
    }
    b.constant = detail::constant_ivalue(*a, *params[i].real_type());
  }
  return bound;
}

namespace {

TensorMeta meta_of(const at::Tensor& t) {
  // An undefined result is what the tracer hands on as an empty tensor.
  if (!t.defined()) return TensorMeta{c10::ScalarType::Float, {0}, {1}, c10::Device(c10::kCPU), nullptr};
  return TensorMeta::of(t);
}

}  // namespace

ValueMeta result_meta(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> returns) {
  ValueMeta v;
  if (schema.returns().empty()) {
    v.kind = ValueKind::None;
    return v;
  }
  if (returns.size() == 1) {
    if (returns[0].isTensor()) return ValueMeta::tensor(meta_of(returns[0].toTensor()));
    if (returns[0].isTensorList()) {
      v.kind = ValueKind::List;
      for (const at::Tensor& t : returns[0].toTensorList()) v.tensors.push_back(meta_of(t));
    }
    return v;  // a scalar: unknown
  }
  for (const c10::IValue& r : returns) {
    if (!r.isTensor()) return ValueMeta{};
    v.tensors.push_back(meta_of(r.toTensor()));
  }
  v.kind = ValueKind::Tuple;
  return v;
}

// Note [Releasing values after their last use]
// One reverse walk: the first time a node is seen as an input (from the
// end), its reader there is its last; a node no one reads is released right
// after it runs. What the output node returns is never released.
std::unordered_map<const Node*, std::vector<const Node*>> last_uses(const Graph& g) {
  std::unordered_map<const Node*, std::vector<const Node*>> frees;
  std::unordered_map<const Node*, bool> seen;
  for (Node* n = g.last(); n != nullptr; n = n->prev()) {
    if (n->op() == OpCode::Output) {
      for (const Node* in : n->inputs()) seen[in] = true;
      continue;
    }
    for (const Node* in : n->inputs()) {
      if (seen.emplace(in, true).second) frees[n].push_back(in);
    }
    if (seen.emplace(n, true).second) frees[n].push_back(n);
  }
  return frees;
}

void throw_no_value(const Node* n) {
  throw Error("evaluating the graph: %" + n->name() +
              " has no value (a multi-output node used without getitem, or a node that returns "
              "nothing)");
}

void throw_dynamic_size(const Node& n) {
  throw Error("evaluating the graph: %" + n.name() + " (" + n.target() +
              ") computes a dynamic size; this runs graphs of fixed sizes: specialize the graph "
              "to its inputs' sizes first (specialize() in torchcap/passes.h), as the "
              "Interpreter does");
}

}  // namespace detail

std::vector<c10::IValue> Evaluator::run(std::vector<c10::IValue> inputs) {
  size_t placeholders = graph().placeholders().size();
  if (inputs.size() != placeholders) {
    throw InputError("the graph takes " + std::to_string(placeholders) + " input(s), got " +
                     std::to_string(inputs.size()));
  }
  inputs_ = std::move(inputs);
  std::vector<c10::IValue> out = GraphEvaluator::run();
  inputs_.clear();
  return out;
}

c10::IValue Evaluator::placeholder(const Node&, size_t index) { return inputs_.at(index); }

c10::IValue Evaluator::get_attr(const Node& n) { return module_.attribute(n.target()).value; }

c10::IValue Evaluator::call_operator(const Node& n, const std::vector<BoundArgument>& args) {
  std::vector<c10::IValue> stack =
      detail::make_stack(args, [this](const Node* in) { return value_of(in); });
  run_kernel(n, stack);
  return pack_results(std::move(stack));
}

void Evaluator::run_kernel(const Node& n, std::vector<c10::IValue>& stack) {
  n.op_handle().callBoxed(&stack);
}

c10::IValue Evaluator::getitem(const Node&, const c10::IValue& source, int64_t index) {
  return source.isTuple() ? source.toTupleRef().elements().at(index) : source.toListRef().at(index);
}

c10::IValue Evaluator::pack_results(std::vector<c10::IValue>&& stack) {
  if (stack.empty()) return c10::IValue();
  if (stack.size() == 1) return std::move(stack[0]);
  return c10::ivalue::Tuple::create(std::move(stack));
}

}  // namespace torchcap
