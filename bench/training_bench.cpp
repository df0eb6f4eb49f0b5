// One training step: eager LibTorch (forward, loss, backward,
// optimizer.step() of torch::optim) against the same step captured by
// export_training and run by the Interpreter, one thread, side by side.
#include "bench_util.h"
#include "models.h"

#include <torchcap/interpreter.h>
#include <torchcap/training.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <ctime>

namespace torchcap::bench {
namespace {

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Wall and CPU seconds per call of `fn` over one run of `iters` calls (one
// thread: LibTorch's CPU autograd engine runs the backward on the calling
// thread). On a shared machine a run waits for a core now and then; its CPU
// time does not count the wait, so it is the steadier comparison.
std::pair<double, double> wall_and_cpu(const std::function<void()>& fn, int iters) {
  auto t0 = std::chrono::steady_clock::now();
  double c0 = thread_cpu_seconds();
  for (int i = 0; i < iters; ++i) fn();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters,
          (thread_cpu_seconds() - c0) / iters};
}

struct TrainingCase {
  std::string name;
  std::function<std::shared_ptr<torch::nn::Module>()> make;  // the same weights each call
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward;
  at::Tensor x, y;
  LossFunction loss;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> eager_loss;
};

template <typename M>
std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward_of() {
  return [](torch::nn::Module& m, const at::Tensor& x) { return static_cast<M&>(m).forward(x); };
}

void bench_case(const std::string& only, const TrainingCase& c, const std::string& optimizer_name,
                const Optimizer& optimizer,
                std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)> make_eager) {
  if ((c.name + "/" + optimizer_name).find(only) == std::string::npos) return;
  // Two models with the same weights: one trained eagerly, one through the step.
  std::shared_ptr<torch::nn::Module> eager_model = c.make();
  std::shared_ptr<torch::nn::Module> captured_model = c.make();
  eager_model->train();
  captured_model->train();
  auto opt = make_eager(eager_model->parameters());
  auto eager_step = [&] {
    opt->zero_grad();
    at::Tensor loss = c.eager_loss(c.forward(*eager_model, c.x), c.y);
    loss.backward();
    opt->step();
  };

  TrainingOptions options;
  options.optimizer = optimizer;
  auto forward = [&](std::vector<c10::IValue> in) {
    return c10::IValue(c.forward(*captured_model, in[0].toTensor()));
  };
  GraphModule step = export_training(*captured_model, forward, c.loss, {c.x}, {c.y}, options);
  size_t nodes = 0;
  for (const Node* n : step.graph()) nodes += n->op() == OpCode::CallFunction ? 1 : 0;
  auto t0 = std::chrono::steady_clock::now();
  Interpreter interp(step);
  const double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  InterpreterOptions planned_options;
  planned_options.plan_memory = true;
  Interpreter planned(step, planned_options);
  std::vector<c10::IValue> inputs = {c.x, c.y};
  auto captured_step = [&] { interp.run(inputs); };
  auto planned_step = [&] { planned.run(inputs); };

  int iters = iterations_for(eager_step, 0.2);
  captured_step();  // warm up (iterations_for ran the eager step)
  planned_step();
  // Interleaved rounds, the best of each: load drifts hit all three alike,
  // and a noisy neighbour only ever adds time, so the least is the closest
  // to the step's own cost.
  std::pair<double, double> eager{1e9, 1e9}, captured{1e9, 1e9}, with_plan{1e9, 1e9};
  auto keep_best = [](std::pair<double, double>& best, std::pair<double, double> t) {
    best = {std::min(best.first, t.first), std::min(best.second, t.second)};
  };
  for (int round = 0; round < 12; ++round) {
    keep_best(eager, wall_and_cpu(eager_step, iters));
    keep_best(captured, wall_and_cpu(captured_step, iters));
    keep_best(with_plan, wall_and_cpu(planned_step, iters));
  }
  // Page faults a step takes: memory the heap gave back to the system
  // between steps (glibc trims the top of the heap) and takes again.
  auto faults_per_step = [&](const std::function<void()>& fn) {
    rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    for (int i = 0; i < iters; ++i) fn();
    getrusage(RUSAGE_SELF, &after);
    return static_cast<double>(after.ru_minflt - before.ru_minflt) / iters;
  };
  const double eager_faults = faults_per_step(eager_step);
  const double captured_faults = faults_per_step(captured_step);
  std::string p = "train/" + c.name + "/" + optimizer_name + "/";
  print(p + "nodes", static_cast<double>(nodes), "nodes");
  print(p + "interpreter_construction", plan_ms, "ms");
  print(p + "eager", eager.first * 1e3, "ms");
  print(p + "captured", captured.first * 1e3, "ms");
  print(p + "captured_planned", with_plan.first * 1e3, "ms");
  print(p + "captured_vs_eager", captured.first / eager.first, "x");
  print(p + "captured_planned_vs_eager", with_plan.first / eager.first, "x");
  print(p + "eager_cpu", eager.second * 1e3, "ms");
  print(p + "captured_cpu", captured.second * 1e3, "ms");
  print(p + "captured_planned_cpu", with_plan.second * 1e3, "ms");
  print(p + "captured_vs_eager_cpu", captured.second / eager.second, "x");
  print(p + "captured_planned_vs_eager_cpu", with_plan.second / eager.second, "x");
  print(p + "eager_page_faults", eager_faults, "per step");
  print(p + "captured_page_faults", captured_faults, "per step");
}

}  // namespace

void training_benchmarks(const std::string& only) {
  at::set_num_threads(1);
  std::vector<TrainingCase> cases;
  {
    TrainingCase c;
    c.name = "mlp200";
    c.make = [] {
      torch::manual_seed(0);
      return std::make_shared<examples::DeepMLP>(200, 64);
    };
    c.forward = forward_of<examples::DeepMLP>();
    torch::manual_seed(1);
    c.x = at::randn({32, 64});
    c.y = at::randn({32, 64});
    c.loss = losses::mse();
    c.eager_loss = [](const at::Tensor& out, const at::Tensor& y) { return torch::mse_loss(out, y); };
    cases.push_back(c);
  }
  {
    TrainingCase c;
    c.name = "resnet18";
    c.make = [] {
      torch::manual_seed(0);
      return std::make_shared<examples::ResNet18>();
    };
    c.forward = forward_of<examples::ResNet18>();
    torch::manual_seed(1);
    c.x = at::randn({8, 3, 224, 224});
    c.y = at::randint(0, 1000, {8}, at::kLong);
    c.loss = losses::cross_entropy();
    c.eager_loss = [](const at::Tensor& out, const at::Tensor& y) { return torch::cross_entropy_loss(out, y); };
    cases.push_back(c);
  }
  for (const TrainingCase& c : cases) {
    SGD sgd{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4};
    bench_case(only, c, "sgd", sgd, [&](std::vector<at::Tensor> params) {
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(sgd.lr).momentum(sgd.momentum).weight_decay(sgd.weight_decay));
    });
    if (c.name != "mlp200") continue;
    Adam adam{.lr = 1e-3};
    bench_case(only, c, "adam", adam, [&](std::vector<at::Tensor> params) {
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(adam.lr));
    });
  }
}

}  // namespace torchcap::bench
