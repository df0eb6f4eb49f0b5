// Memory planning: every intermediate tensor of a graph gets an offset in one
// arena, from its lifetime and its recorded size, so that a run can place all
// of them in one block allocated ahead of time (ExecuTorch's
// `memory_planning.py`, docs/STYLE.md 11).
//
// A plan is data, independent of the Graph it was made from: values are named
// by node name and output index, so a plan can be printed, saved, drawn, or
// used by an interpreter built from a copy of the graph. Steps are node
// positions in graph order (placeholders and attributes count).
//
// Note [What shares a buffer]
// A buffer is made by an operator result that aliases nothing. Every value
// that shares its storage belongs to it and extends its lifetime: views and
// in-place or out= results (the schema's alias annotations say which
// argument they alias), `getitem`s of multi-output results, elements of
// Tensor[] results. A buffer some value of which is a graph input, an
// attribute or a graph output is not planned: its memory is not the run's to
// place.
#pragma once

#include <torchcap/error.h>
#include <torchcap/graph.h>
#include <torchcap/meta.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchcap {

// A memory plan that breaks its own rules (two values live at once share
// bytes, a misaligned offset, a value outside the arena).
class MemoryPlanError : public Error {
 public:
  using Error::Error;
};

// One planned buffer: a tensor result that aliases nothing, with everything
// that shares its storage.
struct PlannedValue {
  std::string node;    // the node whose result makes the buffer
  int32_t output = 0;  // which result of the node (0 for a single one)
  bool one_of_several = false;  // the node has several results (a tuple or Tensor[])
  TensorMeta meta;     // dtype, sizes, strides as recorded
  int64_t size = 0;    // bytes the tensor's elements span (its strides included)
  int64_t offset = 0;  // in the arena; a multiple of MemoryPlan::kAlignment
  int32_t first = 0;   // step that writes it
  int32_t last = 0;    // last step that reads it or one of its aliases (inclusive)
  // Values that share the buffer: views, in-place results, getitems.
  std::vector<std::string> aliases;

  // `node` or `node[output]` for one result of several.
  std::string label() const;
  bool overlaps_in_time(const PlannedValue& o) const { return first <= o.last && o.first <= last; }
};

// A tensor result the plan leaves to the allocator, and why.
struct UnplannedValue {
  std::string node;
  int32_t output = 0;
  std::string reason;  // "returned by the graph", "aliases an input", ...
};

// How an operator node can write its result into planned memory: through
// the `.out` overload whose schema matches its own, if there is one with a
// kernel of its own.
struct OperatorPlan {
  std::string node;
  std::string target;       // aten::addmm
  std::string out_variant;  // aten::addmm.out, empty when none is usable
  std::string fallback;     // why not: empty when the out variant is used
};

struct MemoryPlan {
  static constexpr int64_t kAlignment = 64;

  int64_t arena_bytes = 0;  // the chosen plan's arena
  std::string algorithm;    // which algorithm the chosen plan comes from
  // The same figure for each algorithm tried, and the references.
  int64_t naive_bytes = 0;        // every buffer its own memory, no reuse
  int64_t greedy_bytes = 0;       // ExecuTorch's greedy (shared objects by size)
  int64_t best_fit_bytes = 0;     // greedy by size over free gaps, best fit
  int64_t lower_bound_bytes = 0;  // most (aligned) bytes live at one step
  int32_t peak_step = 0;          // a step where the lower bound is reached
  int32_t num_steps = 0;          // nodes in the graph
  std::vector<std::string> step_nodes;  // the node at each step

  std::vector<PlannedValue> values;  // in order of definition
  std::vector<UnplannedValue> unplanned;
  // Operator nodes that make planned buffers, in graph order.
  std::vector<OperatorPlan> operators;

  // The buffers live at `step`, by offset.
  std::vector<const PlannedValue*> live_at(int32_t step) const;
  // The planned buffer made by result `output` of `node`, or nullptr.
  const PlannedValue* find(const std::string& node, int32_t output = 0) const;
};

// Which offset algorithms plan_memory runs; it keeps the smallest arena.
struct MemoryPlanOptions {
  bool greedy = true;
  bool best_fit = true;
};

// Plans the intermediate tensors of `g` from their recorded metadata ("val").
// Tensors without metadata, or not on the CPU, are left unplanned (listed with
// the reason). The result passes verify_memory_plan.
MemoryPlan plan_memory(const Graph& g, const MemoryPlanOptions& options = {});

// Throws MemoryPlanError naming the two values if two buffers live at the
// same step share a byte, or naming the value if it is misaligned or does
// not fit in the arena.
void verify_memory_plan(const MemoryPlan& plan);

// The `.out` overload of `op` whose schema is op's own plus one written
// tensor argument per return (aten::add.Tensor -> aten::add.out,
// aten::topk -> aten::topk.values), or nullopt.
std::optional<c10::OperatorHandle> find_out_variant(const c10::OperatorHandle& op);

}  // namespace torchcap
