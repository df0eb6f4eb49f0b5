"""Writes scripted torchvision models, inputs and eager outputs for the CLI
tests: TorchScript files no one here wrote, generated at test time (the
repository carries no binary models).

    python3 make_torchvision_models.py OUT_DIR [NAME ...]
"""

import pathlib
import sys

import torch
import torchvision


def make(name, out_dir):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    scripted = torch.jit.script(model)
    scripted.save(str(out_dir / f"{name}.pt"))
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    torch.save(x, out_dir / f"{name}_input.pt")
    with torch.no_grad():
        torch.save(model(x), out_dir / f"{name}_expected.pt")


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:] or ["resnet18", "mobilenet_v2"]:
        make(name, out_dir)


if __name__ == "__main__":
    main()
