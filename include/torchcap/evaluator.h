// Walking a graph node by node, in the manner of torch.fx's `Interpreter`.
//
// Everything that runs a graph, symbolically or for real, is an evaluator:
// the interpreter's plan builder (values are table slots), shape propagation
// (meta tensors), export's functionalizing re-trace (traced tensors under
// functionalization), meta-mode and training captures. The walk, the
// binding of an operator node's arguments to its schema, and the packing of
// its results are written once, here.
//
// Ownership: an evaluator reads the graph it is given and must not outlive
// it; values belong to the evaluator and are released after their last use
// (found by one reverse walk, as fx's Interpreter does), so a long graph does
// not keep every intermediate alive.
#pragma once

#include <torchcap/graph.h>
#include <torchcap/graph_module.h>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace torchcap {

// One parameter of an operator node's schema, bound to what the node gives
// for it: positional or keyword arguments in schema order, defaults filled
// in, constants already converted to the IValue the kernel expects (an int
// where a float is declared becomes a double, lists become typed lists).
struct BoundArgument {
  enum class Kind : uint8_t {
    Constant,            // `constant`
    Node,                // the value of `node`
    TensorList,          // a Tensor[] of the values of `elements`
    OptionalTensorList,  // a Tensor?[]: `elements`, nullptr for none
  };
  Kind kind = Kind::Constant;
  c10::IValue constant;
  const Node* node = nullptr;
  std::vector<const Node*> elements;
};

namespace detail {

// Binds an operator node's arguments. The node must pass lint.
std::vector<BoundArgument> bind_arguments(const Node& n);

// The argument stack a boxed kernel expects, from bound arguments and the
// values of nodes.
template <typename ValueOf>
std::vector<c10::IValue> make_stack(const std::vector<BoundArgument>& args, ValueOf&& value_of);

// The metadata of an operator's results: `returns` are the values its kernel
// left on the stack, one per return of `schema`. Non-tensor results (sizes,
// scalars) give an unknown ValueMeta.
ValueMeta result_meta(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> returns);

}  // namespace detail

// The walk. `Value` is what a node evaluates to: an IValue for evaluators
// that compute (see Evaluator), or whatever a symbolic one tracks.
template <typename Value>
class GraphEvaluator {
 public:
  explicit GraphEvaluator(const Graph& graph) : graph_(graph) {}
  virtual ~GraphEvaluator() = default;
  GraphEvaluator(const GraphEvaluator&) = delete;
  GraphEvaluator& operator=(const GraphEvaluator&) = delete;

  // Visits every node in order; returns the values the output node names,
  // in order (a none result gives a default Value).
  std::vector<Value> run();

 protected:
  const Graph& graph() const { return graph_; }
  // The value of a node visited before; throws Error if it has none.
  const Value& value_of(const Node* n) const;

  // The hooks. `index` counts placeholders from 0.
  virtual Value placeholder(const Node& n, size_t index) = 0;
  virtual Value get_attr(const Node& n) = 0;
  virtual Value call_operator(const Node& n, const std::vector<BoundArgument>& args) = 0;
  virtual Value getitem(const Node& n, const Value& source, int64_t index) = 0;
  // A size computation (node.h), in a dynamic graph. Default: Error; graphs
  // with dynamic sizes run specialized to their inputs' sizes
  // (specialize() in passes.h), which leaves none.
  virtual Value size_computation(const Node& n);
  // After a node's value is known (not for the output node).
  virtual void visited(const Node& /*n*/, const Value& /*value*/) {}
  // Whether values are dropped after their last use (fx's Interpreter does).
  virtual bool release_values() const { return true; }

 private:
  const Graph& graph_;
  std::unordered_map<const Node*, Value> env_;
};

// An evaluator that computes: values are IValues, operators run their
// boxed kernels. Subclasses override what they do differently.
class Evaluator : public GraphEvaluator<c10::IValue> {
 public:
  // `gm` provides the attributes; it must outlive the evaluator.
  explicit Evaluator(const GraphModule& gm) : GraphEvaluator(gm.graph()), module_(gm) {}

  // Runs on the graph's flat inputs (one per placeholder).
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs);

 protected:
  const GraphModule& module() const { return module_; }

  // Defaults: the input; the attribute's tensor; the operator's kernel on
  // make_stack's stack, results packed by pack_results; the element.
  c10::IValue placeholder(const Node& n, size_t index) override;
  c10::IValue get_attr(const Node& n) override;
  c10::IValue call_operator(const Node& n, const std::vector<BoundArgument>& args) override;
  c10::IValue getitem(const Node& n, const c10::IValue& source, int64_t index) override;

  // Runs the kernel on `stack` (arguments in, results out). Default: the
  // node's operator, boxed.
  virtual void run_kernel(const Node& n, std::vector<c10::IValue>& stack);

  // None for no result, the result for one, a tuple for several.
  static c10::IValue pack_results(std::vector<c10::IValue>&& stack);

 private:
  using GraphEvaluator::run;
  const GraphModule& module_;
  std::vector<c10::IValue> inputs_;
};

// ---------------------------------------------------------------------------

namespace detail {

template <typename ValueOf>
std::vector<c10::IValue> make_stack(const std::vector<BoundArgument>& args, ValueOf&& value_of) {
  std::vector<c10::IValue> stack;
  stack.reserve(args.size());
  for (const BoundArgument& a : args) {
    switch (a.kind) {
      case BoundArgument::Kind::Constant:
        stack.push_back(a.constant);
        break;
      case BoundArgument::Kind::Node:
        stack.push_back(value_of(a.node));
        break;
      case BoundArgument::Kind::TensorList: {
        c10::List<at::Tensor> list;
        list.reserve(a.elements.size());
        for (const Node* e : a.elements) list.push_back(value_of(e).toTensor());
        stack.emplace_back(std::move(list));
        break;
      }
      case BoundArgument::Kind::OptionalTensorList: {
        c10::List<c10::optional<at::Tensor>> list;
        list.reserve(a.elements.size());
        for (const Node* e : a.elements) {
          list.push_back(e == nullptr ? c10::optional<at::Tensor>() : value_of(e).toTensor());
        }
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
  return stack;
}
// Note [Releasing values after their last use]: for each node, the values
// whose last reader it is (the output node keeps what it returns).
std::unordered_map<const Node*, std::vector<const Node*>> last_uses(const Graph& g);
[[noreturn]] void throw_no_value(const Node* n);
[[noreturn]] void throw_dynamic_size(const Node& n);
}  // namespace detail

template <typename Value>
Value GraphEvaluator<Value>::size_computation(const Node& n) {
  detail::throw_dynamic_size(n);
}

template <typename Value>
std::vector<Value> GraphEvaluator<Value>::run() {
  env_.clear();
  std::unordered_map<const Node*, std::vector<const Node*>> frees;
  if (release_values()) frees = detail::last_uses(graph_);
  std::vector<Value> results;
  size_t placeholders = 0;
  for (const Node* n : graph_) {
    Value v;
    switch (n->op()) {
      case OpCode::Placeholder:
        v = placeholder(*n, placeholders++);
        break;
      case OpCode::GetAttr:
        v = get_attr(*n);
        break;
      case OpCode::CallFunction:
        if (n->is_getitem()) {
          v = getitem(*n, value_of(n->args()[0].to_node()), n->args()[1].to_int());
        } else if (n->is_size_computation()) {
          v = size_computation(*n);
        } else {
          v = call_operator(*n, detail::bind_arguments(*n));
        }
        break;
      case OpCode::Output:
        for (const Argument& a : n->args()[0].to_list()) {
          results.push_back(a.is_node() ? value_of(a.to_node()) : Value());
        }
        return results;
    }
    visited(*n, v);
    env_[n] = std::move(v);
    auto it = frees.find(n);
    if (it != frees.end()) {
      for (const Node* dead : it->second) env_.erase(dead);
    }
  }
  return results;
}

template <typename Value>
const Value& GraphEvaluator<Value>::value_of(const Node* n) const {
  auto it = env_.find(n);
  if (it == env_.end()) detail::throw_no_value(n);
  return it->second;
}

}  // namespace torchcap
