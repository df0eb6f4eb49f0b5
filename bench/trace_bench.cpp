// Tracing cost: eager time vs trace time, per recorded node; growth with
// chain length.
#include "bench_util.h"
#include "zoo.h"

#include <torchcap/tracer.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace torchcap::bench {

void trace_benchmarks() {
  for (const std::string name : {"mlp200", "resnet18"}) {
    examples::Example e = examples::make(name);
    std::vector<c10::IValue> inputs = e.make_inputs(0);
    auto eager = [&] {
      at::NoGradGuard no_grad;
      e.forward(inputs);
    };
    size_t nodes = 0;
    auto traced = [&] { nodes = examples::trace(e, {}, inputs).graph().size(); };
    int iters = iterations_for(traced);
    double t_eager = median_seconds(eager, 7, iters);
    double t_trace = median_seconds(traced, 7, iters);
    print("trace/" + name + "/eager", t_eager * 1e3, "ms");
    print("trace/" + name + "/trace", t_trace * 1e3, "ms");
    print("trace/" + name + "/nodes", static_cast<double>(nodes), "nodes");
    print("trace/" + name + "/overhead_per_node", (t_trace - t_eager) / nodes * 1e6, "us");

    TraceOptions no_stacks;
    no_stacks.record_stack_traces = false;
    auto traced_plain = [&] { examples::trace(e, no_stacks, inputs); };
    double t_plain = median_seconds(traced_plain, 7, iters);
    print("trace/" + name + "/overhead_per_node_without_stack_traces",
          (t_plain - t_eager) / nodes * 1e6, "us");
  }

  // Chains of elementwise operators: time and memory should grow linearly.
  for (int64_t length : {1000, 10000, 100000}) {
    auto chain = [length](std::vector<c10::IValue> in) {
      at::Tensor x = in[0].toTensor();
      for (int64_t i = 0; i < length; ++i) x = at::sin(x);
      return c10::IValue(x);
    };
    std::vector<c10::IValue> inputs = {at::randn({4})};
    size_t heap_before = heap_in_use();
    size_t rss_before = rss_bytes();
    size_t graph_bytes = 0, rss_growth = 0;
    auto traced = [&] {
      GraphModule gm = trace(chain, inputs);
      graph_bytes = heap_in_use() - heap_before;
      rss_growth = std::max(rss_growth, rss_bytes() - std::min(rss_before, rss_bytes()));
    };
    int runs = length >= 100000 ? 5 : 7;
    double t = median_seconds(traced, runs, 1, 1);
    std::string prefix = "trace/chain_" + std::to_string(length);
    print(prefix + "/time", t * 1e3, "ms");
    print(prefix + "/time_per_node", t / length * 1e6, "us");
    print(prefix + "/graph_memory", graph_bytes / 1048576.0, "MiB");
    print(prefix + "/graph_memory_per_node", static_cast<double>(graph_bytes) / length, "bytes");
    print(prefix + "/peak_rss_so_far", peak_rss_bytes() / 1048576.0, "MiB");
  }

  // The tracer between kernels that evict the caches. A model's large
  // kernels (a convolution reads megabytes of weights) evict what the
  // tracer keeps between operators: its code, the graph's tail, its tables.
  // Here 100 small operators run with a 16 MB buffer read between them
  // (plain C++, not recorded), and without. Only the operator calls are
  // timed (the reads vary more from run to run than the tracer costs), in
  // eager runs and traces taken in turn: the median excess per operator of
  // each tells what the tracer's memory footprint costs when none of it is
  // cached, and when all of it is.
  std::vector<char> buffer(16 << 20, 1);
  volatile long sink = 0;
  auto evict = [&] {
    long sum = 0;
    for (size_t i = 0; i < buffer.size(); i += 64) sum += buffer[i];
    sink = sum;
  };
  for (const bool cold : {false, true}) {
    constexpr int kOps = 100;
    double op_seconds = 0;
    auto timed = [&op_seconds](const auto& op) {
      const auto t0 = std::chrono::steady_clock::now();
      at::Tensor y = op();
      op_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return y;
    };
    auto chain = [&, cold](std::vector<c10::IValue> in) {
      at::Tensor x = in[0].toTensor();
      for (int i = 0; i < kOps / 2; ++i) {
        if (cold) evict();
        x = timed([&] { return at::relu(x); });
        if (cold) evict();
        x = timed([&] { return at::mul(x, x); });
      }
      return c10::IValue(x);
    };
    std::vector<c10::IValue> inputs = {at::randn({4})};
    auto operator_seconds = [&](bool traced) {
      op_seconds = 0;
      if (traced) {
        trace(chain, inputs);
      } else {
        at::NoGradGuard no_grad;
        chain(inputs);
      }
      return op_seconds;
    };
    std::vector<double> excess;
    for (int round = 0; round < 42; ++round) {
      const double eager = operator_seconds(false);
      const double traced = operator_seconds(true);
      if (round >= 2) excess.push_back(traced - eager);  // two rounds to warm up
    }
    std::sort(excess.begin(), excess.end());
    print(std::string("trace/chain_100_") + (cold ? "evicting_16mb" : "warm") +
              "/overhead_per_operator",
          excess[excess.size() / 2] / kOps * 1e6, "us");
  }
}

}  // namespace torchcap::bench
