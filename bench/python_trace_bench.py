"""Tracing from Python: torchcap.trace against make_fx, in one run.

For each model, first the whole trip, what a user waits for: a traced
module's first call (trace + call, against make_fx + call of its module;
the program runs twice, so two eager runs are subtracted), and the module
with its torch.fx graph and code made (as make_fx returns it). Then the
trace alone: the C++ graph, and the torch.fx.GraphModule torchcap.trace
returns (graph and code not made), against make_fx (real mode). Overheads
are per node of torchcap's graph (get_attr nodes included, as the C++
benchmark counts), over eager, with the ratio of make_fx's to torchcap's.
Times are medians of several runs, in one process, one thread, under
no_grad. Last, for ResNet-18, torchcap.trace's parts timed apart (parts)
and what a trace costs whatever the program does (fixed_cost).

    PYTHONPATH=build/python /usr/bin/python3 bench/python_trace_bench.py
"""

import gc
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


def timed(fn):
    """(wall seconds, CPU seconds of this thread) of fn(), run right after an
    untimed fn(): one thread computes, and CPU time is less sensitive to other
    processes taking the cores.

    Each function is timed warm, after a run of itself: what ran before
    changes a run's time by as much as the overhead measured (ResNet-18 traced
    right after its eager run: up to 2 us per node more than after another
    trace; the MLP's eager run after a trace: 1.6 against 2.5 ms after one
    that compiled a module's code). The garbage of earlier runs (a traced
    torch.fx graph is cyclic, freed only by a collection) is collected first,
    untimed, so that no run pays for another's; collections a run causes
    itself count. bench() freezes the objects made before, so that a
    collection walks only those made since.

    What fn() returns is freed after the clocks stop: a tracer's time is the
    time to make its graph. The torch.fx modules of make_fx and
    torchcap.trace are cyclic and were always freed by the next collection,
    untimed; the C++ graph of the first two rows is not, and freeing it in
    the timed region (61 us on ResNet-18, 0.28 us a node) charged those rows
    alone."""
    fn()
    gc.collect()
    start, cpu = time.perf_counter(), time.thread_time()
    result = fn()
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    del result
    return wall, cpu


def paired(eager, tracers, runs, program_runs=None):
    """Median eager time, and per tracer the median time and median excess over
    the eager run of the same round (wall and thread CPU time), times
    program_runs[i] (default 1: how many times tracer i runs the program):
    the rounds interleave, so a change in the machine's load affects both
    sides of a difference alike."""
    program_runs = program_runs or [1] * len(tracers)
    eager_times, times = [], [[] for _ in tracers]
    excess, cpu_excess = [[] for _ in tracers], [[] for _ in tracers]
    for _ in range(runs):
        e, e_cpu = timed(eager)
        eager_times.append(e)
        for i, fn in enumerate(tracers):
            t, t_cpu = timed(fn)
            times[i].append(t)
            excess[i].append(t - program_runs[i] * e)
            cpu_excess[i].append(t_cpu - program_runs[i] * e_cpu)
    return (statistics.median(eager_times), [statistics.median(t) for t in times],
            [statistics.median(x) for x in excess], [statistics.median(x) for x in cpu_excess])


def cpp_graph(model, x, record_stack_traces, listed=None):
    """torchcap._C's trace alone: the graph in C++, not yet a torch.fx module
    (with the module's parameters, buffers and submodules listed as
    torchcap.trace lists them, or as `listed` gives them)."""
    parameters, buffers, modules = listed or _trace._module_contents(model, record_stack_traces)
    return _trace._C.trace(model, parameters, buffers, (x,), {}, False, False, None, False, False,
                           record_stack_traces, _trace._INTERNAL_DIRS, modules)


def report(rows, times, excess, cpu_excess, nodes, reference):
    """One line per row, then the reference row's overhead over each other's."""
    per_node = [x / nodes * 1e6 for x in excess]
    cpu_per_node = [x / nodes * 1e6 for x in cpu_excess]
    for label, t, o, c in zip(rows, times, per_node, cpu_per_node):
        print(f"  {label + ':':<46} {t * 1e3:8.2f} ms  overhead {o:7.2f} us/node "
              f"(CPU {c:7.2f} us/node)")
    others = [i for i in range(len(rows)) if i != reference]
    ratios = ", ".join(f"{per_node[reference] / per_node[i]:.0f}x" for i in others)
    cpu_ratios = ", ".join(f"{cpu_per_node[reference] / cpu_per_node[i]:.0f}x" for i in others)
    print(f"  {rows[reference]} overhead / torchcap overhead, per row above: {ratios}; "
          f"CPU time: {cpu_ratios}")


def bench(name, model, x, runs, make_fx_runs, with_parts=False):
    model.eval()
    gm = torchcap.trace(model, (x,))
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    nodes = len(gm.graph.nodes)

    def eager():
        with torch.no_grad():
            return model(x)

    def run_make_fx():
        with torch.no_grad():
            return make_fx(model)(x)

    def make_fx_first_call():
        with torch.no_grad():
            traced = make_fx(model)(x)
            return traced, traced(x)

    def first_call():
        with torch.no_grad():
            traced = torchcap.trace(model, (x,))
            return traced, traced(x)

    def traced_with_code():
        gm = torchcap.trace(model, (x,))
        gm.graph  # noqa: B018 -- the fx nodes
        gm.code  # noqa: B018 -- and the code, as make_fx's module has them
        return gm

    eager()  # warm up kernels and allocator
    run_make_fx()
    gc.collect()
    gc.freeze()
    print(f"{name}: {nodes} nodes ({ops} operators)")

    # The whole trip: what a user waits for before the traced module has
    # computed something (the program runs twice, traced and called: two
    # eager runs are subtracted), or shown its graph and code.
    trip = [("torchcap.trace + first call", first_call, 2),
            ("torchcap.trace + .graph + .code", traced_with_code, 1)]
    eager_time, times, excess, cpu_excess = paired(
        eager, [fn for _, fn, _ in trip], runs, [k for _, _, k in trip])
    _, mfx_time, mfx_excess, mfx_cpu_excess = paired(eager, [make_fx_first_call], make_fx_runs, [2])
    print(f"  eager {eager_time * 1e3:.2f} ms; the whole trip, one thread:")
    report([label for label, _, _ in trip] + ["make_fx + first call"], times + mfx_time,
           excess + mfx_excess, cpu_excess + mfx_cpu_excess, nodes, reference=2)

    # The trace alone: the torch.fx module returned, its graph and code not made.
    rows = [("torchcap trace, C++ graph", lambda: cpp_graph(model, x, True)),
            ("torchcap trace, C++ graph, no stack traces", lambda: cpp_graph(model, x, False)),
            ("torchcap.trace -> torch.fx.GraphModule", lambda: torchcap.trace(model, (x,)))]
    _, times, excess, cpu_excess = paired(eager, [fn for _, fn in rows], runs)
    parts_line = parts(model, x) if with_parts else None
    _, mfx_time, mfx_excess, mfx_cpu_excess = paired(eager, [run_make_fx], make_fx_runs)
    print("  the trace alone:")
    report([label for label, _ in rows] + ["make_fx (real mode)"], times + mfx_time,
           excess + mfx_excess, cpu_excess + mfx_cpu_excess, nodes, reference=3)
    if parts_line:
        print(parts_line)


def fixed_cost(model, x, runs=31):
    """What a trace costs whatever the program does: _C.trace of x.relu()
    alone, right after a collection (as bench() times every run) and in a
    warm loop; with the module's parameters and buffers given to it (none is
    used); and x.relu() itself right after a collection."""
    parameters, buffers, modules = _trace._module_contents(model, True)

    def relu(t):
        return t.relu()

    def trivial(params, bufs):
        return _trace._C.trace(relu, params, bufs, (x,), {}, False, False, None, False, False,
                               True, _trace._INTERNAL_DIRS, [])

    rows = [("trace of x.relu(), cold", lambda: trivial([], [])),
            ("the same given the model's parameters and buffers",
             lambda: trivial(parameters, buffers)),
            ("x.relu() itself, cold", lambda: x.relu())]
    times = [statistics.median(timed(fn)[0] for _ in range(runs)) for _, fn in rows]
    start = time.perf_counter()
    for _ in range(runs * 10):
        trivial([], [])
    warm = (time.perf_counter() - start) / (runs * 10)
    print("  fixed cost of a trace: " + ", ".join(
        f"{label} {t * 1e3:.3f} ms" for (label, _), t in zip(rows, times)) +
          f"; trace of x.relu() in a warm loop {warm * 1e3:.3f} ms")


def parts(model, x, runs=31):
    """torchcap.trace's parts over eager, timed inside a copy of its steps
    run as the bench runs torchcap.trace (right after a trace and a
    collection): listing the module's parameters, buffers and submodules,
    the C++ trace given that listing (less the eager time of the same
    round), and the torch.fx module made around its graph. Medians; the
    docs/benchmarks.md table of where ResNet-18's overhead goes starts from these.
    Timed before make_fx runs on the model: after them, the same parts
    took up to 40% longer (make_fx leaves the process's memory otherwise
    laid out)."""
    model.eval()

    def eager():
        with torch.no_grad():
            return model(x)

    def steps(times):
        start = time.perf_counter()
        contents = _trace._module_contents(model, True)
        listed = time.perf_counter()
        with _trace._cyclic_gc_paused():
            graph = cpp_graph(model, x, True, contents)
            traced = time.perf_counter()
            gm = _trace._to_fx(graph, {})
            done = time.perf_counter()
        times.append((listed - start, traced - listed, done - traced))
        return gm

    listing, trace, fx = [], [], []
    for _ in range(runs):
        eager_time = timed(eager)[0]
        times = []
        steps([])
        gc.collect()
        steps(times)
        gc.collect()
        (a, b, c), = times
        listing.append(a)
        trace.append(b - eager_time)
        fx.append(c)
    return ("  parts of torchcap.trace over eager: listing the module "
            f"{statistics.median(listing) * 1e3:.3f} ms, the C++ trace "
            f"{statistics.median(trace) * 1e3:.3f} ms, the torch.fx module "
            f"{statistics.median(fx) * 1e3:.3f} ms")


def main():
    mlp = nn.Sequential(*[m for _ in range(200) for m in (nn.Linear(64, 64), nn.ReLU())])
    bench("MLP 200 x (Linear 64 + ReLU), batch 1", mlp, torch.randn(1, 64), runs=21,
          make_fx_runs=5)
    resnet, x = torchvision.models.resnet18(), torch.randn(1, 3, 32, 32)
    bench("ResNet-18, 1x3x32x32", resnet, x, runs=31, make_fx_runs=5, with_parts=True)
    fixed_cost(resnet, x)


if __name__ == "__main__":
    main()
