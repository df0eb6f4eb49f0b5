// Note [Dynamic shapes by aligned traces]
// LibTorch 1.13 has c10::SymInt but no symbolic tracer for C++: a program's
// sizes are plain integers by the time they reach an operator (a C++ model
// calls x.size(0), a Python one x.shape[0], and the arithmetic on them is
// invisible to the dispatcher). So a dynamic graph is found by tracing the
// program at several sizes of its dynamic dimensions and comparing:
//
// - The sizes. Each symbol takes values of 2 or more in its range, the
//   example's first (0 and 1 take other paths in LibTorch: at batch 1 a
//   matmul folds its batch into a view, where at 2 it copies). The points
//   are chosen so that every polynomial of degree 2 in the symbols is fixed
//   by them (rank of the design), plus two more that check the fit.
// - The traces. The first runs for real on the example (its outputs are the
//   trace's); the others run in meta mode on meta inputs where they can
//   (no kernel runs, so they cost bookkeeping only), else for real on
//   inputs made from the example's values (index_select along the dimension,
//   so token ids stay valid ids); only the first records stack traces.
// - The alignment. Every trace must record the same graph: the same nodes,
//   targets and names, arguments of the same structure, equal constants
//   other than integers, the same attributes and specs. A difference is
//   control flow on a size (a branch, a loop over a dimension, a split whose
//   count depends on it): the trace fails naming the first node that differs
//   and the sizes, and the graphs are never merged.
// - The fit. An integer argument or a size or stride in metadata that
//   differs between the traces is fitted exactly as an integer polynomial of
//   degree 2 or less in the symbols (n*s0, s0*s1, 4*s0 + 1) on the design
//   points and checked on the rest; one that fits none (a size through
//   .item(), min(t, 8), t // 2) fails the trace, naming the node, the
//   argument and its values.
// - The graph. The first trace's graph, its size-dependent integers
//   replaced by size computations (sym_size of an input, then mul/add/sub),
//   each made once, just before its first user, as torch.fx's symbolic trace
//   lays them out; metadata gets the fitted expressions (symbolic.h).
//
// What this cannot see, and the README says: size logic that is piecewise
// between the traced sizes (a min() that only bites at large sizes). The
// range's bounds are checked at every call.
#include "trace/dynamic.h"

#include "graph/node_source.h"
#include "graph/size_fit.h"

#include <torchcap/error.h>
#include <torchcap/passes.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/remainder.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>

namespace torchcap {
namespace detail {
namespace {

std::string where(const Node& n) { return source_lines(n); }

// Integers of an argument, in walk order.
void collect_ints(const Argument& a, std::vector<int64_t>& out) {
  if (a.is_int()) {
    out.push_back(a.to_int());
  } else if (a.is_list()) {
    for (const Argument& e : a.to_list()) collect_ints(e, out);
  }
}

// Whether `b` has `a`'s structure, nodes (by name) and constants, integers
// aside; appends `b`'s integers.
bool same_but_ints(const Argument& a, const Argument& b, std::vector<int64_t>& ints) {
  if (a.storage().index() != b.storage().index()) return false;
  if (a.is_int()) {
    ints.push_back(b.to_int());
    return true;
  }
  if (a.is_node()) return a.to_node()->name() == b.to_node()->name();
  if (a.is_double()) {
    return a.to_double() == b.to_double() || (std::isnan(a.to_double()) && std::isnan(b.to_double()));
  }
  if (a.is_list()) {
    if (a.to_list().size() != b.to_list().size()) return false;
    for (size_t i = 0; i < a.to_list().size(); ++i) {
      if (!same_but_ints(a.to_list()[i], b.to_list()[i], ints)) return false;
    }
    return true;
  }
  return a == b;
}

void collect_meta(const ValueMeta& v, std::vector<int64_t>& out) {
  for (const TensorMeta& m : v.tensors) {
    out.insert(out.end(), m.sizes.begin(), m.sizes.end());
    out.insert(out.end(), m.strides.begin(), m.strides.end());
  }
}

bool same_meta_but_sizes(const ValueMeta& a, const ValueMeta& b) {
  if (a.kind != b.kind || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].dtype != b.tensors[i].dtype || a.tensors[i].sizes.size() != b.tensors[i].sizes.size()) {
      return false;
    }
  }
  return true;
}

// The integers of one node in one trace: its arguments', then its
// metadata's (sizes and strides of each tensor).
struct NodeInts {
  std::vector<int64_t> args;
  std::vector<int64_t> meta;
};

class DynamicTrace {
 public:
  DynamicTrace(const TraceAt& trace_at, const std::vector<c10::IValue>& inputs,
               const std::vector<DynamicDim>& dims, bool meta_allowed)
      : trace_at_(trace_at), inputs_(inputs), meta_allowed_(meta_allowed) {
    auto flat = tree_flatten(c10::ivalue::Tuple::create(inputs), "input");
    leaves_ = std::move(flat.first);
    spec_ = std::move(flat.second);
    make_symbols(dims);
  }

  TraceResult run() {
    std::vector<std::vector<int64_t>> values = candidate_values();
    design_ = design_sizes(values);
    TraceResult first = trace_point(0);
    for (size_t j = 1; j < design_.points.size(); ++j) {
      TraceResult other = trace_point(j);
      if (meta_allowed_ && has_meta_constants(other.module)) {
        meta_allowed_ = false;  // constants must be compared by value: trace for real
        other = trace_point(j);
      }
      record(first.module, other.module, j);
    }
    ints_.insert(ints_.begin(), node_ints(first.module));
    build(first.module);
    check_small_sizes(first.module);
    return first;
  }

 private:
  void make_symbols(const std::vector<DynamicDim>& dims) {
    if (dims.empty()) throw TraceError("dynamic shapes: no dynamic dimension given");
    std::map<std::string, size_t> by_name;
    for (const DynamicDim& d : dims) {
      std::string what = "dynamic dimension " + (d.name.empty() ? std::string() : "'" + d.name + "' ") +
                         "(input " + std::to_string(d.input) + ", dim " + std::to_string(d.dim) + ")";
      if (d.input >= leaves_.size()) {
        throw TraceError(what + ": the program has " + std::to_string(leaves_.size()) + " input tensor(s)");
      }
      const int64_t rank = leaves_[d.input].dim();
      int64_t dim = d.dim < 0 ? d.dim + rank : d.dim;
      if (dim < 0 || dim >= rank) {
        throw TraceError(what + ": input " + std::to_string(d.input) + " has " + std::to_string(rank) +
                         " dimension(s)");
      }
      if (d.min < 0 || d.min > d.max) {
        throw TraceError(what + ": the range [" + std::to_string(d.min) + ", " + std::to_string(d.max) +
                         "] is empty or negative");
      }
      size_t s;
      auto it = d.name.empty() ? by_name.end() : by_name.find(d.name);
      if (it == by_name.end()) {
        s = symbols_.size();
        Symbol sym;
        sym.label = d.name.empty() ? symbol_name(s) : d.name;
        sym.min = d.min;
        sym.max = d.max;
        symbols_.push_back(std::move(sym));
        if (!d.name.empty()) by_name[d.name] = s;
      } else {
        s = it->second;
        symbols_[s].min = std::max(symbols_[s].min, d.min);
        symbols_[s].max = std::min(symbols_[s].max, d.max);
        if (symbols_[s].min > symbols_[s].max) {
          throw TraceError("dynamic shapes: the ranges given for '" + d.name + "' do not overlap");
        }
      }
      InputDim id{d.input, dim};
      for (const Symbol& other : symbols_) {
        if (std::find(other.dims.begin(), other.dims.end(), id) != other.dims.end()) {
          throw TraceError(what + " is given twice");
        }
      }
      symbols_[s].dims.push_back(id);
    }
    if (symbols_.size() > 4) {
      throw TraceError("dynamic shapes: " + std::to_string(symbols_.size()) +
                       " distinct dynamic sizes; torchcap takes up to 4 (give dimensions that are "
                       "always equal the same name)");
    }
  }

  // Each symbol's example size, or -1 where its dimensions' differ.
  std::vector<std::vector<int64_t>> candidate_values() const {
    std::vector<int64_t> example;
    for (const Symbol& s : symbols_) {
      int64_t e = leaves_[s.dims[0].input].size(s.dims[0].dim);
      for (const InputDim& d : s.dims) e = leaves_[d.input].size(d.dim) == e ? e : -1;
      example.push_back(e);
    }
    return candidate_sizes(symbols_, example);
  }

  std::string sizes_str(size_t j) const {
    std::string out;
    for (size_t s = 0; s < symbols_.size(); ++s) {
      out += (s ? ", " : "") + symbols_[s].label + "=" + std::to_string(design_.points[j][s]);
    }
    return out;
  }

  bool is_example(size_t j) const {
    for (size_t s = 0; s < symbols_.size(); ++s) {
      for (const InputDim& d : symbols_[s].dims) {
        if (leaves_[d.input].size(d.dim) != design_.points[j][s]) return false;
      }
    }
    return true;
  }

  // The example's tensors with the dynamic dimensions at point j's sizes.
  std::vector<c10::IValue> inputs_at(size_t j, bool meta) const {
    std::vector<c10::IValue> leaves;
    for (size_t i = 0; i < leaves_.size(); ++i) {
      at::Tensor t = leaves_[i];
      std::vector<int64_t> sizes = t.sizes().vec();
      for (size_t s = 0; s < symbols_.size(); ++s) {
        for (const InputDim& d : symbols_[s].dims) {
          if (d.input == i) sizes[d.dim] = design_.points[j][s];
        }
      }
      if (meta || t.is_meta()) {
        t = at::empty(sizes, t.options().device(c10::kMeta));
      } else {
        for (size_t d = 0; d < sizes.size(); ++d) {
          if (sizes[d] == t.size(static_cast<int64_t>(d))) continue;
          at::Tensor index = at::remainder(at::arange(sizes[d], t.options().dtype(c10::kLong)),
                                           t.size(static_cast<int64_t>(d)));
          t = t.index_select(static_cast<int64_t>(d), index);
        }
      }
      leaves.emplace_back(std::move(t));
    }
    return spec_.unflatten(leaves).toTupleRef().elements().vec();
  }

  TraceResult trace_point(size_t j) {
    if (j == 0 && is_example(0)) return trace_at_(inputs_, TraceAtOptions{});
    if (j > 0 && meta_allowed_) {
      try {
        return trace_at_(inputs_at(j, true), TraceAtOptions{true, true});
      } catch (const std::exception&) {
        meta_allowed_ = false;  // an operator without a meta kernel, say: trace for real
      }
    }
    try {
      return trace_at_(inputs_at(j, false), TraceAtOptions{false, j > 0});
    } catch (const std::exception& e) {
      throw TraceError("dynamic shapes: tracing at " + sizes_str(j) + " (the example is traced at " +
                       sizes_str(0) + ") failed: " + e.what() +
                       "\nThe program does not take these sizes: narrow the dimension's range, or "
                       "make the program accept every size in it");
    }
  }

  std::vector<NodeInts> node_ints(const GraphModule& gm) const {
    std::vector<NodeInts> out;
    out.reserve(gm.graph().size());
    for (const Node* n : gm.graph()) {
      NodeInts ni;
      for (const Argument& a : n->args()) collect_ints(a, ni.args);
      for (const auto& kv : n->kwargs()) collect_ints(kv.second, ni.args);
      collect_meta(n->meta().val, ni.meta);
      out.push_back(std::move(ni));
    }
    return out;
  }

  [[noreturn]] void differ(const Node& n, size_t j, const std::string& what) const {
    throw TraceError("dynamic shapes: the program records a different graph at " + sizes_str(j) +
                     " than at " + sizes_str(0) + ": at %" + n.name() + " (" + n.target() + "), " + what +
                     ". Control flow that depends on a dynamic size (a branch, a loop over a "
                     "dimension) cannot be captured; make the size fixed, or narrow its range to "
                     "one side of the branch" +
                     where(n));
  }

  // Aligns trace j's graph with the first's and keeps its integers.
  void record(const GraphModule& first, const GraphModule& other, size_t j) {
    const Graph& a = first.graph();
    const Graph& b = other.graph();
    std::vector<NodeInts> ints;
    ints.reserve(a.size());
    const Node* nb = b.first();
    for (const Node* na : a) {
      if (nb == nullptr) differ(*na, j, "the graph ends");
      if (na->op() != nb->op() || na->target() != nb->target() || na->name() != nb->name()) {
        differ(*na, j, "the other graph has %" + nb->name() + " (" + nb->target() + ")");
      }
      NodeInts ni;
      bool same = na->args().size() == nb->args().size() && na->kwargs().size() == nb->kwargs().size();
      const Argument* differing[2] = {nullptr, nullptr};
      for (size_t i = 0; same && i < na->args().size(); ++i) {
        same = same_but_ints(na->args()[i], nb->args()[i], ni.args);
        if (!same) differing[0] = &na->args()[i], differing[1] = &nb->args()[i];
      }
      for (size_t i = 0; same && i < na->kwargs().size(); ++i) {
        same = na->kwargs()[i].first == nb->kwargs()[i].first &&
               same_but_ints(na->kwargs()[i].second, nb->kwargs()[i].second, ni.args);
        if (!same) differing[0] = &na->kwargs()[i].second, differing[1] = &nb->kwargs()[i].second;
      }
      if (!same && differing[0] != nullptr && differing[0]->is_double() && differing[1]->is_double()) {
        // x / math.sqrt(x.shape[1]): Python computes the number from the
        // size, and the operator takes it as a constant.
        std::ostringstream what;
        what << "dynamic shapes: at %" << na->name() << " (" << na->target() << "), the program gives the number "
             << differing[0]->to_double() << " at " << sizes_str(0) << " and " << differing[1]->to_double()
             << " at " << sizes_str(j)
             << ": a float computed from a dynamic size outside tensor operators (math.sqrt of a size, "
                "say) is a constant of the graph, which would be wrong at other sizes. Compute it "
                "with tensor operations from the size (x.new_full((), x.shape[1]).sqrt()), or make "
                "the size fixed"
             << where(*na);
        throw TraceError(what.str());
      }
      if (!same) differ(*na, j, "the arguments differ in more than sizes");
      if (!same_meta_but_sizes(na->meta().val, nb->meta().val)) {
        differ(*na, j, "the result is " + nb->meta().val.str() + " there, " + na->meta().val.str() + " here");
      }
      collect_meta(nb->meta().val, ni.meta);
      ints.push_back(std::move(ni));
      nb = nb->next();
    }
    if (nb != nullptr) differ(*nb, j, "the other graph goes on");
    if (first.in_spec.str() != other.in_spec.str() || first.out_spec.str() != other.out_spec.str() ||
        !(first.output_specs == other.output_specs)) {
      throw TraceError("dynamic shapes: the program's inputs or outputs have another structure at " +
                       sizes_str(j) + " than at " + sizes_str(0) + " (outputs " + other.out_spec.str() +
                       " against " + first.out_spec.str() + ")");
    }
    if (first.attributes().size() != other.attributes().size()) {
      throw TraceError("dynamic shapes: the program reads " + std::to_string(other.attributes().size()) +
                       " tensors of its own at " + sizes_str(j) + " but " +
                       std::to_string(first.attributes().size()) + " at " + sizes_str(0));
    }
    for (size_t i = 0; i < first.attributes().size(); ++i) {
      const Attribute& x = first.attributes()[i];
      const Attribute& y = other.attributes()[i];
      if (x.value.defined() != y.value.defined()) {
        throw TraceError("dynamic shapes: the tensor '" + x.name + "' the program reads is defined at " +
                         "one size and not at another");
      }
      if (!x.value.defined()) continue;
      if (x.name != y.name || x.value.sizes() != y.value.sizes() || x.value.dtype() != y.value.dtype()) {
        throw TraceError("dynamic shapes: the tensor '" + x.name + "' the program reads has sizes " +
                         c10::str(x.value.sizes()) + " at " + sizes_str(0) + " but '" + y.name + "' " +
                         c10::str(y.value.sizes()) + " at " + sizes_str(j) +
                         ": a constant made outside the traced operators from a dynamic size");
      }
      // A constant the program made from a size (x / math.sqrt(x.shape[1])
      // in Python lifts the number as a tensor) has other values at other
      // sizes: baked in, it would be wrong at every size but the first.
      if (x.kind == AttributeKind::Constant && !x.value.is_meta() && !y.value.is_meta() &&
          !at::equal(x.value, y.value)) {
        throw TraceError("dynamic shapes: the constant '" + x.name + "' has other values at " +
                         sizes_str(j) + " than at " + sizes_str(0) +
                         ": a number computed from a dynamic size (math.sqrt(x.shape[1]), say) "
                         "became a constant. Compute it with tensor operations, or make the size "
                         "fixed" + constant_user(first, x.name));
      }
    }
    ints_.push_back(std::move(ints));
  }

  // Whether a meta-mode trace holds a lifted constant without values, which
  // alignment could not compare with the first trace's.
  static bool has_meta_constants(const GraphModule& gm) {
    for (const Attribute& a : gm.attributes()) {
      if (a.kind == AttributeKind::Constant && a.value.defined() && a.value.is_meta()) return true;
    }
    return false;
  }

  // The source of the first node that reads attribute `name`, for messages.
  static std::string constant_user(const GraphModule& gm, const std::string& name) {
    for (const Node* n : gm.graph()) {
      if (n->op() != OpCode::GetAttr || n->target() != name) continue;
      for (const Node* user : n->users()) return "\nread by %" + user->name() + " (" + user->target() + ")" + where(*user);
    }
    return "";
  }

  // The expression of the integer at `index` in each trace's `member`.
  const SizeExpr* expression(size_t node, size_t index, bool meta, std::vector<int64_t>& v) {
    v.clear();
    for (const std::vector<NodeInts>& trace : ints_) {
      const NodeInts& ni = trace[node];
      const std::vector<int64_t>& list = meta ? ni.meta : ni.args;
      v.push_back(list[index]);
    }
    bool constant = std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; });
    if (constant) return nullptr;
    auto it = fitted_.find(v);
    if (it != fitted_.end()) return it->second ? &*it->second : &unfit_;
    std::optional<SizeExpr> e = fit_sizes(design_, v);
    auto& slot = fitted_[v];
    slot = std::move(e);
    return slot ? &*slot : &unfit_;
  }

  [[noreturn]] void unfit(const Node& n, const std::string& what, const std::vector<int64_t>& v) const {
    std::string seen;
    for (size_t j = 0; j < v.size(); ++j) seen += "\n  " + std::to_string(v[j]) + " at " + sizes_str(j);
    throw TraceError("dynamic shapes: %" + n.name() + " (" + n.target() + "): " + what +
                     " depends on the dynamic sizes in a way torchcap cannot express (an integer "
                     "polynomial of degree 2 or less in them); it was:" +
                     seen + where(n));
  }

  // Builds the nodes computing `e` before `user`.
  Argument size_node(Graph& g, const SizeExpr& e, Node* user, const std::vector<Node*>& inputs) {
    if (e.is_constant()) return Argument(e.constant_term());
    auto it = made_.find(e.str());
    if (it != made_.end()) return Argument(it->second);
    auto guard = g.inserting_before(user);
    auto symbol_node = [&](uint8_t s) {
      SizeExpr key = SizeExpr::symbol(s);
      auto found = made_.find(key.str());
      if (found != made_.end()) return found->second;
      const InputDim& d = symbols_[s].dims[0];
      Node* n = g.size_computation(kSymSize, {inputs[d.input], d.dim});
      made_[key.str()] = n;
      return n;
    };
    auto monomial_node = [&](const Monomial& m) {
      Node* acc = symbol_node(m[0]);
      std::vector<SizeExpr::Term> so_far = {SizeExpr::Term{1, Monomial{m[0]}}};
      for (size_t i = 1; i < m.size(); ++i) {
        so_far[0].symbols.push_back(m[i]);
        std::string key = SizeExpr::of_terms(so_far).str();
        auto found = made_.find(key);
        if (found != made_.end()) {
          acc = found->second;
          continue;
        }
        acc = g.size_computation("mul", {acc, symbol_node(m[i])});
        made_[key] = acc;
      }
      return acc;
    };
    Argument acc;
    bool started = false;
    // Terms with a positive coefficient first, so the sum starts from one.
    std::vector<SizeExpr::Term> terms = e.terms();
    std::stable_partition(terms.begin(), terms.end(), [](const auto& t) { return t.coefficient > 0; });
    for (const SizeExpr::Term& t : terms) {
      if (t.symbols.empty()) {
        if (!started) {
          acc = Argument(t.coefficient);
          started = true;
        } else {
          acc = Argument(g.size_computation(t.coefficient > 0 ? "add" : "sub",
                                            {acc, t.coefficient > 0 ? t.coefficient : -t.coefficient}));
        }
        continue;
      }
      Node* m = monomial_node(t.symbols);
      int64_t magnitude = t.coefficient > 0 ? t.coefficient : -t.coefficient;
      if (!started) {
        acc = t.coefficient == 1 ? Argument(m) : Argument(g.size_computation("mul", {m, t.coefficient}));
        started = true;
        continue;
      }
      Argument scaled = magnitude == 1 ? Argument(m) : Argument(g.size_computation("mul", {m, magnitude}));
      acc = Argument(g.size_computation(t.coefficient > 0 ? "add" : "sub", {acc, scaled}));
    }
    made_[e.str()] = acc.to_node();
    return acc;
  }

  Argument rebuild(Graph& g, const Argument& a, Node* user, size_t node, size_t& index,
                   const std::vector<Node*>& inputs) {
    if (a.is_int()) {
      std::vector<int64_t> v;
      const SizeExpr* e = expression(node, index++, false, v);
      if (e == nullptr) return a;
      if (e == &unfit_) unfit(*user, "an integer argument", v);
      return size_node(g, *e, user, inputs);
    }
    if (a.is_list()) {
      ArgumentList out;
      for (const Argument& x : a.to_list()) out.push_back(rebuild(g, x, user, node, index, inputs));
      return Argument(std::move(out));
    }
    return a;
  }

  void build(GraphModule& gm) {
    Graph& g = gm.graph();
    std::vector<Node*> inputs = g.placeholders();
    std::vector<Node*> nodes = g.nodes();
    std::vector<int64_t> v;
    for (size_t i = 0; i < nodes.size(); ++i) {
      Node* n = nodes[i];
      // Metadata: each tensor's sizes, then strides.
      size_t index = 0;
      for (TensorMeta& m : n->meta().val.tensors) {
        auto shape = std::make_shared<SymbolicShape>();
        bool symbolic = false;
        for (std::vector<SizeExpr>* exprs : {&shape->sizes, &shape->strides}) {
          for (size_t d = 0; d < m.sizes.size(); ++d) {
            const SizeExpr* e = expression(i, index++, true, v);
            if (e == &unfit_) unfit(*n, "a size or stride of its result", v);
            symbolic = symbolic || e != nullptr;
            exprs->push_back(e != nullptr ? *e : SizeExpr::constant(v[0]));
          }
        }
        if (symbolic) m.symbolic = std::move(shape);
      }
      if (n->op() != OpCode::CallFunction) continue;
      size_t arg = 0;
      ArgumentList args;
      for (const Argument& a : n->args()) args.push_back(rebuild(g, a, n, i, arg, inputs));
      Kwargs kwargs;
      for (const auto& kv : n->kwargs()) kwargs.emplace_back(kv.first, rebuild(g, kv.second, n, i, arg, inputs));
      if (args != n->args()) n->set_args(std::move(args));
      if (kwargs != n->kwargs()) n->set_kwargs(std::move(kwargs));
    }
    gm.symbols = symbols_;
    try {
      gm.lint();
    } catch (const LintError& e) {
      throw TraceError(std::string("dynamic shapes: a size that depends on a dynamic dimension reaches "
                                   "an argument that takes no size (a Scalar or a float, say): ") +
                       e.what());
    }
  }

  // Sizes below 2 are not traced (LibTorch takes other paths there), so a
  // range that reaches down to them is checked on the graph itself: at each
  // such symbol's minimum (the others at the first trace's sizes, then all
  // at their minimums together), the shapes the graph's operators compute,
  // by shape propagation on meta tensors, must be those its expressions
  // give. A program that squeezes a size-1 batch away fails here.
  void check_small_sizes(const GraphModule& gm) const {
    std::vector<SizePoint> points;
    SizePoint all_min = design_.points[0];
    for (size_t s = 0; s < symbols_.size(); ++s) {
      if (symbols_[s].min >= 2) continue;
      SizePoint p = design_.points[0];
      p[s] = all_min[s] = symbols_[s].min;
      points.push_back(std::move(p));
    }
    if (points.size() > 1) points.push_back(all_min);
    for (const SizePoint& p : points) {
      std::string sizes;
      for (size_t s = 0; s < symbols_.size(); ++s) {
        sizes += (s ? ", " : "") + symbols_[s].label + "=" + std::to_string(p[s]);
      }
      GraphModule fixed = specialize(gm, p);
      std::vector<ValueMeta> expected;
      for (const Node* n : fixed.graph()) expected.push_back(n->meta().val);
      try {
        propagate_shapes(fixed);
      } catch (const std::exception& e) {
        throw TraceError("dynamic shapes: the graph cannot be checked at " + sizes +
                         ", the smallest sizes asked for (" + e.what() +
                         "); give the dimensions a minimum of 2");
      }
      size_t i = 0;
      for (const Node* n : fixed.graph()) {
        const ValueMeta& want = expected[i++];
        const ValueMeta& got = n->meta().val;
        bool same = want.tensors.size() == got.tensors.size();
        for (size_t k = 0; same && k < want.tensors.size(); ++k) {
          same = want.tensors[k].sizes == got.tensors[k].sizes;
        }
        if (!same) {
          throw TraceError("dynamic shapes: at " + sizes + " %" + n->name() + " (" + n->target() +
                           ") would compute " + got.str() + " where the sizes traced at 2 and more give " +
                           want.str() + ": the program takes another path at that size. Give the "
                           "dimension a minimum of 2, or trace that size as a graph of its own" +
                           where(*n));
        }
      }
    }
  }

  const TraceAt& trace_at_;
  const std::vector<c10::IValue>& inputs_;
  bool meta_allowed_;
  std::vector<at::Tensor> leaves_;
  TreeSpec spec_;
  std::vector<Symbol> symbols_;
  SizeDesign design_;
  // Per trace (the first one first), per node of the first graph.
  std::vector<std::vector<NodeInts>> ints_;
  std::map<std::vector<int64_t>, std::optional<SizeExpr>> fitted_;
  SizeExpr unfit_ = SizeExpr::constant(-1);
  std::unordered_map<std::string, Node*> made_;
};

}  // namespace

TraceResult trace_dynamic(const TraceAt& trace_at, const std::vector<c10::IValue>& inputs,
                          const std::vector<DynamicDim>& dims, bool meta_allowed) {
  return DynamicTrace(trace_at, inputs, dims, meta_allowed).run();
}

}  // namespace detail
}  // namespace torchcap
