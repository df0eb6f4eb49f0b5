// memory_bench: memory plans of real models, `name: value unit` lines.
//
// For each model: arena bytes of no reuse (naive), ExecuTorch's greedy and
// the chosen plan, the live-bytes lower bound and the ratios to it.
// MobileNetV2 is torchvision's, scripted by Python at run time (skipped if
// Debian's python3-torchvision is missing).
#include "bench_util.h"
#include "zoo.h"

#include <torchcap/memory_plan.h>
#include <torchcap/tracer.h>

#include <torch/script.h>

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
};

std::optional<Model> torchvision_model(const std::string& name) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("torchcap_memory_bench_" + std::to_string(::getpid()));
  std::string script = std::string(TORCHCAP_SOURCE_DIR) + "/tests/python/make_torchvision_models.py";
  std::string command = "/usr/bin/python3 " + script + " " + dir.string() + " " + name + " >/dev/null 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::cerr << "memory_bench: skipping " << name << " (cannot script it with torchvision)\n";
    return std::nullopt;
  }
  torch::jit::Module m = torch::jit::load((dir / (name + ".pt")).string());
  std::filesystem::remove_all(dir);
  return Model{name, trace(m, {torch::randn({1, 3, 224, 224})})};
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

void memory_benchmarks() {
  std::vector<Model> models;
  for (const std::string name : {"resnet18", "transformer_encoder", "mlp200"}) {
    examples::Example e = examples::make(name);
    models.push_back(Model{name, examples::trace(e)});
  }
  if (std::optional<Model> m = torchvision_model("mobilenet_v2")) models.push_back(std::move(*m));
  for (const Model& m : models) print_plan(m.name, plan_memory(m.gm.graph()));
}

}  // namespace torchcap::bench

int main() {
  torchcap::bench::memory_benchmarks();
  return 0;
}
