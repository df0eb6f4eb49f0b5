// plan_memory: buffers and their lifetimes from the graph, offsets from the
// algorithms in memory_plan_offsets.cpp.
#include <torchcap/memory_plan.h>

#include "graph/data_dependence.h"
#include "graph/ivalue_conversion.h"
#include "graph/operator_facts.h"
#include "graph/operator_name.h"
#include "graph/schema_check.h"
#include "passes/memory_plan_offsets.h"
#include "passes/out_variants.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace torchcap {

std::string PlannedValue::label() const {
  return one_of_several ? node + "[" + std::to_string(output) + "]" : node;
}

std::vector<const PlannedValue*> MemoryPlan::live_at(int32_t step) const {
  std::vector<const PlannedValue*> live;
  for (const PlannedValue& v : values) {
    if (v.first <= step && step <= v.last && v.size > 0) live.push_back(&v);
  }
  std::sort(live.begin(), live.end(),
            [](const PlannedValue* a, const PlannedValue* b) { return a->offset < b->offset; });
  return live;
}

const PlannedValue* MemoryPlan::find(const std::string& node, int32_t output) const {
  for (const PlannedValue& v : values) {
    if (v.node == node && v.output == output) return &v;
  }
  return nullptr;
}

// --- Out variants -------------------------------------------------------------

std::optional<c10::OperatorHandle> find_out_variant(const c10::OperatorHandle& op) {
  return detail::operator_facts(op).out_variant;
}

namespace detail {

// Note [Equivalent out kernels]
// LibTorch 1.13's CPU kernel of `relu` is `clamp_min(self, 0)`, but
// `relu.out` is a generated composite (compute, then copy). Running
// `clamp_min.out(self, 0, out)` runs the kernel relu runs, into the buffer:
// the same bits (the planned-run tests compare them), no allocation.
std::optional<OutForm> out_form(const c10::OperatorHandle& functional) {
  const c10::FunctionSchema& schema = functional.schema();
  if (schema.name() == "aten::relu" && schema.overload_name().empty()) {
    auto clamp_min = c10::Dispatcher::singleton().findOp({"aten::clamp_min", "out"});
    if (clamp_min) return OutForm{*clamp_min, {c10::IValue(c10::Scalar(0))}};
  }
  std::optional<c10::OperatorHandle> out = find_out_variant(functional);
  if (!out) return std::nullopt;
  return OutForm{*out, {}};
}

}  // namespace detail

// --- Buffers and lifetimes ----------------------------------------------------

namespace {

int64_t span_bytes(const TensorMeta& m) {
  int64_t extent = 1;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return 0;
    extent += (m.sizes[d] - 1) * (d < m.strides.size() ? m.strides[d] : 1);
  }
  return extent * static_cast<int64_t>(c10::elementSize(m.dtype));
}

// Note [Views without alias annotations]
// A few operators return views of `self` although their schemas say
// nothing: the `unsafe` ones, which skip autograd's view tracking. Their
// results share `self`'s buffer like any view's.
bool is_unannotated_view(const c10::FunctionSchema& s) {
  static const char* const kNames[] = {"aten::_unsafe_view", "aten::unsafe_split", "aten::unsafe_chunk",
                                       "aten::unsafe_split_with_sizes"};
  for (const char* name : kNames) {
    if (s.name() == name) return true;
  }
  return false;
}

struct Buffer {
  const Node* node = nullptr;
  int32_t output = 0;
  bool one_of_several = false;
  const TensorMeta* meta = nullptr;  // null when not recorded
  int32_t first = 0;
  int32_t last = 0;
  std::vector<std::string> aliases;
  std::string unplanned;  // why not planned; empty if planned
};

// Note [What shares a buffer] (memory_plan.h).
class BufferAnalysis {
 public:
  explicit BufferAnalysis(const Graph& g) : data_dependent_(detail::nodes_of_data_dependent_shape(g)) {
    int32_t step = 0;
    for (const Node* n : g) {
      define(*n, step);
      for (const Node* in : n->inputs()) use(*in, *n, step);
      ++step;
    }
    num_steps_ = step;
  }

  std::vector<Buffer>& buffers() { return buffers_; }
  int32_t num_steps() const { return num_steps_; }

 private:
  std::unordered_set<const Node*> data_dependent_;
  static constexpr int32_t kExternal = -1;  // a graph input or attribute
  static constexpr int32_t kNoTensor = -2;  // not a tensor

  using Key = std::pair<const Node*, int32_t>;
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<const void*>()(k.first) ^ (k.second * 31); }
  };

  void define(const Node& n, int32_t step) {
    switch (n.op()) {
      case OpCode::Placeholder:
      case OpCode::GetAttr:
        root_[{&n, 0}] = kExternal;
        return;
      case OpCode::Output:
        return;
      case OpCode::CallFunction:
        break;
    }
    if (n.is_getitem()) {
      const Node* source = n.args()[0].to_node();
      int32_t root = root_of(source, static_cast<int32_t>(n.args()[1].to_int()));
      root_[{&n, 0}] = root;
      add_alias(root, n);
      return;
    }
    if (n.is_size_computation()) return;  // an integer
    const c10::FunctionSchema& schema = n.schema();
    const auto& returns = schema.returns();
    detail::Produces produces = detail::produces(n);
    if (produces == detail::Produces::Nothing || produces == detail::Produces::Scalar) return;
    const ValueMeta& val = n.meta().val;
    int32_t count = produces == detail::Produces::TensorList
                        ? (val.kind == ValueKind::List ? static_cast<int32_t>(val.tensors.size()) : 0)
                        : static_cast<int32_t>(returns.size());
    std::vector<const Argument*> given;
    const detail::OperatorFacts& facts = n.facts();
    bool unannotated_view = is_unannotated_view(schema);
    for (int32_t i = 0; i < count; ++i) {
      const std::vector<c10::Symbol>& sets =
          facts.return_sets[produces == detail::Produces::TensorList ? 0 : i];
      if (unannotated_view) {
        const Argument& self = n.args().at(0);
        int32_t root = self.is_node() ? root_of(self.to_node(), 0) : kNoTensor;
        root_[{&n, i}] = root;
        add_alias(root, n);
        continue;
      }
      if (!sets.empty()) {
        if (given.empty()) given = detail::given_arguments(n);
        int32_t root = aliased_root(facts, given, sets);
        root_[{&n, i}] = root;
        add_alias(root, n);
        continue;
      }
      Buffer b;
      b.node = &n;
      b.output = i;
      b.one_of_several = produces != detail::Produces::Tensor;
      b.first = b.last = step;
      if (val.kind != ValueKind::Unknown && static_cast<size_t>(i) < val.tensors.size()) {
        b.meta = &val.tensors[i];
      }
      if (b.meta == nullptr) {
        b.unplanned = "no recorded metadata";
      } else if (b.meta->device.type() != c10::kCPU) {
        b.unplanned = "not on the CPU";
      } else if (data_dependent_.count(&n) != 0) {
        // Note [Shapes that depend on values]: the recorded size is one run's.
        b.unplanned = "its size depends on tensor values";
      }
      root_[{&n, i}] = static_cast<int32_t>(buffers_.size());
      buffers_.push_back(std::move(b));
    }
  }

  // The buffer the argument sharing `alias`'s set belongs to.
  int32_t aliased_root(const detail::OperatorFacts& facts, const std::vector<const Argument*>& given,
                       const std::vector<c10::Symbol>& sets) {
    for (size_t p = 0; p < facts.argument_sets.size(); ++p) {
      if (given[p] == nullptr) continue;
      bool shares = false;
      for (const c10::Symbol& s : facts.argument_sets[p]) {
        shares = shares || std::find(sets.begin(), sets.end(), s) != sets.end();
      }
      if (!shares) continue;
      int32_t root = kExternal;
      bool found = false;
      given[p]->for_each_node([&](Node* m) {
        if (!found) {
          root = root_of(m, 0);
          found = true;
        }
      });
      if (found) return root;
    }
    return kNoTensor;
  }

  // One entry per node, however many of its results share the buffer.
  void add_alias(int32_t root, const Node& n) {
    if (root < 0) return;
    std::vector<std::string>& aliases = buffers_[root].aliases;
    if (aliases.empty() || aliases.back() != n.name()) aliases.push_back(n.name());
  }

  int32_t root_of(const Node* n, int32_t output) const {
    auto it = root_.find({n, output});
    return it == root_.end() ? kNoTensor : it->second;
  }

  // `user` at `step` reads `in`: every buffer `in` shares is live until then.
  void use(const Node& in, const Node& user, int32_t step) {
    if (user.is_getitem()) return;  // an alias, not a read (Note [What shares a buffer])
    for (int32_t i = 0;; ++i) {
      auto it = root_.find({&in, i});
      if (it == root_.end()) break;
      if (it->second < 0) continue;
      Buffer& b = buffers_[it->second];
      b.last = std::max(b.last, step);
      if (user.op() == OpCode::Output && b.unplanned.empty()) b.unplanned = "returned by the graph";
    }
  }

  std::unordered_map<Key, int32_t, KeyHash> root_;
  std::vector<Buffer> buffers_;
  int32_t num_steps_ = 0;
};

// Which out variant, if any, a node's planned results are written through.
OperatorPlan operator_plan(const Node& n, bool all_results_planned) {
  OperatorPlan op;
  op.node = n.name();
  op.target = n.target();
  std::optional<detail::OutForm> form = detail::out_form(n.op_handle());
  if (!form) {
    op.fallback = "no out variant";
    return op;
  }
  const c10::OperatorHandle* out = &form->op;
  std::string name = detail::qualified_name(out->operator_name());
  // Note [Out variants that write in place]
  // An out variant with a CPU kernel of its own computes into the buffer it
  // is given. Many in LibTorch 1.13 are composites instead, generated for
  // functional operators: they compute into a fresh tensor and copy it into
  // the buffer, which saves nothing and costs a copy; some have no kernel.
  if (!out->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
    bool composite = out->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
                     out->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    op.fallback = composite ? name + " is a composite that allocates and copies"
                            : name + " has no CPU kernel";
    return op;
  }
  if (!all_results_planned) {
    op.fallback = "not every result is planned";
    return op;
  }
  op.out_variant = name;
  return op;
}

}  // namespace

MemoryPlan plan_memory(const Graph& g, const MemoryPlanOptions& options) {
  BufferAnalysis analysis(g);
  MemoryPlan plan;
  plan.num_steps = analysis.num_steps();
  plan.step_nodes.reserve(plan.num_steps);
  for (const Node* n : g) plan.step_nodes.push_back(n->name());

  std::vector<detail::Lifetime> items;
  std::vector<const Node*> creators;
  std::unordered_map<const Node*, bool> all_planned;
  std::unordered_set<const Node*> makes_planned;
  for (Buffer& b : analysis.buffers()) {
    if (creators.empty() || creators.back() != b.node) creators.push_back(b.node);
    bool planned = b.unplanned.empty();
    auto [it, fresh] = all_planned.emplace(b.node, planned);
    if (!fresh) it->second = it->second && planned;
    if (!planned) {
      plan.unplanned.push_back(UnplannedValue{b.node->name(), b.output, b.unplanned});
      continue;
    }
    makes_planned.insert(b.node);
    PlannedValue v;
    v.node = b.node->name();
    v.output = b.output;
    v.one_of_several = b.one_of_several;
    v.meta = *b.meta;
    v.size = span_bytes(v.meta);
    v.first = b.first;
    v.last = b.last;
    v.aliases = std::move(b.aliases);
    items.push_back(detail::Lifetime{detail::align_up(v.size, MemoryPlan::kAlignment), v.first, v.last});
    plan.values.push_back(std::move(v));
  }
  for (const Node* n : creators) {
    if (makes_planned.count(n) > 0) plan.operators.push_back(operator_plan(*n, all_planned[n]));
  }

  for (const detail::Lifetime& l : items) plan.naive_bytes += l.size;
  detail::LowerBound bound = detail::live_bytes_bound(items, plan.num_steps);
  plan.lower_bound_bytes = bound.bytes;
  plan.peak_step = bound.step;

  std::vector<int64_t> greedy, best_fit;
  plan.greedy_bytes = detail::greedy_shared_objects(items, greedy);
  plan.best_fit_bytes = detail::best_fit_offsets(items, best_fit);
  const std::vector<int64_t>* chosen = nullptr;
  if (options.greedy) {
    chosen = &greedy;
    plan.arena_bytes = plan.greedy_bytes;
    plan.algorithm = "greedy";
  }
  if (options.best_fit && (chosen == nullptr || plan.best_fit_bytes < plan.arena_bytes)) {
    chosen = &best_fit;
    plan.arena_bytes = plan.best_fit_bytes;
    plan.algorithm = "best_fit";
  }
  if (chosen == nullptr) {
    throw Error("plan_memory: no algorithm enabled in MemoryPlanOptions");
  }
  for (size_t i = 0; i < plan.values.size(); ++i) plan.values[i].offset = (*chosen)[i];
  verify_memory_plan(plan);
  return plan;
}

}  // namespace torchcap
