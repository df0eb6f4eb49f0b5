// Running a captured graph: eager C++ vs torchcap's interpreter vs
// TorchScript (the same module traced by LibTorch's own C++ tracer), one
// thread, side by side.
#include "bench_util.h"
#include "zoo.h"

#include <torchcap/interpreter.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

namespace torchcap::bench {

void interpreter_benchmarks() {
  at::set_num_threads(1);
  for (const std::string name : {"mlp200", "resnet18", "transformer_encoder"}) {
    examples::Example e = examples::make(name);
    examples::freeze(e);  // LibTorch's tracer takes parameters as constants
    std::vector<c10::IValue> inputs = e.make_inputs(1);
    at::NoGradGuard no_grad;

    GraphModule gm = examples::trace(e);
    size_t nodes = 0;
    for (const Node* n : gm.graph()) nodes += n->op() == OpCode::CallFunction ? 1 : 0;
    Interpreter interp(gm);

    // LibTorch's own tracer over the same program, run by its graph executor.
    auto traced = torch::jit::tracer::trace(
        inputs,
        [&](torch::jit::Stack in) { return torch::jit::Stack{e.forward(std::move(in))}; },
        [](const at::Tensor&) { return std::string(); }, /*strict=*/false,
        /*force_outplace=*/false);
    torch::jit::GraphExecutor script(traced.first->graph, "forward");

    auto run_eager = [&] { e.forward(inputs); };
    auto run_interp = [&] { interp.run(inputs); };
    auto run_script = [&] {
      torch::jit::Stack s(inputs.begin(), inputs.end());
      script.run(s);
    };
    int iters = iterations_for(run_eager);
    // Interleave the three so drifts in machine load hit them alike.
    double t_eager = 1e9, t_interp = 1e9, t_script = 1e9;
    for (int round = 0; round < 3; ++round) {
      t_eager = std::min(t_eager, median_seconds(run_eager, 5, iters, 3));
      t_interp = std::min(t_interp, median_seconds(run_interp, 5, iters, 3));
      t_script = std::min(t_script, median_seconds(run_script, 5, iters, 3));
    }
    std::string p = "run/" + name + "/";
    print(p + "nodes", static_cast<double>(nodes), "nodes");
    print(p + "eager", t_eager * 1e3, "ms");
    print(p + "interpreter", t_interp * 1e3, "ms");
    print(p + "torchscript", t_script * 1e3, "ms");
    print(p + "interpreter_vs_eager", t_interp / t_eager, "x");
    print(p + "torchscript_vs_eager", t_script / t_eager, "x");
    print(p + "interpreter_overhead_per_node", (t_interp - t_eager) / nodes * 1e6, "us");
  }
}

}  // namespace torchcap::bench
