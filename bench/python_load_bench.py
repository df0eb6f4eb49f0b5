"""What the load-time checks cost in Python (docs/FORMAT.md, "Shapes").

torchcap.load reads a file with the C++ loader when torchcap._C is there,
whose shape check runs each operator on meta tensors; in a Python process
some of those meta kernels are torch's Python functions. The reader without
the compiled part (torchcap._load.load_in_python) makes the same check in
Python. For torchvision models traced and saved, each loader's time with the
check and without it (check_shapes=False), side by side in one run, and what
the check costs per node. Times are medians of 7 loads after one, CPU time
of this process, one thread, checksums off (they read every byte of the
weights, which has nothing to do with the check).

    PYTHONPATH=build/python /usr/bin/python3 bench/python_load_bench.py
"""

import os
import statistics
import tempfile
import time

import torch
import torchvision

import torchcap
from torchcap._load import load_in_python

torch.manual_seed(0)
torch.set_num_threads(1)

MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(), (1, 3, 224, 224)),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(), (1, 3, 224, 224)),
    "vit_b_16 (4 layers)": (lambda: torchvision.models.VisionTransformer(
        image_size=64, patch_size=16, num_layers=4, num_heads=4, hidden_dim=128, mlp_dim=256),
        (1, 3, 64, 64)),
}


def cpu_ms(fn, runs=7):
    fn()
    times = []
    for _ in range(runs):
        start = time.process_time()
        fn()
        times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def main():
    loaders = (("torchcap.load", torchcap.load), ("load_in_python", load_in_python))
    print(f"{'model':<22}{'nodes':>7}{'loader':>17}{'checked ms':>12}{'unchecked ms':>14}"
          f"{'check us/node':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (make, shape) in MODELS.items():
            model = make().eval()
            with torch.no_grad():
                gm = torchcap.trace(model, (torch.randn(shape),))
            path = os.path.join(tmp, "model.tcg")
            torchcap.save(gm, path)
            nodes = len(torchcap.load(path).graph.nodes)
            for label, load in loaders:
                checked = cpu_ms(lambda: load(path, verify_checksums=False))
                unchecked = cpu_ms(lambda: load(path, verify_checksums=False, check_shapes=False))
                print(f"{name:<22}{nodes:>7}{label:>17}{checked:>12.2f}{unchecked:>14.2f}"
                      f"{(checked - unchecked) * 1000 / nodes:>15.1f}")


if __name__ == "__main__":
    main()
