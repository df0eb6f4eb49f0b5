// Dynamic shapes, side by side in one run (Note [Dynamic shapes by aligned
// traces] in src/trace/dynamic.cpp), for ResNet-18 (dynamic batch) and a
// GPT-style decoder (dynamic batch and length):
//   - trace time, dynamic against static, at the example's sizes;
//   - the interpreter at a new size against eager: the dynamic graph (its
//     plan for that size kept) and a static graph traced at that size, each
//     as a ratio to eager's time, and the ratio of the two;
//   - the first call at a new size, which makes that size's plan.
// One thread, medians over runs.
#include "bench_util.h"
#include "transformers.h"
#include "zoo.h"

#include <torchcap/interpreter.h>
#include <torchcap/tracer.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

using namespace torchcap;

namespace {

struct Program {
  const char* name;
  std::function<GraphModule(const std::vector<c10::IValue>&, const TraceOptions&)> trace;
  std::function<c10::IValue(const std::vector<c10::IValue>&)> eager;
  std::vector<c10::IValue> example, other;
  std::vector<DynamicDim> dims;
};

void measure(const Program& p) {
  TraceOptions dynamic;
  dynamic.dynamic = p.dims;
  const int runs = 9;
  const double static_trace = bench::median_seconds([&] { p.trace(p.example, {}); }, runs);
  const double dynamic_trace = bench::median_seconds([&] { p.trace(p.example, dynamic); }, runs);
  GraphModule dyn = p.trace(p.example, dynamic);
  GraphModule fixed = p.trace(p.other, {});  // a static graph at the new size
  Interpreter run_dynamic(dyn);
  Interpreter run_fixed(fixed);
  torch::NoGradGuard no_grad;
  auto t0 = std::chrono::steady_clock::now();
  run_dynamic.run(p.other);  // makes the plan of that size
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Interleaved rounds, so load changes hit each side alike.
  std::vector<double> eager, dyn_t, fixed_t;
  for (int r = 0; r < 15; ++r) {
    eager.push_back(bench::median_seconds([&] { p.eager(p.other); }, 1, 3, r == 0 ? 2 : 0));
    dyn_t.push_back(bench::median_seconds([&] { run_dynamic.run(p.other); }, 1, 3, r == 0 ? 2 : 0));
    fixed_t.push_back(bench::median_seconds([&] { run_fixed.run(p.other); }, 1, 3, r == 0 ? 2 : 0));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double e = median(eager), d = median(dyn_t), f = median(fixed_t);
  std::printf("%s\n", p.name);
  std::printf("  trace: static %.1f ms, dynamic %.1f ms: dynamic / static %.2fx (target <= 2.5x)\n",
              static_trace * 1e3, dynamic_trace * 1e3, dynamic_trace / static_trace);
  std::printf("  at a new size: eager %.2f ms, dynamic graph %.2f ms (%.3fx eager), static graph "
              "traced there %.2f ms (%.3fx eager): dynamic / static %.3f (target 1 +- 0.05)\n",
              e * 1e3, d * 1e3, d / e, f * 1e3, f / e, d / f);
  std::printf("  first call at a new size (its plan made): %.2f ms\n", first * 1e3);
}

}  // namespace

int main() {
  at::set_num_threads(1);
  torch::manual_seed(0);

  examples::Example resnet = examples::make("resnet18");
  Program r{"ResNet-18, batch dynamic (traced at 2x3x64x64, run at 6x3x64x64)",
            [&](const std::vector<c10::IValue>& in, const TraceOptions& o) {
              return examples::trace(resnet, o, in);
            },
            [&](const std::vector<c10::IValue>& in) { return resnet.forward(in); },
            {torch::randn({2, 3, 64, 64})},
            {torch::randn({6, 3, 64, 64})},
            {{0, 0, "batch", 1, 64}}};
  measure(r);

  examples::DecoderOptions o{.layers = 4, .width = 128, .heads = 4, .vocab = 1000, .context = 128};
  auto decoder = std::make_shared<examples::Decoder>(o);
  auto forward = [decoder](const std::vector<c10::IValue>& in) -> c10::IValue {
    return decoder->forward(in[0].toTensor());
  };
  Program d{"GPT-style decoder (4 layers, width 128), batch and length dynamic (traced at 2x16, "
            "run at 3x40)",
            [&](const std::vector<c10::IValue>& in, const TraceOptions& opts) {
              return trace(*decoder, [&](std::vector<c10::IValue> args) { return forward(args); }, in,
                           opts);
            },
            forward,
            {torch::randint(0, 1000, {2, 16})},
            {torch::randint(0, 1000, {3, 40})},
            {{0, 0, "batch", 1, 32}, {0, 1, "seq", 1, 128}}};
  measure(d);
  return 0;
}
