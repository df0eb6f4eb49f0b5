"""Writes scripted torchvision models with small inputs for the meta-mode
tests (tests/meta_trace_test.cpp): the graph a meta-mode trace records must be
the one a real trace records.

    python3 make_meta_fixtures.py OUT_DIR

For each model NAME: NAME.pt (torch.jit.script, eval, random weights) and
NAME.shape, the input shape as "1x3x64x64".
"""

import pathlib
import sys

import torch
import torchvision


def models():
    return {
        "resnet18": (lambda: torchvision.models.resnet18(), (1, 3, 64, 64)),
        "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(), (1, 3, 64, 64)),
        "vit": (lambda: torchvision.models.VisionTransformer(
            image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
            mlp_dim=64), (1, 3, 32, 32)),
        "swin_t": (lambda: torchvision.models.swin_t(), (1, 3, 64, 64)),
    }


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, (build, shape) in models().items():
        torch.manual_seed(0)
        torch.jit.script(build().eval()).save(str(out / f"{name}.pt"))
        (out / f"{name}.shape").write_text("x".join(str(d) for d in shape))


if __name__ == "__main__":
    main()
