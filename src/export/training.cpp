// export_training: a training step (forward, loss, backward, optimizer
// update) captured as one functional graph.
#include <torchcap/training.h>

#include <torchcap/error.h>
#include <torchcap/passes.h>

#include "trace/dynamic.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>

#include <ATen/ATen.h>

#include <cstring>
#include <deque>
#include <type_traits>

namespace torchcap {

std::string optimizer_state_name(const std::string& state, const std::string& parameter) {
  return "optimizer." + state + "." + parameter;
}

namespace losses {

namespace {

at::Tensor single_target(const std::vector<c10::IValue>& targets, const char* loss) {
  if (targets.size() != 1 || !targets[0].isTensor()) {
    throw InputError(std::string(loss) + " loss takes one target tensor, got " +
                     std::to_string(targets.size()) + " target(s)");
  }
  return targets[0].toTensor();
}

at::Tensor output_tensor(const c10::IValue& outputs, const char* loss) {
  if (!outputs.isTensor()) {
    throw InputError(std::string(loss) + " loss takes a model that returns one tensor; it returned " +
                     outputs.tagKind());
  }
  return outputs.toTensor();
}

}  // namespace

LossFunction mse() {
  return [](const c10::IValue& outputs, const std::vector<c10::IValue>& targets) {
    return torch::nn::functional::mse_loss(output_tensor(outputs, "MSE"),
                                           single_target(targets, "MSE"));
  };
}

LossFunction cross_entropy() {
  return [](const c10::IValue& outputs, const std::vector<c10::IValue>& targets) {
    return torch::nn::functional::cross_entropy(output_tensor(outputs, "cross-entropy"),
                                                single_target(targets, "cross-entropy"));
  };
}

}  // namespace losses

namespace {

struct TrainedParameter {
  std::string name;
  at::Tensor tensor;
};

// Optimizer state: tensors the graph holds as buffers, created before the
// trace with torch::optim's initial values.
class OptimizerState {
 public:
  at::Tensor& add(const std::string& state, const std::string& parameter, at::Tensor value) {
    tensors_.emplace_back(optimizer_state_name(state, parameter), std::move(value));
    return tensors_.back().second;
  }
  // The step count, a float64 scalar so that bias corrections stay in the graph.
  at::Tensor& step() {
    if (!step_.defined()) step_ = at::zeros({}, at::kDouble);
    return step_;
  }
  void add_to(ModuleState& state) const {
    for (const auto& named : tensors_) state.buffers.push_back(named);
    if (step_.defined()) state.buffers.emplace_back("optimizer.step", step_);
  }

 private:
  std::deque<std::pair<std::string, at::Tensor>> tensors_;  // stable references
  at::Tensor step_;
};

// Note [Optimizer updates in the graph]
// Each update below is torch::optim's (LibTorch 1.13) written with the same
// operators on the same values, so a run of the graph computes bit for bit
// what the optimizer computes. Where torch::optim uses a host number that
// changes between steps (Adam's bias corrections, from its step count), the
// graph computes it from the `optimizer.step` buffer with float64 tensor
// operators that round as the host arithmetic does; the learning rate
// divided by a tensor is a division of a float64 `full`, since `lr / t`
// would multiply by a reciprocal.
class Updater {
 public:
  Updater(const std::vector<TrainedParameter>& params, OptimizerState& state)
      : params_(params), state_(state) {}

  void prepare(const GradientsOnly&) {}
  void prepare(const SGD& o) {
    if (o.momentum == 0) return;
    for (const auto& p : params_) buffers_.push_back(&state_.add("momentum_buffer", p.name, at::zeros_like(p.tensor)));
    if (o.dampening != 0) state_.step();
  }
  void prepare(const Adam& o) { prepare_adam(o.amsgrad); }
  void prepare(const AdamW& o) { prepare_adam(o.amsgrad); }

  void update(const GradientsOnly&, const std::vector<at::Tensor>&) {}

  void update(const SGD& o, const std::vector<at::Tensor>& grads) {
    at::Tensor first;
    if (o.momentum != 0 && o.dampening != 0) {
      first = state_.step().eq(0);
      state_.step().add_(1);
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor p = params_[i].tensor;
      at::Tensor d_p = grads[i];
      if (o.weight_decay != 0) d_p = d_p.add(p, o.weight_decay);
      if (o.momentum != 0) {
        at::Tensor& buf = *buffers_[i];
        if (first.defined()) {
          // torch::optim starts the buffer at the first gradient itself.
          buf.copy_(at::where(first, d_p, buf.mul(o.momentum).add(d_p, 1 - o.dampening)));
        } else {
          // From zero, mul_ then add_ gives the first gradient exactly.
          buf.mul_(o.momentum).add_(d_p, 1 - o.dampening);
        }
        d_p = o.nesterov ? d_p.add(buf, o.momentum) : buf;
      }
      p.add_(d_p, -o.lr);
    }
  }

  void update(const Adam& o, const std::vector<at::Tensor>& grads) {
    update_adam(o.lr, o.beta1, o.beta2, o.eps, o.amsgrad, grads, [&](size_t i, at::Tensor g) {
      return o.weight_decay != 0 ? g.add(params_[i].tensor, o.weight_decay) : g;
    });
  }

  void update(const AdamW& o, const std::vector<at::Tensor>& grads) {
    update_adam(o.lr, o.beta1, o.beta2, o.eps, o.amsgrad, grads, [&](size_t i, at::Tensor g) {
      if (o.weight_decay != 0) params_[i].tensor.mul_(1 - o.lr * o.weight_decay);
      return g;
    });
  }

 private:
  void prepare_adam(bool amsgrad) {
    state_.step();
    for (const auto& p : params_) {
      Moments m;
      m.exp_avg = &state_.add("exp_avg", p.name, at::zeros_like(p.tensor));
      m.exp_avg_sq = &state_.add("exp_avg_sq", p.name, at::zeros_like(p.tensor));
      if (amsgrad) m.max_exp_avg_sq = &state_.add("max_exp_avg_sq", p.name, at::zeros_like(p.tensor));
      moments_.push_back(m);
    }
  }

  template <typename Decay>
  void update_adam(double lr, double beta1, double beta2, double eps, bool amsgrad,
                   const std::vector<at::Tensor>& grads, Decay decay) {
    at::Tensor step = state_.step().add_(1);
    at::Tensor bias_correction1 = at::rsub(at::pow(beta1, step), 1);
    at::Tensor bias_correction2 = at::rsub(at::pow(beta2, step), 1);
    at::Tensor sqrt_bias_correction2 = bias_correction2.sqrt();
    at::Tensor neg_step_size = at::full({}, lr, at::kDouble).div(bias_correction1).neg();
    // A float64 0-dim tensor in an operator on float32 tensors is converted
    // to float32 first, each time (TensorIterator's type promotion copies it):
    // converted once here, the operators compute the same values without a
    // conversion per parameter. (Kernels of float16 and bfloat16 read such
    // an operand as it was before the conversion: theirs stays float64.)
    std::vector<std::pair<at::ScalarType, std::pair<at::Tensor, at::Tensor>>> scalars_by_dtype;
    auto scalars_for = [&](at::ScalarType dtype) -> const std::pair<at::Tensor, at::Tensor>& {
      if (dtype != at::kFloat) dtype = at::kDouble;
      for (const auto& [d, scalars] : scalars_by_dtype) {
        if (d == dtype) return scalars;
      }
      scalars_by_dtype.emplace_back(dtype, std::make_pair(sqrt_bias_correction2.to(dtype), neg_step_size.to(dtype)));
      return scalars_by_dtype.back().second;
    };
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& [sqrt_bias_correction2_p, neg_step_size_p] = scalars_for(params_[i].tensor.scalar_type());
      at::Tensor grad = decay(i, grads[i]);
      at::Tensor& exp_avg = *moments_[i].exp_avg;
      at::Tensor& exp_avg_sq = *moments_[i].exp_avg_sq;
      exp_avg.mul_(beta1).add_(grad, 1 - beta1);
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      at::Tensor second = exp_avg_sq;
      if (amsgrad) {
        at::Tensor& max_sq = *moments_[i].max_exp_avg_sq;
        at::max_out(max_sq, exp_avg_sq, max_sq);
        second = max_sq;
      }
      at::Tensor denom = second.sqrt().div(sqrt_bias_correction2_p).add_(eps);
      // torch::optim's addcdiv_(exp_avg, denom, -step_size) computes
      // self + (value * t1) / t2 in the parameter's dtype; with value * t1
      // computed first (the step size rounded to that dtype, as a Scalar
      // is), addcdiv_ with value 1 gives the same bits in one operator
      // fewer than mul, div and add_.
      params_[i].tensor.addcdiv_(exp_avg.mul(neg_step_size_p), denom);
    }
  }

  struct Moments {
    at::Tensor* exp_avg = nullptr;
    at::Tensor* exp_avg_sq = nullptr;
    at::Tensor* max_exp_avg_sq = nullptr;
  };

  const std::vector<TrainedParameter>& params_;
  OptimizerState& state_;
  std::vector<at::Tensor*> buffers_;
  std::vector<Moments> moments_;
};

void check_loss(const at::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1) {
    throw TraceError("export_training: the loss must be a tensor with one element; it has shape " +
                     (loss.defined() ? c10::str(loss.sizes()) : std::string("(undefined)")));
  }
  if (!loss.requires_grad()) {
    throw TraceError(
        "export_training: the loss does not depend on any trained parameter (it does not require "
        "grad); is the model's forward detached, or are its parameters frozen?");
  }
}

// Note [Operators without a derivative]
// Autograd records such an operator like any other and fails only when the
// backward pass reaches it, with "the derivative for 'igamma: input' is not
// implemented." (derivatives.yaml's not_implemented, naming the operator and
// sometimes the argument) or "derivative for aten::foo is not implemented"
// (an operator derivatives.yaml does not list). The operator's name is taken
// from that text to say what to do; the text itself is kept.
std::string no_derivative_message(const std::string& what) {
  std::string op;
  for (const char* marker : {"derivative for '", "derivative for "}) {
    size_t at = what.find(marker);
    if (at == std::string::npos) continue;
    size_t begin = at + std::strlen(marker);
    size_t end = what.find_first_of("': ", begin);
    op = what.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    break;
  }
  std::string reason = what.substr(0, what.find('\n'));
  while (!reason.empty() && (reason.back() == '.' || reason.back() == ' ')) reason.pop_back();
  if (op.empty()) {
    return "export_training: an operator between the parameters and the loss has no derivative ("
           + reason + "); compute it on detached tensors or replace it";
  }
  if (op.find("::") == std::string::npos) op = "aten::" + op;
  return "export_training: the operator " + op + " has no derivative in LibTorch (" + reason +
         "), and the loss depends on it through a trained parameter; compute it on detached "
         "tensors (outside the gradient's path) or replace it with an operator that has one";
}

// Every state tensor the trace may write, cloned, to be put back afterwards:
// capturing runs a step for real, and the model must not have taken it.
class Restore {
 public:
  explicit Restore(const ModuleState& state) {
    for (const auto* list : {&state.parameters, &state.buffers}) {
      for (const auto& [name, t] : *list) {
        if (t.defined()) saved_.emplace_back(t, t.detach().clone());
      }
    }
  }
  ~Restore() {
    at::NoGradGuard no_grad;
    for (auto& [live, copy] : saved_) live.detach().copy_(copy);
  }
  Restore(const Restore&) = delete;
  Restore& operator=(const Restore&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
};

GraphModule capture(ModuleState state, bool training, const TracedFunction& forward,
                    const LossFunction& loss_fn, const std::vector<c10::IValue>& inputs,
                    const std::vector<c10::IValue>& targets, const TrainingOptions& options) {
  if (!training) {
    throw TraceError(
        "export_training: the module is in eval mode; call train() on it first (dropout and "
        "BatchNorm behave differently in training)");
  }
  if (options.trace.inference_mode) {
    throw TraceError("export_training: TraceOptions::inference_mode is set; training needs autograd");
  }
  if (options.trace.meta) {
    throw TraceError(
        "export_training: TraceOptions::meta is set; a training step is captured by running the "
        "forward and backward passes on real tensors, so meta mode is not supported");
  }
  for (const auto* list : {&state.parameters, &state.buffers}) {
    for (const auto& named : *list) {
      if (named.first == "optimizer" || named.first.rfind("optimizer.", 0) == 0) {
        throw TraceError("export_training: the model has a parameter or buffer '" + named.first +
                         "'; the name 'optimizer' is where the step keeps the optimizer's state");
      }
    }
  }

  std::vector<TrainedParameter> params;
  for (const auto& [name, t] : state.parameters) {
    if (t.defined() && t.requires_grad()) params.push_back({name, t});
  }
  if (params.empty()) throw TraceError("export_training: the model has no parameter that requires grad");

  OptimizerState optimizer_state;
  Updater updater(params, optimizer_state);
  std::visit([&](const auto& o) { updater.prepare(o); }, options.optimizer);
  Restore restore(state);
  optimizer_state.add_to(state);

  const size_t num_inputs = inputs.size();
  TracedFunction step = [&](std::vector<c10::IValue> all) -> c10::IValue {
    std::vector<c10::IValue> model_inputs(all.begin(), all.begin() + num_inputs);
    std::vector<c10::IValue> step_targets(all.begin() + num_inputs, all.end());
    at::Tensor loss;
    std::vector<at::Tensor> grads;
    {
      at::AutoGradMode grad_mode(true);
      loss = loss_fn(forward(std::move(model_inputs)), step_targets);
      check_loss(loss);
      std::vector<at::Tensor> wrt;
      for (const auto& p : params) wrt.push_back(p.tensor);
      try {
        grads = torch::autograd::grad({loss}, wrt, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);
      } catch (const Error&) {
        throw;
      } catch (const c10::NotImplementedError& e) {
        throw TraceError(no_derivative_message(e.what_without_backtrace()));
      } catch (const c10::Error& e) {
        throw TraceError(std::string("export_training: backward failed: ") + e.what_without_backtrace());
      }
    }
    std::string unused;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) unused += (unused.empty() ? "" : ", ") + params[i].name;
    }
    if (!unused.empty()) {
      throw TraceError("export_training: no gradient reaches parameter(s) " + unused +
                       " from the loss; freeze them (requires_grad false) or use them");
    }
    at::NoGradGuard no_grad;
    std::visit([&](const auto& o) { updater.update(o, grads); }, options.optimizer);
    c10::impl::GenericDict result(c10::StringType::get(), c10::AnyType::get());
    result.insert("loss", loss);
    if (std::holds_alternative<GradientsOnly>(options.optimizer)) {
      c10::impl::GenericDict by_name(c10::StringType::get(), c10::TensorType::get());
      for (size_t i = 0; i < params.size(); ++i) by_name.insert(params[i].name, grads[i]);
      result.insert("gradients", by_name);
    }
    return result;
  };

  std::vector<c10::IValue> all = inputs;
  all.insert(all.end(), targets.begin(), targets.end());
  auto capture_at = [&](const std::vector<c10::IValue>& at_inputs, const TraceOptions& at) {
    TraceOptions first = at;
    first.allow_input_mutation = true;
    GraphModule traced = trace(state, step, at_inputs, first);
    eliminate_dead_code(traced.graph());
    traced.remove_unused_attributes();
    return functionalize(traced, at_inputs, at);
  };
  if (options.trace.dynamic.empty()) return capture_at(all, options.trace);
  // A dynamic batch (Note [Dynamic shapes by aligned traces] in
  // src/trace/dynamic.cpp): the step captured at several sizes, each from
  // the state the model had (a capture takes a step for real), aligned.
  // Dimensions count the inputs, then the targets.
  TraceOptions fixed = options.trace;
  fixed.dynamic.clear();
  auto trace_at = [&](const std::vector<c10::IValue>& at_inputs, detail::TraceAtOptions how) {
    Restore from_the_start(state);
    TraceOptions at = fixed;
    if (how.structure_only) at.record_stack_traces = false;
    return TraceResult{capture_at(at_inputs, at), c10::IValue()};
  };
  return detail::trace_dynamic(trace_at, all, options.trace.dynamic, /*meta_allowed=*/false).module;
}

}  // namespace

GraphModule export_training(torch::nn::Module& module, const TracedFunction& forward,
                            const LossFunction& loss, const std::vector<c10::IValue>& inputs,
                            const std::vector<c10::IValue>& targets,
                            const TrainingOptions& options) {
  return capture(ModuleState::of(module), module.is_training(), forward, loss, inputs, targets,
                 options);
}

GraphModule export_training(const ModuleState& state, const TracedFunction& forward,
                            const LossFunction& loss, const std::vector<c10::IValue>& inputs,
                            const std::vector<c10::IValue>& targets,
                            const TrainingOptions& options) {
  return capture(state, /*training=*/true, forward, loss, inputs, targets, options);
}

GraphModule export_training(torch::jit::Module& module, const LossFunction& loss,
                            const std::vector<c10::IValue>& inputs,
                            const std::vector<c10::IValue>& targets,
                            const TrainingOptions& options) {
  auto forward = [&module](std::vector<c10::IValue> args) {
    torch::jit::GraphOptimizerEnabledGuard no_optimization(false);
    return module.forward(std::move(args));
  };
  return capture(ModuleState::of(module), module.is_training(), forward, loss, inputs, targets,
                 options);
}

// --- The signature of a step (Note [Roles of a training step's outputs]) ---

const char* step_role_name(StepRole role) {
  switch (role) {
    case StepRole::Loss: return "loss";
    case StepRole::Gradient: return "gradient";
    case StepRole::ParameterUpdate: return "parameter update";
    case StepRole::OptimizerState: return "optimizer state";
    case StepRole::BufferUpdate: return "buffer update";
    case StepRole::InputUpdate: return "input update";
    case StepRole::Output: return "output";
  }
  return "?";
}

size_t TrainingSignature::count(StepRole role) const {
  size_t n = 0;
  for (const StepOutput& o : outputs) n += o.role == role ? 1 : 0;
  return n;
}

std::string TrainingSignature::str() const {
  std::string out;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const StepOutput& o = outputs[i];
    std::string what = o.role == StepRole::OptimizerState
                           ? o.state + (o.parameter.empty() ? "" : " of " + o.parameter)
                       : o.role == StepRole::Loss ? ""
                                                  : o.target;
    out += c10::str(i, "  ", step_role_name(o.role), what.empty() ? "" : "  " + what, "\n");
  }
  return out;
}

namespace {

const TreeSpec* loss_spec_of(const GraphModule& gm) {
  const TreeSpec& out = gm.out_spec;
  if (out.kind() != TreeSpec::Kind::Dict) return nullptr;
  for (size_t i = 0; i < out.keys().size(); ++i) {
    const c10::IValue& key = out.keys()[i];
    if (key.isString() && key.toStringRef() == "loss" &&
        out.children()[i].kind() == TreeSpec::Kind::Leaf) {
      return &out.children()[i];
    }
  }
  return nullptr;
}

}  // namespace

bool is_training_step(const GraphModule& gm) { return loss_spec_of(gm) != nullptr; }

TrainingSignature training_signature(const GraphModule& step) {
  if (!is_training_step(step)) {
    throw Error("not a training step: its outputs are " + step.out_spec.str() +
                ", not a dict with a 'loss' (export_training makes steps)");
  }
  TrainingSignature sig;
  const TreeSpec& out = step.out_spec;
  for (size_t i = 0; i < out.keys().size(); ++i) {
    const c10::IValue& key = out.keys()[i];
    const TreeSpec& child = out.children()[i];
    std::string name = key.isString() ? key.toStringRef() : "";
    if (name == "loss") {
      sig.loss = sig.outputs.size();
      sig.outputs.push_back({StepRole::Loss, "loss", "", ""});
    } else if (name == "gradients" && child.kind() == TreeSpec::Kind::Dict) {
      for (size_t g = 0; g < child.keys().size(); ++g) {
        const c10::IValue& parameter = child.keys()[g];
        if (!parameter.isString() || child.children()[g].kind() != TreeSpec::Kind::Leaf) {
          throw Error("not a training step: its 'gradients' are not a dict from parameter name "
                      "to tensor");
        }
        sig.outputs.push_back({StepRole::Gradient, parameter.toStringRef(), parameter.toStringRef(), ""});
        sig.parameters.push_back(parameter.toStringRef());
      }
    } else {
      for (size_t l = 0; l < child.num_leaves(); ++l) sig.outputs.push_back({StepRole::Output, name, "", ""});
    }
  }
  const std::string prefix = "optimizer.";
  for (size_t i = step.num_user_outputs(); i < step.output_specs.size(); ++i) {
    const OutputSpec& spec = step.output_specs[i];
    StepOutput o;
    o.target = spec.target;
    if (spec.kind == OutputKind::InputMutation) {
      o.role = StepRole::InputUpdate;
    } else if (step.has_attribute(spec.target) &&
               step.attribute(spec.target).kind == AttributeKind::Parameter) {
      o.role = StepRole::ParameterUpdate;
      o.parameter = spec.target;
      sig.parameters.push_back(spec.target);
    } else if (spec.target.rfind(prefix, 0) == 0) {
      o.role = StepRole::OptimizerState;
      std::string rest = spec.target.substr(prefix.size());
      size_t dot = rest.find('.');
      o.state = rest.substr(0, dot);
      if (dot != std::string::npos) o.parameter = rest.substr(dot + 1);
    } else {
      o.role = StepRole::BufferUpdate;
    }
    sig.outputs.push_back(std::move(o));
  }
  return sig;
}

}  // namespace torchcap
