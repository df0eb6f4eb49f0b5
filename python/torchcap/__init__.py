"""torchcap's Python side: trace Python programs with the C++ tracer, and open
graphs captured and saved in C++.

    import torchcap
    gm = torchcap.trace(model, (x,))   # a torch.fx.GraphModule of aten ops
    ep = torchcap.export(model, (x,))  # functional; buffer writes kept
    torchcap.save(ep, "model.tcg")     # torchcap::load + Interpreter run it in C++
    gm = torchcap.load("model.tcg")    # a torch.fx.GraphModule
    fast = torchcap.optimize_for_inference(gm)  # packed weights, folded batch norms
    out = gm(x)
    print(torchcap.signature(gm))      # inputs, parameters, buffers, outputs
    step = torchcap.export_training(model, loss_fn, (x,), (y,), optimizer=opt)
    loss = step(x, y)["loss"]          # one training step, parameters updated

Tracing needs the compiled part, torchcap._C. The loader is pure Python; it
needs only torch (1.13) and reads the `.tcg` format described in
docs/FORMAT.md.
"""

from torchcap._errors import (Error, FormatError, InputError, LintError, PassError, TraceError,
                              WeightError)
from torchcap._load import load
from torchcap._onnx import to_onnx
from torchcap._optimize import optimize_for_inference
from torchcap._profile import Profile, profile
from torchcap._signature import GraphSignature, InputSpec, OutputSpec, signature
from torchcap._tcg_file import FORMAT_MAJOR_VERSION, FORMAT_MINOR_VERSION
from torchcap._trace import Dim, dispatch_trace, export, save, trace
from torchcap._training import export_training
from torchcap._version import __version__ as __version__

__all__ = ["trace", "export", "dispatch_trace", "export_training", "save", "load",
           "optimize_for_inference", "profile", "Profile", "to_onnx",
           "signature", "GraphSignature", "InputSpec", "OutputSpec", "Dim", "Error",
           "TraceError", "InputError", "WeightError", "FormatError", "LintError", "PassError",
           "FORMAT_MAJOR_VERSION", "FORMAT_MINOR_VERSION"]
