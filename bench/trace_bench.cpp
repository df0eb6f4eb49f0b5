// Tracing cost: eager time vs trace time, per recorded node; growth with
// chain length.
#include "bench_util.h"
#include "zoo.h"

#include <torchcap/tracer.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

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
}

}  // namespace torchcap::bench
