// Dynamic graphs at fixed sizes: the symbols' values in a call, and the graph
// those values give (passes.h).
#include <torchcap/error.h>
#include <torchcap/passes.h>

#include "graph/schema_check.h"

#include <ATen/core/Tensor.h>

#include <unordered_map>

namespace torchcap {
namespace {

std::string range_str(const Symbol& s) {
  return "[" + std::to_string(s.min) + ", " + (s.max == kNoMaxSize ? "inf" : std::to_string(s.max)) + "]";
}

std::string symbol_str(const std::vector<Symbol>& symbols, size_t i) {
  const std::string name = symbol_name(i);
  return symbols[i].label == name ? name : name + " (" + symbols[i].label + ")";
}

std::string shape_str(const at::Tensor& t) {
  TensorMeta m = TensorMeta::of(t);
  return m.str();
}

}  // namespace

std::vector<int64_t> symbol_values(const GraphModule& gm, c10::ArrayRef<at::Tensor> inputs) {
  const std::vector<Node*> placeholders = gm.graph().placeholders();
  if (inputs.size() != placeholders.size()) {
    throw InputError("the graph takes " + std::to_string(placeholders.size()) + " input tensor(s), got " +
                     std::to_string(inputs.size()));
  }
  std::vector<std::string> problems;
  auto input_str = [&](size_t i) { return "input " + std::to_string(i) + " (" + placeholders[i]->name() + ")"; };
  // Rank and dtype first: sizes are read only from inputs of the right rank.
  std::vector<bool> readable(inputs.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueMeta& val = placeholders[i]->meta().val;
    if (val.kind != ValueKind::Tensor || val.tensors.empty()) {
      readable[i] = inputs[i].defined();
      continue;
    }
    const TensorMeta& m = val.tensors[0];
    if (!inputs[i].defined()) {
      problems.push_back(input_str(i) + ": expected " + m.str() + ", got an undefined tensor");
    } else if (inputs[i].dim() != static_cast<int64_t>(m.sizes.size()) || inputs[i].scalar_type() != m.dtype) {
      problems.push_back(input_str(i) + ": expected " + m.str() + ", got " + shape_str(inputs[i]));
    } else {
      readable[i] = true;
    }
  }
  std::vector<int64_t> values(gm.symbols.size(), -1);
  for (size_t s = 0; s < gm.symbols.size(); ++s) {
    const Symbol& sym = gm.symbols[s];
    for (const InputDim& d : sym.dims) {
      if (d.input >= inputs.size() || !readable[d.input]) continue;
      int64_t size = inputs[d.input].size(d.dim);
      if (values[s] < 0) {
        values[s] = size;
        if (size < sym.min || size > sym.max) {
          problems.push_back(input_str(d.input) + ": dimension " + std::to_string(d.dim) + " is " +
                             std::to_string(size) + ", outside the range " + range_str(sym) + " of " +
                             symbol_str(gm.symbols, s));
        }
      } else if (size != values[s]) {
        problems.push_back(input_str(d.input) + ": dimension " + std::to_string(d.dim) + " is " +
                           std::to_string(size) + ", but it is " + symbol_str(gm.symbols, s) +
                           ", which another input's dimension makes " + std::to_string(values[s]));
      }
    }
  }
  if (problems.empty()) {
    // Every other dimension: fixed, or an expression of the symbols.
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ValueMeta& val = placeholders[i]->meta().val;
      if (!readable[i] || val.kind != ValueKind::Tensor || val.tensors.empty()) continue;
      const TensorMeta& m = val.tensors[0];
      for (size_t d = 0; d < m.sizes.size(); ++d) {
        int64_t expected = m.symbolic != nullptr ? m.symbolic->sizes[d].evaluate(values) : m.sizes[d];
        if (inputs[i].size(static_cast<int64_t>(d)) != expected) {
          problems.push_back(input_str(i) + ": expected " + m.str() + ", got " + shape_str(inputs[i]) +
                             " (dimension " + std::to_string(d) + " must be " +
                             (m.symbolic != nullptr && !m.symbolic->sizes[d].is_constant()
                                  ? m.symbolic->sizes[d].str() + " = "
                                  : "") +
                             std::to_string(expected) + ")");
          break;
        }
      }
    }
  }
  if (!problems.empty()) {
    std::string message = "the inputs do not fit the graph:";
    for (const std::string& p : problems) message += "\n  " + p;
    throw InputError(message);
  }
  return values;
}

std::vector<int64_t> traced_symbol_values(const GraphModule& gm) {
  const std::vector<Node*> inputs = gm.graph().placeholders();
  std::vector<int64_t> traced;
  for (const Symbol& s : gm.symbols) {
    traced.push_back(inputs[s.dims[0].input]->meta().val.tensors[0].sizes[s.dims[0].dim]);
  }
  return traced;
}

GraphModule specialize(const GraphModule& gm, c10::ArrayRef<int64_t> values) {
  if (values.size() != gm.symbols.size()) {
    throw Error("specialize: the graph has " + std::to_string(gm.symbols.size()) + " symbols, got " +
                std::to_string(values.size()) + " values");
  }
  for (size_t s = 0; s < values.size(); ++s) {
    if (values[s] < gm.symbols[s].min || values[s] > gm.symbols[s].max) {
      throw Error("specialize: " + symbol_str(gm.symbols, s) + " = " + std::to_string(values[s]) +
                  " is outside its range " + range_str(gm.symbols[s]));
    }
  }
  GraphModule out = gm.clone();
  out.symbols.clear();
  Graph& g = out.graph();
  auto concrete = [&](TensorMeta& m) {
    if (m.symbolic == nullptr) return;
    for (size_t d = 0; d < m.sizes.size(); ++d) {
      m.sizes[d] = m.symbolic->sizes[d].evaluate(values);
      m.strides[d] = m.symbolic->strides[d].evaluate(values);
    }
    m.symbolic = nullptr;
  };
  std::unordered_map<const Node*, int64_t> size_of;
  std::vector<Node*> computations;
  auto operand = [&](const Argument& a) -> int64_t {
    return a.is_int() ? a.to_int() : size_of.at(a.to_node());
  };
  for (Node* n : g) {
    if (!n->is_size_computation()) continue;
    computations.push_back(n);
    const std::string& t = n->target();
    int64_t v = 0;
    if (t == kSymSize) {
      const ValueMeta& val = n->args()[0].to_node()->meta().val;
      int64_t dim = n->args()[1].to_int();
      if (val.kind != ValueKind::Tensor || val.tensors.empty() || dim < 0 ||
          dim >= static_cast<int64_t>(val.tensors[0].sizes.size())) {
        throw Error("specialize: %" + n->name() + " reads dimension " + std::to_string(dim) +
                    " of a value without recorded sizes there");
      }
      const TensorMeta& m = val.tensors[0];
      v = m.symbolic != nullptr ? m.symbolic->sizes[dim].evaluate(values) : m.sizes[dim];
    } else {
      int64_t a = operand(n->args()[0]);
      int64_t b = operand(n->args()[1]);
      bool overflow = false;
      if (t == "add") {
        overflow = __builtin_add_overflow(a, b, &v);
      } else if (t == "sub") {
        overflow = __builtin_sub_overflow(a, b, &v);
      } else if (t == "mul") {
        overflow = __builtin_mul_overflow(a, b, &v);
      } else {  // floordiv, Python's: rounds toward negative infinity
        if (b == 0) throw Error("specialize: %" + n->name() + " divides by zero");
        v = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) --v;
      }
      if (overflow) throw Error("specialize: %" + n->name() + " overflows 64 bits");
    }
    size_of[n] = v;
  }
  auto constant_of = [&](const Argument& a, auto& self) -> Argument {
    if (a.is_node() && a.to_node()->is_size_computation()) return Argument(size_of.at(a.to_node()));
    if (a.is_list()) {
      ArgumentList l;
      l.reserve(a.to_list().size());
      for (const Argument& e : a.to_list()) l.push_back(self(e, self));
      return Argument(std::move(l));
    }
    return a;
  };
  std::vector<const Node*> given_sizes;
  for (Node* n : g) {
    for (TensorMeta& m : n->meta().val.tensors) concrete(m);
    if (n->is_size_computation()) continue;
    bool reads_size = false;
    for (Node* in : n->inputs()) reads_size = reads_size || in->is_size_computation();
    if (!reads_size) continue;
    ArgumentList args;
    for (const Argument& a : n->args()) args.push_back(constant_of(a, constant_of));
    Kwargs kwargs;
    for (const auto& [k, a] : n->kwargs()) kwargs.emplace_back(k, constant_of(a, constant_of));
    n->set_args(std::move(args));
    n->set_kwargs(std::move(kwargs));
    given_sizes.push_back(n);
  }
  for (auto it = computations.rbegin(); it != computations.rend(); ++it) g.erase(*it);
  // The sizes are known now: the checks of arguments that kernels trust
  // (Note [Kernels that trust their arguments]) apply to them, as to the
  // constants of a loaded file.
  auto meta_of = [](const Node& m) -> const TensorMeta* {
    const ValueMeta& v = m.meta().val;
    return v.kind == ValueKind::Tensor && !v.tensors.empty() ? &v.tensors[0] : nullptr;
  };
  for (const Node* n : given_sizes) {
    std::string problem = detail::check_trusting_kernels(*n, meta_of);
    if (!problem.empty()) throw InputError("at these sizes, %" + n->name() + ": " + problem);
  }
  try {
    out.lint();
  } catch (const LintError& e) {
    throw InputError(std::string("at these sizes the graph is not valid: ") + e.what());
  }
  return out;
}

}  // namespace torchcap
