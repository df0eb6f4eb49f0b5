"""Running captured graphs for inference: eager PyTorch, TorchScript's
`freeze` + `optimize_for_inference`, torchcap's interpreter on the traced
graph, and on the graph after the `optimize` passes
(torchcap.optimize_for_inference), side by side in one run.

Each model is traced in eval mode under no_grad with random weights; every
variant is called from Python with the same input, on one thread, and the
four are timed in turn, round after round, so that drifts in the machine's
load hit them alike: the figure is each one's best median over the rounds.
Ratios are to TorchScript-optimized and to eager. The optimized graph's
outputs are checked against eager first (docs/optimize.md: tolerance).
Last, what each pass buys on ResNet-18 at batch 1: the graph traced with
the passes of the `optimize` pipeline added one at a time.

    PYTHONPATH=build/python /usr/bin/python3 bench/optimize_bench.py [model ... | passes]
"""

import statistics
import sys
import time

import torch
import torch.nn as nn
import torchvision

import torchcap

torch.set_num_threads(1)
# Random weights make some models' activations denormal, which some kernels
# (eager MobileNetV2's) run many times slower: flushed to zero for all four.
torch.set_flush_denormal(True)


def mlp200():
    layers = []
    for _ in range(200):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(1, 64)


MODELS = {
    "resnet18_b1": lambda: (torchvision.models.resnet18(), torch.randn(1, 3, 224, 224)),
    "resnet18_b8": lambda: (torchvision.models.resnet18(), torch.randn(8, 3, 224, 224)),
    "mobilenet_v2": lambda: (torchvision.models.mobilenet_v2(), torch.randn(1, 3, 224, 224)),
    "transformer_encoder": lambda: (nn.TransformerEncoderLayer(32, 4, 64), torch.randn(5, 2, 32)),
    "mlp200": mlp200,
}


def median_ms(fn, iterations, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        times.append((time.perf_counter() - start) / iterations)
    return statistics.median(times) * 1e3


def bench(name):
    torch.manual_seed(0)
    model, x = MODELS[name]()
    model.eval()
    with torch.no_grad():
        want = model(x)
        scripted = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(model)))
        plain = torchcap.trace(model, (x,))
        optimized = torchcap.trace(model, (x,), passes="optimize")
        error = (optimized(x) - want).abs().max().item()
        scale = want.abs().max().item()
        variants = {"eager": lambda: model(x), "torchscript_optimized": lambda: scripted(x),
                    "torchcap": lambda: plain(x), "torchcap_optimized": lambda: optimized(x)}
        for fn in variants.values():  # warm: first calls pack weights, plan memory
            fn()
            fn()
        start = time.perf_counter()
        model(x)
        iterations = max(3, int(0.05 / (time.perf_counter() - start)))
        best = {k: float("inf") for k in variants}
        for _ in range(3):
            for k, fn in variants.items():
                best[k] = min(best[k], median_ms(fn, iterations))
    p = f"optimize/{name}/"
    for k, v in best.items():
        print(f"{p}{k}: {v:.3f} ms")
    print(f"{p}torchcap_optimized_vs_torchscript_optimized: "
          f"{best['torchcap_optimized'] / best['torchscript_optimized']:.3f} x")
    print(f"{p}torchcap_optimized_vs_eager: {best['torchcap_optimized'] / best['eager']:.3f} x")
    print(f"{p}torchscript_optimized_vs_eager: {best['torchscript_optimized'] / best['eager']:.3f} x")
    print(f"{p}max_abs_error_over_max_abs_output: {error / scale:.2e}")
    sys.stdout.flush()


# The optimize pipeline's passes, added one at a time (docs/optimize.md).
PASS_STEPS = [["dce"], ["fold_bn", "dce"], ["fold_bn", "fold_constants", "no_ops", "cleanup"],
              ["fold_bn", "fold_constants", "no_ops", "cleanup", "prepack"]]


def passes_table():
    torch.manual_seed(0)
    model, x = MODELS["resnet18_b1"]()
    model.eval()
    with torch.no_grad():
        graphs = [torchcap.trace(model, (x,), passes=p) for p in PASS_STEPS]
        for g in graphs:
            g(x)
            g(x)
        best = [float("inf")] * len(graphs)
        for _ in range(3):
            for i, g in enumerate(graphs):
                best[i] = min(best[i], median_ms(lambda: g(x), 10))
    for p, ms in zip(PASS_STEPS, best):
        print(f"optimize/resnet18_b1/passes/{'+'.join(p)}: {ms:.3f} ms ({ms / best[0]:.3f} x)")


if __name__ == "__main__":
    for name in sys.argv[1:] or [*MODELS, "passes"]:
        if name == "passes":
            passes_table()
        else:
            bench(name)
