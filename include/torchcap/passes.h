// Graph passes: free functions that take a graph and return whether they
// changed it (docs/STYLE.md 10), and a pass manager that runs a list of them.
#pragma once

#include <torchcap/error.h>
#include <torchcap/graph.h>
#include <torchcap/graph_module.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torchcap {

// Removes nodes whose values are never used and that have no side effects
// (see Node::has_side_effects). Placeholders and the output always stay.
bool eliminate_dead_code(Graph& g);

// Replaces each call of a pure operator that repeats an earlier call with the
// same target and the same arguments by that earlier call's result. Pure: no
// written argument (declared or hidden), no view of an argument, not random
// (operators tagged nondeterministic_seeded or taking a generator stay
// distinct), something returned. get_attr and getitem nodes are merged too.
// The duplicates lose their users; eliminate_dead_code removes them.
bool eliminate_common_subexpressions(Graph& g);

// Recomputes every node's "val" (dtype, shape, strides) by running the graph
// on meta tensors, which carry shapes but no data: no real kernel runs.
// Placeholders keep their recorded metadata (they are the starting point;
// throws Error naming one that has none); attributes are read from the
// module. Devices are carried over from the inputs. Throws Error naming the
// node if an operator has no meta implementation. Returns whether any val
// changed. On a dynamic graph (symbolic.h), sizes and strides come out as
// expressions of its symbols (Note [Shapes of a dynamic graph] in
// src/passes/shape_propagation.cpp).
bool propagate_shapes(GraphModule& gm);

// --- Dynamic graphs (symbolic.h) ----------------------------------------------

// The value of each of a dynamic graph's symbols in a call with these flat
// input tensors (one per placeholder). Checks every input against its
// placeholder's recorded dtype, rank and sizes, fixed or symbolic: a size
// out of its symbol's range, or two dimensions of one symbol that differ,
// throw one InputError naming the inputs, dimensions and conditions.
std::vector<int64_t> symbol_values(const GraphModule& gm, c10::ArrayRef<at::Tensor> inputs);

// The graph of a dynamic module at fixed sizes (one value per symbol, each
// in its range): size computations become constants and metadata takes the
// sizes and strides its expressions give. The result has no symbols, shares
// the attributes, and runs wherever a traced graph does.
GraphModule specialize(const GraphModule& gm, c10::ArrayRef<int64_t> values);

// The symbols' values at the sizes a dynamic graph was traced with (its
// placeholders' recorded sizes). The graph must pass lint.
std::vector<int64_t> traced_symbol_values(const GraphModule& gm);

// --- Analyses ------------------------------------------------------------------

// Whether `g` is free of mutation and aliasing: no operator that writes an
// argument (declared or not) and no view operator (one whose result aliases an
// argument); `*_copy` operators are fine.
bool is_functional(const Graph& g);
// The first node that makes `g` not functional, and why ("%add_ (aten::add_.Tensor)
// writes its argument 'self'"), or nullopt.
std::optional<std::string> find_mutation_or_view(const Graph& g);

// Thrown when a pass fails; says which pass and which ran before it.
class PassError : public Error {
 public:
  using Error::Error;
};

// Runs passes in order, optionally until none changes the graph (a
// fixpoint). In debug builds (or when asked) the module is linted after each
// pass. If a pass throws, or leaves a graph that does not lint, PassError
// names it and the passes that ran before it in this run.
class PassManager {
 public:
  using PassFn = std::function<bool(GraphModule&)>;

  PassManager& add(std::string name, PassFn pass);
  // A pass on the graph alone (eliminate_dead_code, ...).
  PassManager& add(std::string name, bool (*pass)(Graph&));

  PassManager& until_fixpoint(size_t max_rounds = 16) {
    fixpoint_ = true;
    max_rounds_ = max_rounds;
    return *this;
  }
  PassManager& lint_after_each_pass(bool on) {
    lint_ = on;
    return *this;
  }

  // Returns whether any pass changed the module.
  bool run(GraphModule& gm) const;

  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
  std::vector<PassFn> passes_;
  bool fixpoint_ = false;
  size_t max_rounds_ = 1;
#ifdef NDEBUG
  bool lint_ = false;
#else
  bool lint_ = true;
#endif
};

// --- For inference -----------------------------------------------------------------

// Makes an inference graph (traced or exported in eval mode) faster to run,
// TorchScript's freeze + optimize_for_inference for torchcap graphs: the
// "optimize" pipeline below (batch norms folded into convolutions, what is
// computed from attributes alone computed once, no-op calls removed,
// repeated and dead calls removed, convolutions run by oneDNN or XNNPACK
// with packed weights and a fused relu or clamp on channels-last
// activations; docs/optimize.md). Results equal the graph's to float
// rounding (the tolerance is in docs/optimize.md). The graph stays a
// portable file: weights are saved unpacked, and an Interpreter packs them
// once when it is made, so weights changed after that are not seen by it.
// Throws Error, changing nothing, for a graph that is not an inference
// graph: one that updates buffers or inputs (a batch norm in training mode,
// a training step). Returns whether it changed the graph.
bool optimize_for_inference(GraphModule& gm);

// --- Passes by name -------------------------------------------------------------
// What the command's `trace --passes` and Python's `passes=` take: the name of
// a pass or of a pipeline (named passes run to a fixpoint), comma-free.

struct NamedPass {
  std::string name;     // "dce"
  std::string summary;  // one line, for --help
  PassManager::PassFn run;
};

struct NamedPipeline {
  std::string name;                 // "cleanup"
  std::string summary;              // one line, for --help
  std::vector<std::string> passes;  // run in order until none changes the module
};

// Every pass and pipeline that has a name, in the order --help lists them.
const std::vector<NamedPass>& named_passes();
const std::vector<NamedPipeline>& named_pipelines();

// A pass manager that runs the passes and pipelines `names` gives, in order
// (a pipeline as one step that runs its passes to a fixpoint). Throws Error
// naming a name that is neither, with the names there are.
PassManager passes_by_name(const std::vector<std::string>& names);

}  // namespace torchcap
