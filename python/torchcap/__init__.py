"""torchcap's Python side: open graphs captured and saved in C++.

    import torchcap
    gm = torchcap.load("model.tcg")   # a torch.fx.GraphModule
    out = gm(x)

The package is pure Python; it needs only torch (1.13) and reads the `.tcg`
format described in docs/FORMAT.md.
"""

from torchcap._load import FORMAT_MAJOR_VERSION, FORMAT_MINOR_VERSION, load

__all__ = ["load", "FORMAT_MAJOR_VERSION", "FORMAT_MINOR_VERSION"]
