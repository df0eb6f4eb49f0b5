// memory_bench: memory plans of real models, `name: value unit` lines.
//
// For each model: arena bytes of no reuse (naive), ExecuTorch's greedy and
// the chosen plan, the live-bytes lower bound and the ratios to it; then run
// times of the planned interpreter, the unplanned one and eager (TorchScript
// for the scripted model), one thread, interleaved, and the allocations
// through LibTorch's CPU allocator per run.
// MobileNetV2 is torchvision's, scripted by Python at run time (skipped if
// Debian's python3-torchvision is missing).
#include "bench_util.h"
#include "counting_allocator.h"
#include "zoo.h"

#include <torchcap/interpreter.h>
#include <torchcap/memory_plan.h>
#include <torchcap/tracer.h>

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>

#include <torch/script.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <unistd.h>

namespace torchcap::bench {
namespace {

struct Model {
  std::string name;
  GraphModule gm;
  std::function<void()> eager;  // the program itself
  std::vector<c10::IValue> inputs;
};

using examples::CountingAllocator;

size_t allocations(const std::function<void()>& fn) {
  CountingAllocator counting;
  fn();
  return counting.count();
}

std::optional<Model> torchvision_model(const std::string& name) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("torchcap_memory_bench_" + std::to_string(::getpid()));
  std::string script = std::string(TORCHCAP_SOURCE_DIR) + "/tests/python/make_torchvision_models.py";
  std::string command = "/usr/bin/python3 " + script + " " + dir.string() + " " + name + " >/dev/null 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::cerr << "memory_bench: skipping " << name << " (cannot script it with torchvision)\n";
    return std::nullopt;
  }
  auto m = std::make_shared<torch::jit::Module>(torch::jit::load((dir / (name + ".pt")).string()));
  std::filesystem::remove_all(dir);
  std::vector<c10::IValue> inputs{torch::randn({1, 3, 224, 224})};
  return Model{name, trace(*m, inputs), [m, inputs] { m->forward(inputs); }, inputs};
}

void print_plan(const std::string& name, const MemoryPlan& plan) {
  std::string p = "memory/" + name + "/";
  auto kib = [&](const char* what, int64_t b, const std::string& note = {}) {
    std::printf("%s%s: %.1f KiB%s\n", p.c_str(), what, b / 1024.0, note.c_str());
  };
  print(p + "buffers", static_cast<double>(plan.values.size()), "tensors");
  kib("naive", plan.naive_bytes);
  kib("greedy", plan.greedy_bytes);
  kib("chosen", plan.arena_bytes, " (" + plan.algorithm + ")");
  kib("lower_bound", plan.lower_bound_bytes);
  double bound = static_cast<double>(std::max<int64_t>(plan.lower_bound_bytes, 1));
  std::printf("%sgreedy_vs_bound: %.3f x\n", p.c_str(), plan.greedy_bytes / bound);
  std::printf("%schosen_vs_bound: %.3f x\n", p.c_str(), plan.arena_bytes / bound);
  std::fflush(stdout);
}

}  // namespace

void print_runs(const Model& m) {
  at::NoGradGuard no_grad;
  Interpreter plain(m.gm);
  Interpreter planned(m.gm, InterpreterOptions{true});
  auto run_plain = [&] { plain.run(m.inputs); };
  auto run_planned = [&] { planned.run(m.inputs); };
  run_planned();  // the arena
  int iters = iterations_for(run_plain);
  // Interleaved, best of three medians: load drifts hit all three alike.
  double t_plain = 1e9, t_planned = 1e9, t_eager = 1e9;
  for (int round = 0; round < 3; ++round) {
    t_eager = std::min(t_eager, median_seconds(m.eager, 5, iters, 2));
    t_plain = std::min(t_plain, median_seconds(run_plain, 5, iters, 2));
    t_planned = std::min(t_planned, median_seconds(run_planned, 5, iters, 2));
  }
  size_t a_plain = allocations(run_plain), a_planned = allocations(run_planned);
  size_t a_eager = allocations(m.eager);
  size_t with_out = 0, ops = 0;
  for (const OperatorPlan& op : planned.planned_operators()) {
    ++ops;
    with_out += op.fallback.empty() ? 1 : 0;
  }
  std::string p = "memory/" + m.name + "/";
  std::printf("%sout_variant_nodes: %zu of %zu\n", p.c_str(), with_out, ops);
  print(p + "run_eager", t_eager * 1e3, "ms");
  print(p + "run_unplanned", t_plain * 1e3, "ms");
  print(p + "run_planned", t_planned * 1e3, "ms");
  std::printf("%splanned_vs_unplanned: %.3f x\n", p.c_str(), t_planned / t_plain);
  std::printf("%splanned_vs_eager: %.3f x\n", p.c_str(), t_planned / t_eager);
  print(p + "allocations_eager", static_cast<double>(a_eager), "per run");
  print(p + "allocations_unplanned", static_cast<double>(a_plain), "per run");
  print(p + "allocations_planned", static_cast<double>(a_planned), "per run");
}

void memory_benchmarks(bool runs) {
  at::set_num_threads(1);
  std::vector<Model> models;
  for (const std::string name : {"mlp200", "resnet18", "transformer_encoder"}) {
    auto e = std::make_shared<examples::Example>(examples::make(name));
    std::vector<c10::IValue> inputs = e->make_inputs(1);
    models.push_back(Model{name, examples::trace(*e), [e, inputs] { e->forward(inputs); }, inputs});
  }
  if (std::optional<Model> m = torchvision_model("mobilenet_v2")) models.push_back(std::move(*m));
  for (const Model& m : models) {
    print_plan(m.name, plan_memory(m.gm.graph()));
    if (runs) print_runs(m);
  }
}

}  // namespace torchcap::bench

//   memory_bench [--plans-only]
int main(int argc, char** argv) {
  bool runs = !(argc > 1 && std::string(argv[1]) == "--plans-only");
  torchcap::bench::memory_benchmarks(runs);
  return 0;
}
