// The interpreter's plan: the flat tables a run executes (docs/STYLE.md 8),
// and the builder that makes them from a GraphModule. Internal.
//
// build_plan resolves everything once: operator handles, argument slots with
// their constants already converted, attribute tensors, what an error says
// about each node. It makes one instruction per operator node and nothing
// more; what makes the plan faster is done by the plan passes
// (plan_passes.h), which the interpreter runs on it in order before the
// first run.
//
// Ownership: a plan copies what it needs from the GraphModule (sharing
// attribute tensors), so it outlives the graph. Once the passes have run it
// is not changed again, and runs on several threads share it; each run's
// values belong to that run.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/interpreter.h>

#include "runtime/planned_memory.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace torchcap {
namespace detail {

// Where an operator argument comes from at run time.
struct Slot {
  enum class Kind : uint8_t {
    Constant,       // `constant`, converted to the schema's type at plan time
    Value,          // values[index]: an intermediate result
    Input,          // inputs[index]
    Attribute,      // attributes[index]
    TensorList,     // a Tensor[] gathered from `elements`
    OptionalTensorList,  // a Tensor?[] gathered from `elements` (Constant = none)
  };
  Kind kind = Kind::Constant;
  int32_t index = -1;
  c10::IValue constant;
  std::vector<Slot> elements;
};

// One call_function node of the graph.
struct Instruction {
  c10::OperatorHandle op;
  std::vector<Slot> args;  // the schema's full arity: defaults already filled
  // Results go to values[out], values[out+1], ... (one per return, or one per
  // element of a Tensor[] return when `explode` is set).
  int32_t out = -1;
  int32_t num_outputs = 0;
  bool explode = false;
  // Values released after this instruction (Note [Freeing values after
  // their last use] in plan_passes/frees.cpp).
  std::vector<int32_t> frees;
  int32_t node_info = -1;
  int32_t planned = -1;  // a PlannedMemory call, Note [Planned runs]
  // Note [Updates written in place] (plan_passes/updates_in_place.cpp): when
  // defined, the result is written into this attribute by `into_op` (the
  // out variant), after `into_extra`.
  at::Tensor into;
  c10::OperatorHandle into_op;
  std::vector<c10::IValue> into_extra;
  // Note [Results written over a dying argument] (plan_passes/overwrites.cpp):
  // when set, the result may be written by `op` (the out variant) into one of
  // the arguments `args` (indices into `args`), found at run time to be held
  // by nothing else.
  struct Overwrite {
    std::vector<int32_t> args;
    c10::OperatorHandle op;
    std::vector<c10::IValue> extra;
    TensorMeta result;
  };
  std::shared_ptr<const Overwrite> overwrite;
};

// What the plan keeps of the node an instruction runs: what an error says
// about it, and what the passes check a rewrite against.
struct NodeInfo {
  std::string line;  // as printed: %addmm_1 : ... = aten::addmm(...)
  std::string name;    // "addmm_1"
  std::string target;  // "aten::addmm"
  StackTrace stack_trace;
  // Its recorded result, when that is one tensor.
  std::optional<TensorMeta> result;
};

struct InputCheck {
  std::string name;
  bool has_meta = false;
  TensorMeta meta;
  // Note [Inputs in the traced layout] (interpreter.cpp)
  bool dense = false;    // the recorded strides are dense and without overlap
  bool written = false;  // the graph writes the input (in place or written back)
};

struct InterpreterPlan {
  std::vector<Instruction> instructions;
  std::vector<at::Tensor> attributes;
  std::vector<InputCheck> inputs;
  std::vector<Slot> outputs;  // Value, Input or Attribute slots; user outputs first
  size_t num_user_outputs = 0;
  // For each output after the user outputs: where its value is written back.
  struct WriteBack {
    bool to_input;       // else to an attribute
    int32_t input;       // placeholder index
    at::Tensor buffer;   // the attribute's tensor
    // Already written by the run (Note [Updates written in place] in
    // plan_passes/updates_in_place.cpp).
    bool in_place = false;
    std::string target;
  };
  std::vector<WriteBack> write_backs;
  // Note [Concurrent runs that update buffers] (interpreter.cpp)
  bool updates_buffers = false;
  mutable std::mutex buffer_updates;
  std::vector<NodeInfo> node_infos;  // indexed by Instruction::node_info
  // Note [Runs with unbound weights] (interpreter.cpp): the get_attr
  // attributes that hold no values, as "parameter 'fc.weight' (f32[4, 8])".
  std::vector<std::string> unbound;
  int32_t num_values = 0;
  size_t max_args = 0;  // the most arguments of any instruction
  TreeSpec in_spec;
  CallConvention call;
  TreeSpec out_spec;
  std::unique_ptr<PlannedMemory> memory;  // planned interpreters only
  bool autograd = false;                  // InterpreterOptions::autograd
  // A dynamic graph's plan holds only the specs and the input names; a run
  // takes the plan of its sizes from here (Note [Dynamic graphs run
  // specialized] in interpreter.cpp).
  std::shared_ptr<struct DynamicPlans> dynamic;
};

// The plan of `gm`, one instruction per operator node, before any plan pass.
// Lints the graph first; throws Error naming the node if the graph cannot
// run (a Tensor[] result of unrecorded length, a multi-output node used
// without getitem).
std::unique_ptr<InterpreterPlan> build_plan(const GraphModule& gm, const InterpreterOptions& options);

// Runs `plan` on the flat input tensors, as Interpreter::run_flat does
// (interpreter.cpp): checks the inputs, executes the instructions, writes
// back what the graph updates; returns the flat user outputs.
// With `times`, each instruction's time is added to it (Interpreter::profile).
struct InstructionTimes {
  const InterpreterPlan* plan = nullptr;  // the plan run (a dynamic graph's: that of the sizes)
  std::vector<double> seconds;            // per instruction, summed over runs
  std::vector<double> last_start;         // per instruction, in the last run, from its start
  double last_run = 0;                    // the last run's time in instructions
};
std::vector<at::Tensor> run_plan(const InterpreterPlan& plan, const std::vector<at::Tensor>& inputs,
                                 RunStats& stats, InstructionTimes* times = nullptr);

}  // namespace detail
}  // namespace torchcap
