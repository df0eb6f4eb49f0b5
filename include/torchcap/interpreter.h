// Running a GraphModule on new inputs.
//
// The interpreter resolves everything once, when it is built (ExecuTorch's
// Method, docs/STYLE.md 8): operator handles, argument templates with constants
// already converted, attribute tensors, and for each value its last use, found
// by one reverse walk so the value is freed right after. A run then executes
// from flat tables without string look-ups.
//
// Ownership: an Interpreter copies what it needs from the GraphModule (sharing
// attribute tensors); the GraphModule may change or go away afterwards. The
// plan is immutable, so one Interpreter may run on several threads at once;
// each run's values belong to that call. Runs of a graph that writes buffers
// back (an exported train-mode BatchNorm, say) are serialized: each sees the
// buffer updates of the runs before it, as successive calls of the program
// would.
//
// A dynamic graph (symbolic.h) runs at any sizes its symbols' ranges allow:
// each run reads the sizes from its inputs, and runs the plan of the graph
// specialized to them (specialize() in passes.h), made on the first run at
// those sizes and kept for the 8 sizes run last (Note [Dynamic graphs run
// specialized] in src/runtime/interpreter.cpp). memory_plan() and
// planned_operators() then describe the plan at the traced sizes.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/memory_plan.h>

#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <vector>

namespace torchcap {

namespace detail {
struct InterpreterPlan;
}

// Figures from one run, for tests and benchmarks.
struct RunStats {
  size_t nodes_executed = 0;
  size_t peak_live_values = 0;  // most intermediate values held at once
  // Results written into the buffer of an argument that died there, instead
  // of a new tensor (Note [Results written over a dying argument] in
  // src/runtime/plan_passes/overwrites.cpp).
  size_t results_over_arguments = 0;
};

// Where the time of a graph's runs goes (Interpreter::profile): per node,
// as torch.profiler's key_averages() gives per operator.
struct Profile {
  struct Node {
    std::string name;    // "conv2d_run_3"
    std::string target;  // "mkldnn_prepacked::conv2d_run"
    std::string source;  // the innermost frame of the program's own: "model.py:42", or ""
    double seconds = 0;  // summed over the runs
    double last_start = 0, last_seconds = 0;  // in the last run, from its start
  };
  int runs = 0;
  double seconds = 0;       // the runs' instructions, summed
  double last_run = 0;      // the last run
  std::vector<Node> nodes;  // the nodes that ran, in order

  // Per-operator totals (calls, total, mean, share), slowest first, then the
  // `slowest` slowest nodes with their source lines.
  std::string table(size_t slowest = 10) const;
  // A Chrome trace of the last run (chrome://tracing, Perfetto): one
  // complete event per node.
  std::string chrome_trace() const;
};

struct InterpreterOptions {
  // Plan the intermediate tensors' memory (memory_plan.h) and run operators
  // that can through their out variants into one arena per running thread,
  // made on the thread's first run and reused by later runs: a run then
  // allocates nothing for those results. Outputs stay fresh tensors.
  bool plan_memory = false;
  // Run above autograd, as the program's own operators would run: a run in
  // grad mode whose inputs or attributes require grad gives results with
  // autograd history, which backward() differentiates. Without it (the
  // default), a graph runs as an inference program, below autograd (Note
  // [The interpreter runs below autograd] in src/runtime/interpreter.cpp).
  // The plan passes that write results into existing tensors or compute
  // views of attributes once do not run on such a plan. Not with
  // plan_memory (Error).
  bool autograd = false;
};

class Interpreter {
 public:
  // Builds the plan. Throws Error naming the node if the graph cannot run
  // (lint failures, missing attributes).
  explicit Interpreter(const GraphModule& gm, const InterpreterOptions& options = {});
  ~Interpreter();
  Interpreter(Interpreter&&) noexcept;
  Interpreter& operator=(Interpreter&&) noexcept;

  // Runs on the program's arguments (the nested structure of the input spec's
  // top-level tuple) and returns the rebuilt output structure. Inputs are
  // checked first against the placeholders' recorded metadata; one InputError
  // lists every mismatch. A failing operator throws RuntimeError naming the
  // node, its stack trace from the trace, and the original message.
  c10::IValue run(const std::vector<c10::IValue>& inputs) const;

  // The same, called as the program was when captured: arguments by
  // position, then by name (GraphModule::call; a module traced from Python
  // as f(x, scale=s) runs as run({x}, {{"scale", s}})). A missing, unknown or
  // repeated argument is an InputError naming it.
  c10::IValue run(std::vector<c10::IValue> args, NamedValues kwargs) const;

  // The same, on the flat list of input tensors; returns the flat user
  // outputs. An exported graph's mutation outputs (export.h) are not
  // returned: they are written back into the buffers and inputs they update,
  // as the program's own in-place writes would be (through autograd: version
  // counters are bumped, and under grad mode a leaf that requires grad is
  // refused with an InputError before anything runs).
  std::vector<at::Tensor> run_flat(const std::vector<at::Tensor>& inputs) const;

  // run(), with figures about the run.
  struct Result {
    c10::IValue outputs;
    RunStats stats;
  };
  Result run_with_stats(const std::vector<c10::IValue>& inputs) const;

  // Runs `runs` times (after one run not counted, which makes what a first
  // run makes: packed weights, a dynamic graph's plan) timing each node;
  // runs as run() does, checks included.
  Profile profile(const std::vector<c10::IValue>& inputs, int runs = 10) const;
  // The same on the flat list of input tensors (as run_flat).
  Profile profile_flat(const std::vector<at::Tensor>& inputs, int runs = 10) const;

  size_t num_inputs() const;
  size_t num_outputs() const;

  // The attributes a run updates in place, without a copy after it (Note
  // [Updates written in place], src/runtime/plan_passes/updates_in_place.cpp):
  // in a training step, the parameters and the optimizer's state whose update
  // ends with an elementwise operator and whose old value nothing reads
  // afterwards.
  // Such a write happens during the run, so a run that fails later leaves
  // them updated, as a failing torch::optim step leaves its parameters.
  std::vector<std::string> updated_in_place() const;

  // The memory plan of a planned interpreter, or nullptr.
  const MemoryPlan* memory_plan() const;
  // For a planned interpreter: the operators that make planned values, with
  // the out variant each runs through, or why it allocates instead
  // (`fallback`), including out variants given up while running because
  // they did not leave their result in the arena.
  std::vector<OperatorPlan> planned_operators() const;

 private:
  std::vector<at::Tensor> flatten_inputs(const std::vector<c10::IValue>& inputs) const;

  std::unique_ptr<const detail::InterpreterPlan> plan_;
};

}  // namespace torchcap
