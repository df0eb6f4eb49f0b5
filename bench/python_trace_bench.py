"""Tracing from Python: torchcap.trace against make_fx, in one run.

For each model prints eager time, the time to trace it with torchcap (the
C++ graph alone, and the torch.fx.GraphModule torchcap.trace returns) and
with make_fx (real mode), each tracer's overhead per node
((trace - eager) / nodes of torchcap's graph, get_attr nodes included, as the
C++ benchmark counts) and the ratio of make_fx's overhead to
torchcap's. Times are medians of several runs, in one process, one thread.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_trace_bench.py
"""

import statistics
import time

import torch
import torch.nn as nn
import torchvision
from torch.fx.experimental.proxy_tensor import make_fx

import torchcap
from torchcap import _trace

torch.manual_seed(0)
torch.set_num_threads(1)


def median_seconds(fn, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpp_graph(model, x, record_stack_traces):
    """torchcap._C's trace alone: the graph in C++, not yet a torch.fx module."""
    return _trace._C.trace(model, list(model.named_parameters()), list(model.named_buffers()),
                           (x,), {}, False, False, None, False, False, record_stack_traces,
                           _trace._INTERNAL_DIRS)


def bench(name, model, x, runs, make_fx_runs):
    model.eval()
    with torch.no_grad():
        model(x)  # warm up kernels and allocator
        eager = median_seconds(lambda: model(x), runs)
    gm = torchcap.trace(model, (x,))
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    nodes = len(gm.graph.nodes)
    cpp = median_seconds(lambda: cpp_graph(model, x, True), runs)
    cpp_nostack = median_seconds(lambda: cpp_graph(model, x, False), runs)
    full = median_seconds(lambda: torchcap.trace(model, (x,)), runs)

    def run_make_fx():
        with torch.no_grad():
            make_fx(model)(x)

    run_make_fx()
    mfx = median_seconds(run_make_fx, make_fx_runs)

    def per_op(t):
        return (t - eager) / nodes * 1e6

    print(f"{name}: {nodes} nodes ({ops} operators), eager {eager * 1e3:.2f} ms")
    rows = [("torchcap trace, C++ graph", cpp),
            ("torchcap trace, C++ graph, no stack traces", cpp_nostack),
            ("torchcap.trace -> torch.fx.GraphModule", full),
            ("make_fx (real mode)", mfx)]
    for label, t in rows:
        print(f"  {label + ':':<46} {t * 1e3:8.2f} ms  overhead {per_op(t):7.2f} us/node")
    print(f"  make_fx overhead / torchcap overhead: {per_op(mfx) / per_op(cpp):.0f}x (C++ graph), "
          f"{per_op(mfx) / per_op(full):.0f}x (torch.fx.GraphModule)")


def main():
    mlp = nn.Sequential(*[m for _ in range(200) for m in (nn.Linear(64, 64), nn.ReLU())])
    bench("MLP 200 x (Linear 64 + ReLU), batch 1", mlp, torch.randn(1, 64), runs=20,
          make_fx_runs=3)
    bench("ResNet-18, 1x3x64x64", torchvision.models.resnet18(), torch.randn(1, 3, 64, 64),
          runs=20, make_fx_runs=3)


if __name__ == "__main__":
    main()
