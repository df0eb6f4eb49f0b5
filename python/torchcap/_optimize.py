"""torchcap.optimize_for_inference: the C++ optimize_for_inference on a
module torchcap made (docs/optimize.md)."""

from torch.fx.graph_module import GraphModule  # as in _trace.py

from torchcap._bridge import _as_traced, _reduce_traced
from torchcap._trace import _require_C


def optimize_for_inference(gm: GraphModule) -> GraphModule:
    """A copy of `gm` made faster to run for inference, as TorchScript's
    freeze + optimize_for_inference do for scripted modules: batch norms
    folded into convolutions, what is computed from weights alone computed
    once, no-op calls removed, convolutions run by oneDNN or XNNPACK with
    packed weights and a fused relu or clamp on channels-last activations.

    gm: a module made by torchcap.trace, torchcap.export or torchcap.load of
    a model in eval mode, with its current weights (they are read now).
    Returns a module called as `gm` is, whose outputs equal gm's to float
    rounding (docs/optimize.md gives the tolerance); its calls run the C++
    interpreter, which packs the weights once, so weights changed after the
    first call are not seen by it. torchcap.save writes it as any graph
    (weights unpacked). Raises torchcap.Error for a graph that updates
    buffers or inputs (a batch norm in training mode, a training step), and
    TypeError for a module torchcap did not make, or one whose graph was
    edited in Python.
    """
    _require_C()
    if getattr(gm, "_torchcap_graph", None) is None or not _as_traced(gm):
        raise TypeError("optimize_for_inference takes a module made by torchcap.trace, torchcap.export "
                        f"or torchcap.load (with its graph as made), not {type(gm).__name__}")
    make, (graph, tensors, checked, kept) = _reduce_traced(gm)
    optimized = graph.with_attributes(tensors).optimized_for_inference()
    tensors = [(name, t) for name, _, t in optimized.attributes()]
    return make(optimized, tensors, checked, kept)
