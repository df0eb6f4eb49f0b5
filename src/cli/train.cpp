// The training commands:
//
//   torchcap trace MODEL.pt --train --loss cross-entropy|mse|model --input ... --target ...
//                  [--optimizer sgd|adam|adamw|none] [--lr ...] [--momentum ...] [-o STEP.tcg]
//   torchcap run STEP.tcg --steps N (--input ... | --data BATCHES.pt) [-o TRAINED.tcg]
//
// trace --train captures one training step of a TorchScript model
// (export_training), checks it against one step of eager training with
// torch::optim and saves it; run --steps runs the step N times, printing each
// step's loss, and saves the trained step.
#include "cli/cli_inputs.h"
#include "cli/commands.h"

#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/serialize.h>
#include <torchcap/summary.h>
#include <torchcap/training.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <unistd.h>

namespace torchcap::cli {
namespace {

using json = nlohmann::ordered_json;

const char* const kTrainOptions[] = {"--loss",         "--target",   "--optimizer", "--lr",
                                     "--momentum",     "--dampening", "--weight-decay",
                                     "--nesterov",     "--betas",    "--eps",       "--amsgrad"};

bool given(const CLI::App& app, const char* option) { return app.count(option) > 0; }

// --- The optimizer ----------------------------------------------------------------

// The optimizer the flags describe; flags that belong to another optimizer
// are refused rather than ignored.
Optimizer optimizer_of(const TrainCommand& cmd, const CLI::App& app) {
  const std::string& name = cmd.optimizer;
  auto refuse = [&](std::initializer_list<const char*> options, const char* takes) {
    for (const char* o : options) {
      if (given(app, o)) {
        throw Error(std::string(o) + " is not an option of --optimizer " + name + " (it takes " +
                    takes + ")");
      }
    }
  };
  auto positive = [](const char* option, double v) {
    if (!(v > 0) || !std::isfinite(v)) throw Error(std::string(option) + " must be a positive number, got " + c10::str(v));
  };
  auto non_negative = [](const char* option, double v) {
    if (!(v >= 0) || !std::isfinite(v)) throw Error(std::string(option) + " must be 0 or more, got " + c10::str(v));
  };
  if (name == "none") {
    refuse({"--lr", "--momentum", "--dampening", "--weight-decay", "--nesterov", "--betas", "--eps",
            "--amsgrad"},
           "no option: the step returns the loss and every parameter's gradient");
    return GradientsOnly{};
  }
  if (name == "sgd") {
    refuse({"--betas", "--eps", "--amsgrad"}, "--lr, --momentum, --dampening, --weight-decay, --nesterov");
    SGD o;
    o.lr = cmd.lr < 0 && !given(app, "--lr") ? 0.01 : cmd.lr;
    o.momentum = cmd.momentum;
    o.dampening = cmd.dampening;
    o.weight_decay = given(app, "--weight-decay") ? cmd.weight_decay : 0;
    o.nesterov = cmd.nesterov;
    positive("--lr", o.lr);
    non_negative("--momentum", o.momentum);
    non_negative("--weight-decay", o.weight_decay);
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
      throw Error("--nesterov needs a --momentum above 0 and no --dampening (as torch::optim::SGD)");
    }
    return o;
  }
  refuse({"--momentum", "--dampening", "--nesterov"}, "--lr, --betas, --eps, --weight-decay, --amsgrad");
  double lr = given(app, "--lr") ? cmd.lr : 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  if (given(app, "--betas")) {
    if (cmd.betas.size() != 2) throw Error("--betas takes two numbers, e.g. --betas 0.9,0.999");
    beta1 = cmd.betas[0];
    beta2 = cmd.betas[1];
    for (double b : cmd.betas) {
      if (!(b >= 0 && b < 1)) throw Error("--betas must be in [0, 1), got " + c10::str(b));
    }
  }
  positive("--lr", lr);
  non_negative("--eps", cmd.eps);
  if (name == "adam") {
    Adam o{lr, beta1, beta2, cmd.eps, given(app, "--weight-decay") ? cmd.weight_decay : 0, cmd.amsgrad};
    non_negative("--weight-decay", o.weight_decay);
    return o;
  }
  AdamW o{lr, beta1, beta2, cmd.eps, given(app, "--weight-decay") ? cmd.weight_decay : 1e-2, cmd.amsgrad};
  non_negative("--weight-decay", o.weight_decay);
  return o;
}

std::string describe(const Optimizer& optimizer) {
  if (const auto* s = std::get_if<SGD>(&optimizer)) {
    std::string out = c10::str("SGD lr=", s->lr);
    if (s->momentum != 0) out += c10::str(" momentum=", s->momentum);
    if (s->dampening != 0) out += c10::str(" dampening=", s->dampening);
    if (s->weight_decay != 0) out += c10::str(" weight_decay=", s->weight_decay);
    if (s->nesterov) out += " nesterov";
    return out;
  }
  auto adam = [](const char* name, double lr, double b1, double b2, double eps, double wd, bool ams) {
    std::string out = c10::str(name, " lr=", lr, " betas=(", b1, ", ", b2, ") eps=", eps);
    if (wd != 0) out += c10::str(" weight_decay=", wd);
    if (ams) out += " amsgrad";
    return out;
  };
  if (const auto* a = std::get_if<Adam>(&optimizer)) {
    return adam("Adam", a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, a->amsgrad);
  }
  if (const auto* w = std::get_if<AdamW>(&optimizer)) {
    return adam("AdamW", w->lr, w->beta1, w->beta2, w->eps, w->weight_decay, w->amsgrad);
  }
  return "no optimizer (gradients)";
}

// torch::optim's optimizer for `optimizer`, on `params`: the reference the
// captured step is checked against.
std::unique_ptr<torch::optim::Optimizer> eager_optimizer(const Optimizer& optimizer,
                                                         std::vector<at::Tensor> params) {
  if (const auto* s = std::get_if<SGD>(&optimizer)) {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(s->lr).momentum(s->momentum).dampening(s->dampening)
                    .weight_decay(s->weight_decay).nesterov(s->nesterov));
  }
  if (const auto* a = std::get_if<Adam>(&optimizer)) {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(a->lr).betas({a->beta1, a->beta2}).eps(a->eps)
                    .weight_decay(a->weight_decay).amsgrad(a->amsgrad));
  }
  if (const auto* w = std::get_if<AdamW>(&optimizer)) {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(w->lr).betas({w->beta1, w->beta2}).eps(w->eps)
                    .weight_decay(w->weight_decay).amsgrad(w->amsgrad));
  }
  return nullptr;
}

// --- The loss and its targets -------------------------------------------------------

std::string shape_of(const at::Tensor& t) { return c10::str(t.sizes()); }

// Note [Targets of the cross-entropy]
// Cross-entropy takes class indices (the output's shape without its class
// dimension, dim 1, or dim 0 for an unbatched output) or class probabilities
// (the output's shape). A target given as a shape without a dtype is class
// indices; random ones are drawn from the output's classes, not from the
// 0..9 of other random integer inputs, which could name classes the model
// does not have.
at::Tensor cross_entropy_target(const std::string& spec, const at::Tensor& output) {
  if (output.dim() == 0) {
    throw Error("--loss cross-entropy needs an output of class scores (N x C); the model returns a "
                "0-dim tensor");
  }
  const int64_t class_dim = output.dim() == 1 ? 0 : 1;
  const int64_t classes = output.size(class_dim);
  std::vector<int64_t> index_shape = output.sizes().vec();
  index_shape.erase(index_shape.begin() + class_dim);
  const bool random = !is_file(spec);
  at::Tensor target = parse_input(random && spec.find(':') == std::string::npos ? spec + ":int64" : spec);
  auto expected = [&] {
    return c10::str("cross-entropy takes class indices of shape ", c10::IntArrayRef(index_shape),
                    " (the output's shape ", output.sizes(), " without its class dimension) with "
                    "values in [0, ", classes, "), or class probabilities of shape ", output.sizes());
  };
  if (c10::isIntegralType(target.scalar_type(), /*includeBool=*/false)) {
    if (target.sizes() != c10::IntArrayRef(index_shape)) {
      throw Error("--target '" + spec + "': " + expected() + "; the target has shape " + shape_of(target));
    }
    if (target.scalar_type() != at::kLong) target = target.to(at::kLong);
    if (random) return at::randint(0, classes, index_shape, at::kLong);
    if (target.numel() > 0) {
      int64_t low = target.min().item<int64_t>(), high = target.max().item<int64_t>();
      if (low < 0 || high >= classes) {
        throw Error(c10::str("--target '", spec, "': class index ", low < 0 ? low : high,
                             " is out of range: the model's output has ", classes, " classes"));
      }
    }
    return target;
  }
  if (!c10::isFloatingType(target.scalar_type())) {
    throw Error("--target '" + spec + "': " + expected() + "; the target is " +
                dtype_name(target.scalar_type()));
  }
  if (target.sizes() != output.sizes()) {
    throw Error("--target '" + spec + "': " + expected() + "; the target has shape " + shape_of(target));
  }
  return random ? at::softmax(target, class_dim).to(output.scalar_type()) : target;
}

at::Tensor mse_target(const std::string& spec, const at::Tensor& output) {
  at::Tensor target = parse_input(spec);
  if (target.sizes() != output.sizes()) {
    throw Error("--target '" + spec + "': MSE compares the model's output, of shape " +
                shape_of(output) + ", with a target of the same shape; the target has shape " +
                shape_of(target));
  }
  if (!c10::isFloatingType(target.scalar_type())) {
    throw Error("--target '" + spec + "': MSE needs a floating-point target; it is " +
                dtype_name(target.scalar_type()));
  }
  return target;
}

LossFunction loss_function(const std::string& loss) {
  if (loss == "mse") return losses::mse();
  if (loss == "cross-entropy") return losses::cross_entropy();
  // The forward computes the loss itself; its targets are among its inputs.
  return [](const c10::IValue& outputs, const std::vector<c10::IValue>&) {
    if (!outputs.isTensor()) {
      throw Error("--loss model: the forward must return the loss, a tensor; it returns " +
                  outputs.type()->annotation_str());
    }
    return outputs.toTensor();
  };
}

// --- The model's state ---------------------------------------------------------------

// The values of a module's parameters and buffers, put back on destruction:
// probing the model and the eager check run it for real (BatchNorm's
// statistics, a step of the optimizer), and the saved step must start from the
// model as it was.
class Snapshot {
 public:
  explicit Snapshot(torch::jit::Module& m) {
    at::NoGradGuard no_grad;
    for (const auto& p : m.named_parameters()) saved_.emplace_back(p.value, p.value.detach().clone());
    for (const auto& b : m.named_buffers()) saved_.emplace_back(b.value, b.value.detach().clone());
  }
  ~Snapshot() {
    at::NoGradGuard no_grad;
    for (auto& [live, copy] : saved_) {
      live.detach().copy_(copy);
      if (live.grad().defined()) live.mutable_grad() = at::Tensor();
    }
  }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
};

std::vector<c10::IValue> clone_tensors(const std::vector<c10::IValue>& values) {
  std::vector<c10::IValue> out;
  for (const c10::IValue& v : values) out.push_back(v.isTensor() ? c10::IValue(v.toTensor().clone()) : v);
  return out;
}

c10::IValue run_forward(torch::jit::Module& m, std::vector<c10::IValue> inputs) {
  torch::jit::GraphOptimizerEnabledGuard no_optimization(false);
  return m.forward(std::move(inputs));
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  if (a.numel() == 0) return 0;
  return (a.detach().to(at::kDouble) - b.detach().to(at::kDouble)).abs().max().item<double>();
}

struct Check {
  double loss = 0;       // the eager loss
  double max_diff = 0;   // over the loss, the gradients or the updated parameters, and the buffers
};

// One step of eager training (forward, loss, backward, torch::optim's step)
// against one run of the captured step on copies of its attributes.
Check check_step(torch::jit::Module& m, const GraphModule& step, const LossFunction& loss_fn,
                 const Optimizer& optimizer, const std::vector<c10::IValue>& inputs,
                 const std::vector<c10::IValue>& targets) {
  GraphModule copy = step.clone();
  for (const Attribute& a : step.attributes()) copy.set_attribute(a.name, a.value.detach().clone(), a.kind);
  std::vector<c10::IValue> all = clone_tensors(inputs);
  for (const c10::IValue& t : targets) all.push_back(t);
  c10::IValue out = Interpreter(copy).run(all);
  auto result = out.toGenericDict();

  Snapshot restore(m);
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& p : m.named_parameters()) {
    if (p.value.requires_grad()) {
      params.push_back(p.value);
      names.push_back(p.name);
    }
  }
  auto opt = eager_optimizer(optimizer, params);
  at::Tensor loss;
  {
    at::AutoGradMode grad(true);
    loss = loss_fn(run_forward(m, clone_tensors(inputs)), targets);
    loss.backward();
  }
  Check c;
  c.loss = loss.item<double>();
  c.max_diff = max_abs_diff(result.at("loss").toTensor(), loss);
  if (opt) {
    opt->step();
    for (size_t i = 0; i < params.size(); ++i) {
      c.max_diff = std::max(c.max_diff, max_abs_diff(copy.attribute(names[i]).value, params[i]));
    }
  } else {
    auto grads = result.at("gradients").toGenericDict();
    for (size_t i = 0; i < params.size(); ++i) {
      c.max_diff = std::max(c.max_diff, max_abs_diff(grads.at(names[i]).toTensor(), params[i].grad()));
    }
  }
  for (const auto& b : m.named_buffers()) {
    if (copy.has_attribute(b.name)) c.max_diff = std::max(c.max_diff, max_abs_diff(copy.attribute(b.name).value, b.value));
  }
  return c;
}

std::string outputs_line(const TrainingSignature& sig) {
  std::string out = "outputs: loss";
  auto add = [&](StepRole role, const char* one, const char* many) {
    size_t n = sig.count(role);
    if (n > 0) out += c10::str(", ", n, " ", n == 1 ? one : many);
  };
  add(StepRole::Gradient, "gradient", "gradients");
  add(StepRole::ParameterUpdate, "parameter update", "parameter updates");
  add(StepRole::OptimizerState, "optimizer state update", "optimizer state updates");
  add(StepRole::BufferUpdate, "buffer update", "buffer updates");
  return out;
}

// --- Progress of `run --steps` --------------------------------------------------------

// On a terminal, one line redrawn in place: a bar, the step and its loss.
// Otherwise (a pipe, a file) one plain line per step.
class StepProgress {
 public:
  explicit StepProgress(int64_t steps) : steps_(steps), tty_(::isatty(STDOUT_FILENO) == 1) {}
  void report(int64_t step, double loss) {
    if (!tty_) {
      std::printf("step %lld/%lld: loss %.6g\n", static_cast<long long>(step), static_cast<long long>(steps_), loss);
      std::fflush(stdout);
      return;
    }
    constexpr int kWidth = 30;
    int filled = static_cast<int>(kWidth * step / steps_);
    std::string bar(filled, '#');
    bar += std::string(kWidth - filled, '.');
    std::printf("\r\033[K[%s] step %lld/%lld  loss %.6g", bar.c_str(), static_cast<long long>(step),
                static_cast<long long>(steps_), loss);
    if (step == steps_) std::printf("\n");
    std::fflush(stdout);
  }

 private:
  int64_t steps_;
  bool tty_;
};

}  // namespace

void add_train_options(CLI::App& trace, TrainCommand& cmd) {
  trace.add_flag("--train", cmd.train,
                 "capture a training step (forward, loss, backward, optimizer update) of a "
                 "TorchScript model in train mode");
  trace.add_option("--loss", cmd.loss,
                   "with --train: cross-entropy (class scores against class indices), mse, or model "
                   "(the forward returns the loss)")
      ->check(CLI::IsMember({"cross-entropy", "mse", "model"}));
  trace.add_option("--target", cmd.targets,
                   "with --train: the target, like --input: a shape (random; class indices for "
                   "cross-entropy) or a torch.save'd tensor file");
  trace.add_option("--optimizer", cmd.optimizer, "with --train: sgd (default), adam, adamw, or none (gradients)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "none"}));
  trace.add_option("--lr", cmd.lr, "learning rate (default: SGD 0.01, Adam and AdamW 0.001)");
  trace.add_option("--momentum", cmd.momentum, "SGD's momentum (default 0)");
  trace.add_option("--dampening", cmd.dampening, "SGD's dampening (default 0)");
  trace.add_flag("--nesterov", cmd.nesterov, "SGD with Nesterov momentum");
  trace.add_option("--weight-decay", cmd.weight_decay, "weight decay (default: AdamW 0.01, others 0)");
  trace.add_option("--betas", cmd.betas, "Adam's and AdamW's betas (default 0.9,0.999)")->delimiter(',');
  trace.add_option("--eps", cmd.eps, "Adam's and AdamW's eps (default 1e-8)");
  trace.add_flag("--amsgrad", cmd.amsgrad, "Adam and AdamW with AMSGrad");
}

bool train_options_given(const CLI::App& trace) {
  for (const char* o : kTrainOptions) {
    if (given(trace, o)) return true;
  }
  return false;
}

int cmd_trace_train(const std::string& model, const std::vector<std::string>& input_specs,
                    const TrainCommand& cmd, const std::string& output, bool check, bool as_json,
                    const CLI::App& app) {
  if (model.empty()) {
    throw Error("trace --train takes a TorchScript file (a model saved by torch.jit.save in train mode)");
  }
  if (cmd.loss.empty()) {
    throw Error("trace --train: choose the loss with --loss cross-entropy, --loss mse or --loss model");
  }
  Optimizer optimizer = optimizer_of(cmd, app);
  torch::jit::Module m = load_torchscript(model);
  if (!m.is_training()) {
    throw Error(model + " is in eval mode (it was saved after .eval()); a training step needs train "
                "mode, where dropout and BatchNorm behave as in training: call .train() on the "
                "model before torch.jit.save");
  }
  if (input_specs.empty() && !forward_parameters(m).empty()) {
    throw Error("give the inputs of '" + model + "' with --input, e.g. --input 8x3x32x32");
  }
  std::vector<c10::IValue> inputs = forward_inputs(m, model, input_specs);

  std::vector<c10::IValue> targets;
  if (cmd.loss == "model") {
    if (!cmd.targets.empty()) {
      throw Error("--loss model takes no --target: the forward computes the loss, so its targets "
                  "are among its --input");
    }
  } else {
    if (cmd.targets.size() != 1) {
      throw Error("--loss " + cmd.loss + " takes one --target, got " + std::to_string(cmd.targets.size()));
    }
    // The output's shape, for the target: one forward on the model as it is.
    c10::IValue out;
    {
      Snapshot restore(m);
      at::NoGradGuard no_grad;
      out = run_forward(m, clone_tensors(inputs));
    }
    if (!out.isTensor()) {
      throw Error("--loss " + cmd.loss + " needs a model that returns one tensor; '" + model +
                  "' returns " + out.type()->annotation_str() + " (use --loss model with a "
                  "forward that returns the loss)");
    }
    at::Tensor o = out.toTensor();
    targets.emplace_back(cmd.loss == "mse" ? mse_target(cmd.targets[0], o)
                                           : cross_entropy_target(cmd.targets[0], o));
  }

  LossFunction loss_fn = loss_function(cmd.loss);
  TrainingOptions options;
  options.optimizer = optimizer;
  auto t0 = Clock::now();
  GraphModule step = export_training(m, loss_fn, clone_tensors(inputs), targets, options);
  double capture_ms = ms_since(t0);
  step.lint();
  TrainingSignature sig = training_signature(step);

  std::optional<Check> checked;
  if (check) checked = check_step(m, step, loss_fn, optimizer, inputs, targets);
  if (!output.empty()) save(step, output);

  if (as_json) {
    json j = summary_json(step);
    j["loss"] = cmd.loss;
    j["optimizer"] = describe(optimizer);
    json roles = json::object();
    for (StepRole r : {StepRole::Loss, StepRole::Gradient, StepRole::ParameterUpdate,
                       StepRole::OptimizerState, StepRole::BufferUpdate}) {
      roles[step_role_name(r)] = sig.count(r);
    }
    j["roles"] = roles;
    j["trace_ms"] = capture_ms;
    j["eager_loss"] = checked ? json(checked->loss) : json(nullptr);
    j["max_abs_diff"] = checked ? json(checked->max_diff) : json(nullptr);
    if (!output.empty()) j["file"] = output;
    std::cout << j.dump() << "\n";
    return 0;
  }
  GraphSummary s = summarize(step);
  std::printf("captured a training step of %s (%s loss, %s): %zu nodes (%zu placeholder, %zu get_attr, "
              "%zu call_function, %zu output) in %.1f ms\n",
              model.c_str(), cmd.loss.c_str(), describe(optimizer).c_str(), s.nodes, s.placeholders,
              s.get_attrs, s.call_functions, s.outputs, capture_ms);
  std::printf("%s\n", outputs_line(sig).c_str());
  if (checked) {
    std::printf("one step against eager LibTorch%s: loss %.6g, max |step - eager| = %g\n",
                std::holds_alternative<GradientsOnly>(optimizer) ? "" : " and torch::optim",
                checked->loss, checked->max_diff);
  } else {
    std::printf("not checked against eager training (--no-check)\n");
  }
  if (!output.empty()) std::printf("saved %s\n", output.c_str());
  return 0;
}

namespace {

// Note [Batches of run --steps]
// A step's inputs are the model's inputs followed by its targets. Training
// on one batch only fits that batch, so `run --steps` also takes several:
//   --input SPEC ...   the same batch every step, except that an --input
//                      file holding one more leading dimension than the
//                      step's input is a stack of batches (xs of shape
//                      [B, 32, 64] for an input [32, 64]); stacks must hold
//                      as many batches as each other;
//   --data FILE        torch.save'd list of batches, each a tuple (or list)
//                      of the step's inputs, or a tensor for a step with one
//                      input: `[(x, y) for x, y in loader]`.
// Step i takes batch (i - 1) mod B: the batches are cycled in order, as
// epochs of a loader without shuffling.
struct Batches {
  std::vector<std::vector<at::Tensor>> batches;  // each: the step's inputs
  std::string source;                            // for the summary: "3 batches from --data d.pt"
};

std::vector<std::optional<TensorMeta>> step_input_metas(const GraphModule& gm) {
  std::vector<std::optional<TensorMeta>> metas;
  for (const Node* n : gm.graph()) {
    if (n->op() != OpCode::Placeholder) continue;
    const ValueMeta& v = n->meta().val;
    metas.push_back(v.kind == ValueKind::Tensor && v.tensors.size() == 1 ? std::optional<TensorMeta>(v.tensors[0])
                                                                          : std::nullopt);
  }
  return metas;
}

Batches batches_from_inputs(const GraphModule& gm, const std::vector<std::string>& specs) {
  std::vector<std::optional<TensorMeta>> metas = step_input_metas(gm);
  std::vector<at::Tensor> given;
  for (const std::string& s : specs) given.push_back(parse_input(s));
  if (given.size() != metas.size()) return {{given}, ""};  // the run reports the count
  int64_t count = -1;
  std::string first;
  std::vector<bool> stacked(given.size(), false);
  for (size_t i = 0; i < given.size(); ++i) {
    const std::optional<TensorMeta>& m = metas[i];
    const at::Tensor& t = given[i];
    if (!m || !is_file(specs[i]) || t.dim() != static_cast<int64_t>(m->sizes.size()) + 1 ||
        t.sizes().slice(1) != c10::IntArrayRef(m->sizes)) {
      continue;
    }
    if (count >= 0 && t.size(0) != count) {
      throw Error(c10::str("--input '", specs[i], "' holds a stack of ", t.size(0), " batches and --input '",
                           first, "' one of ", count, "; stacked inputs must hold as many batches"));
    }
    count = t.size(0);
    first = specs[i];
    stacked[i] = true;
  }
  if (count == 0) throw Error("--input '" + first + "' holds a stack of 0 batches");
  if (count < 0) return {{given}, ""};
  Batches b;
  for (int64_t k = 0; k < count; ++k) {
    std::vector<at::Tensor> batch;
    for (size_t i = 0; i < given.size(); ++i) batch.push_back(stacked[i] ? given[i][k] : given[i]);
    b.batches.push_back(std::move(batch));
  }
  b.source = c10::str(count, " batches from stacked --input");
  return b;
}

Batches batches_from_data(const std::string& path, size_t num_inputs) {
  c10::IValue value = load_value_file(path);
  std::vector<c10::IValue> items;
  if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) items.push_back(v);
  } else if (value.isTuple()) {
    for (const c10::IValue& v : value.toTupleRef().elements()) items.push_back(v);
  } else {
    throw Error("--data " + path + ": expected a list of batches (torch.save([(x, y), ...])), got " +
                kind_of(value));
  }
  if (items.empty()) throw Error("--data " + path + ": the list of batches is empty");
  Batches b;
  for (size_t k = 0; k < items.size(); ++k) {
    const c10::IValue& item = items[k];
    std::vector<c10::IValue> fields;
    if (item.isTensor() && num_inputs == 1) {
      fields.push_back(item);
    } else if (item.isTuple()) {
      for (const c10::IValue& v : item.toTupleRef().elements()) fields.push_back(v);
    } else if (item.isList()) {
      for (const c10::IValue& v : item.toListRef()) fields.push_back(v);
    }
    bool tensors = fields.size() == num_inputs;
    for (const c10::IValue& f : fields) tensors = tensors && f.isTensor();
    if (!tensors) {
      throw Error(c10::str("--data ", path, ": batch ", k, " is ", kind_of(item),
                           (item.isTuple() || item.isList() ? c10::str(" of ", fields.size()) : std::string()),
                           "; the step takes ", num_inputs, " tensor(s) per batch (the model's inputs, "
                           "then its targets)"));
    }
    std::vector<at::Tensor> batch;
    for (const c10::IValue& f : fields) batch.push_back(f.toTensor());
    b.batches.push_back(std::move(batch));
  }
  b.source = c10::str(items.size(), " batches from ", path);
  return b;
}

}  // namespace

int cmd_run_steps(const std::string& file, const std::vector<std::string>& input_specs,
                  const std::string& data, int64_t steps, const std::string& output, bool as_json) {
  if (steps < 1) throw Error("--steps must be 1 or more, got " + std::to_string(steps));
  GraphModule gm = load(file);
  if (!is_training_step(gm)) {
    throw Error("'" + file + "' is not a training step (its outputs are " + gm.out_spec.str() +
                "); --steps runs steps made by `torchcap trace --train`");
  }
  TrainingSignature sig = training_signature(gm);
  Interpreter interp(gm);
  if (!data.empty() && !input_specs.empty()) {
    throw Error("give the batches with --data or with --input, not both");
  }
  if (input_specs.empty() && data.empty()) {
    throw Error("give the step's inputs and targets with --input (" + std::to_string(interp.num_inputs()) +
                " of them, in the order of trace --train's --input then --target), or batches of "
                "them with --data");
  }
  Batches batches = data.empty() ? batches_from_inputs(gm, input_specs)
                                 : batches_from_data(data, interp.num_inputs());
  if (batches.batches[0].size() != interp.num_inputs()) {
    throw Error("'" + file + "' takes " + std::to_string(interp.num_inputs()) +
                " input(s) (the model's inputs, then its targets), got " +
                std::to_string(batches.batches[0].size()) + " --input");
  }
  StepProgress progress(steps);
  std::vector<double> losses;
  auto t0 = Clock::now();
  for (int64_t i = 1; i <= steps; ++i) {
    const size_t k = static_cast<size_t>(i - 1) % batches.batches.size();
    std::vector<at::Tensor> out;
    try {
      out = interp.run_flat(batches.batches[k]);
    } catch (const InputError& e) {
      if (batches.source.empty()) throw;
      throw InputError(c10::str("batch ", k, " (", batches.source, "): ", e.what()));
    }
    double loss = out.at(sig.loss).item<double>();
    if (!std::isfinite(loss)) {
      throw Error(c10::str("step ", i, ": the loss is ", loss, " (try a smaller --lr when tracing)"));
    }
    losses.push_back(loss);
    if (!as_json) progress.report(i, loss);
  }
  double ms = ms_since(t0);
  if (!output.empty()) save(gm, output);
  if (as_json) {
    json j{{"steps", steps}, {"batches", batches.batches.size()}, {"losses", losses}, {"time_ms", ms}};
    if (!output.empty()) j["file"] = output;
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::printf("%lld steps in %.1f ms (%.3g ms a step): loss %.6g -> %.6g%s\n", static_cast<long long>(steps),
              ms, ms / static_cast<double>(steps), losses.front(), losses.back(),
              batches.source.empty() ? "" : (" (" + batches.source + ")").c_str());
  if (!output.empty()) std::printf("saved the trained step to %s\n", output.c_str());
  return 0;
}

}  // namespace torchcap::cli
