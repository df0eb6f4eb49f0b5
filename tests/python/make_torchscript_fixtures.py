"""Writes small scripted models for the C++ TorchScript tests: their Python
source is in a file (TorchScript records it), so the tests can check the
source lines and module paths a trace records.

    python3 make_torchscript_fixtures.py OUT_DIR [OPS_LIBRARY]

With OPS_LIBRARY (tests/tools/custom_ops.cpp built), also a model calling its
torchcap_test::scale_add.
"""

import pathlib
import sys

MODELS = '''
from typing import Optional

import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))  # the block's activation


class Located(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 1)
        self.features = torch.nn.Sequential(Block(), Block())

    def forward(self, x):
        return self.features(self.stem(x)).sum(dim=1)


class Defaults(torch.nn.Module):
    def forward(self, x, mask: Optional[torch.Tensor] = None, scale: float = 2.0,
                steps: int = 3):
        for _ in range(steps):
            x = x * scale
        if mask is not None:
            x = x + mask
        return x


class CustomOp(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.torchcap_test.scale_add(x.relu(), y, 0.5)


class TensorLiteral(torch.nn.Module):
    def forward(self, x):
        offsets = torch.tensor([1.0, 2.0, 3.0])
        scale = torch.as_tensor([[0.5], [2.0]])
        return x * scale + offsets
'''


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    source = out / "fixture_models.py"
    source.write_text(MODELS)
    sys.path.insert(0, str(out))
    import fixture_models  # noqa: E402  (written just above)
    import torch

    torch.manual_seed(0)
    for name, cls in [("located", fixture_models.Located), ("defaults", fixture_models.Defaults),
                      ("tensor_literal", fixture_models.TensorLiteral)]:
        torch.jit.script(cls().eval()).save(str(out / f"{name}.pt"))
    if len(sys.argv) > 2:
        torch.ops.load_library(sys.argv[2])
        torch.jit.script(fixture_models.CustomOp()).save(str(out / "custom_op.pt"))


if __name__ == "__main__":
    main()
