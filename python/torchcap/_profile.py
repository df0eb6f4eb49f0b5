"""torchcap.profile: where the time of a module's runs goes, per node, from
the C++ interpreter (Interpreter::profile; docs/cli.md, `run --profile`)."""

import torch.utils._pytree as pytree

from torchcap._bridge import _as_traced, _current_tensors
from torchcap._trace import _require_C


class Profile:
    """The runs of a graph, timed per node. `nodes` lists (node, target,
    source line, ms per run) in the order they ran; table() gives the
    per-operator totals and the slowest nodes, chrome_trace() the last run
    as a Chrome trace (JSON for chrome://tracing or Perfetto)."""

    def __init__(self, runs, table, trace, nodes):
        self.runs = runs
        self._table = table
        self._trace = trace
        self.nodes = [(name, target, source, seconds * 1e3 / runs) for name, target, source, seconds in nodes]

    def table(self):
        return self._table

    def chrome_trace(self):
        return self._trace

    def __str__(self):
        return self._table


def profile(gm, *args, runs=10, **kwargs):
    """Runs `gm` (a module torchcap made) on the arguments `runs` times after
    one run not counted, in the C++ interpreter, timing each node; returns a
    Profile. The arguments are those gm takes; they must be tensors."""
    _require_C()
    graph = getattr(gm, "_torchcap_graph", None)
    if graph is None or not _as_traced(gm):
        raise TypeError("profile takes a module made by torchcap.trace, torchcap.export or torchcap.load "
                        f"(with its graph as made), not {type(gm).__name__}")
    if runs < 1:
        raise ValueError(f"profile: runs must be at least 1, got {runs}")
    leaves = pytree.tree_flatten((args, kwargs))[0]
    runner = graph.with_attributes(_current_tensors(gm)).runner()
    table, trace, nodes = runner.profile(leaves, runs)
    return Profile(runs, table, trace, nodes)
