// Capturing a whole training step: forward, loss, backward and an optimizer
// update recorded as one functional graph.
//
// The tracer sits below autograd, so with grad mode on inside the traced
// function the backward pass autograd runs reaches it as ordinary aten
// operators (tanh_backward, mm, sum, ...). The optimizer update is recorded
// as tensor arithmetic on the parameters and on the optimizer's state, which
// the graph holds as buffers; export's functionalization turns every update
// into a mutation output, so one Interpreter run of the graph is one
// training step, written back into the graph's attributes.
//
//   torch::nn::Sequential model(...);
//   torchcap::TrainingOptions options;
//   options.optimizer = torchcap::SGD{.lr = 0.1, .momentum = 0.9};
//   auto step = torchcap::export_training(model, torchcap::losses::mse(), {x}, {y}, options);
//   torchcap::Interpreter interp(step);
//   for (...) loss = interp.run({x, y}).toTensor();   // parameters move each run
#pragma once

#include <torchcap/export.h>
#include <torchcap/graph_module.h>
#include <torchcap/tracer.h>

#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace torchcap {

// torch::optim::SGD's update (SGDOptions), step for step.
struct SGD {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

// torch::optim::Adam's update (AdamOptions); weight decay added to the gradient.
struct Adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
};

// torch::optim::AdamW's update: decoupled weight decay.
struct AdamW {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
};

// No optimizer: the graph returns the loss and every parameter's gradient.
struct GradientsOnly {};

using Optimizer = std::variant<GradientsOnly, SGD, Adam, AdamW>;

// The loss of one step from the model's outputs and the targets: a tensor
// with one element.
using LossFunction =
    std::function<at::Tensor(const c10::IValue& outputs, const std::vector<c10::IValue>& targets)>;

namespace losses {
// Mean squared error between the model's output (a tensor) and targets[0].
LossFunction mse();
// Cross-entropy of the model's output (logits, N x C) against class indices targets[0].
LossFunction cross_entropy();
}  // namespace losses

struct TrainingOptions {
  Optimizer optimizer;
  // Options of the trace (inference_mode is refused: training needs autograd;
  // meta is refused: the step is captured by running it).
  TraceOptions trace;
};

// The captured step. Its inputs are the model's inputs followed by the
// targets; in_spec is the tuple (inputs..., targets...). Its user outputs
// are a dict: "loss" (a 0-dim tensor) and, without an optimizer,
// "gradients" (a dict from parameter name to gradient). Its mutation
// outputs (output_specs, BufferMutation) update the parameters, the
// optimizer's state and the model's buffers (BatchNorm's running
// statistics). The optimizer's state is held as buffers named
// "optimizer.<state>.<parameter>" ("optimizer.exp_avg.0.weight") and
// "optimizer.step".
//
// The module must be in training mode. Its parameters and buffers are left
// as they were: capturing does not take a step. Throws TraceError when the
// loss is not a one-element tensor, when a parameter gets no gradient (named),
// or when an operator has no derivative.
GraphModule export_training(torch::nn::Module& module, const TracedFunction& forward,
                            const LossFunction& loss, const std::vector<c10::IValue>& inputs,
                            const std::vector<c10::IValue>& targets,
                            const TrainingOptions& options = {});
GraphModule export_training(torch::jit::Module& module, const LossFunction& loss,
                            const std::vector<c10::IValue>& inputs,
                            const std::vector<c10::IValue>& targets,
                            const TrainingOptions& options = {});
// For a program whose parameters and buffers are `state` (the Python front
// end's modules): the caller has checked that it is in training mode.
GraphModule export_training(const ModuleState& state, const TracedFunction& forward,
                            const LossFunction& loss, const std::vector<c10::IValue>& inputs,
                            const std::vector<c10::IValue>& targets,
                            const TrainingOptions& options = {});
// For a torch::nn module holder (see trace(Holder&, ...)).
template <typename Holder, typename = typename Holder::ContainedType>
GraphModule export_training(Holder& model, const LossFunction& loss,
                            const std::vector<c10::IValue>& inputs,
                            const std::vector<c10::IValue>& targets,
                            const TrainingOptions& options = {}) {
  return export_training(
      static_cast<torch::nn::Module&>(*model),
      [&model](std::vector<c10::IValue> in) { return detail::call_forward(model, in); }, loss,
      inputs, targets, options);
}

// The optimizer-state buffer of parameter `parameter` ("exp_avg", "0.weight").
std::string optimizer_state_name(const std::string& state, const std::string& parameter);

// Note [Roles of a training step's outputs]
// A step's graph is an exported graph: its outputs are user outputs (the
// dict of "loss" and, without an optimizer, "gradients") followed by mutation
// outputs that update attributes (GraphModule::output_specs). What each one
// is for in training follows from what the file already holds: the user
// outputs' keys, the attributes' kinds (parameter or buffer) and the
// optimizer's buffer names (optimizer_state_name). training_signature()
// derives it once, so that no caller matches names itself, and it works as
// well on a step loaded from a file as on one just captured.
enum class StepRole : uint8_t {
  Loss,             // the step's loss, a 0-dim tensor
  Gradient,         // the gradient of parameter `parameter` (steps without an optimizer)
  ParameterUpdate,  // the new value of parameter `parameter`
  OptimizerState,   // the new value of the optimizer's `state` for `parameter` ("" for "step")
  BufferUpdate,     // the new value of the model's buffer `target` (BatchNorm's statistics)
  InputUpdate,      // the new value of input placeholder `target`
  Output,           // another user output
};

// "loss", "gradient", "parameter update", "optimizer state", "buffer update",
// "input update", "output".
const char* step_role_name(StepRole role);

struct StepOutput {
  StepRole role = StepRole::Output;
  std::string target;     // the attribute or placeholder the output is, or updates
  std::string parameter;  // Gradient, ParameterUpdate, OptimizerState: the parameter
  std::string state;      // OptimizerState: "momentum_buffer", "exp_avg", "step", ...
};

struct TrainingSignature {
  // One per output value of the graph, in the order of the output node.
  std::vector<StepOutput> outputs;
  size_t loss = 0;  // the loss's index in `outputs`
  // The trained parameters, in the order of their gradients or updates.
  std::vector<std::string> parameters;

  size_t count(StepRole role) const;
  // One line per output: "2  parameter update  fc.weight".
  std::string str() const;
};

// The roles of `step`'s outputs. Throws Error when `step` is not a training
// step (its user outputs are not a dict with a "loss" tensor).
TrainingSignature training_signature(const GraphModule& step);
bool is_training_step(const GraphModule& gm);

}  // namespace torchcap
