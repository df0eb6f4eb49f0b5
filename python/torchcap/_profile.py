"""torchcap.profile: where the time of a module's runs goes, per node, from
the C++ interpreter (Interpreter::profile; docs/cli.md, `run --profile`)."""

from typing import Any, Iterable

import torch.utils._pytree as pytree
from torch.fx.graph_module import GraphModule  # as in _trace.py

from torchcap._bridge import _as_traced, _current_tensors
from torchcap._trace import _require_C


class Profile:
    """The runs of a graph, timed per node. `nodes` lists (node, target,
    source line, ms per run) in the order they ran; table() gives the
    per-operator totals and the slowest nodes, chrome_trace() the last run
    as a Chrome trace (JSON for chrome://tracing or Perfetto).

    Made by torchcap.profile, from the C++ interpreter's profile: runs, the
    number of runs timed; table, trace: the table and the Chrome trace as
    text; nodes: (node, target, source line, seconds over all runs) of each
    node."""

    runs: int
    nodes: list[tuple[str, str, str, float]]

    def __init__(self, runs: int, table: str, trace: str,
                 nodes: Iterable[tuple[str, str, str, float]]) -> None:
        self.runs = runs
        self._table = table
        self._trace = trace
        self.nodes = [(name, target, source, seconds * 1e3 / runs) for name, target, source, seconds in nodes]

    def table(self) -> str:
        """The per-operator totals (calls, ms a run, mean us a call, share
        of the time), then the slowest nodes with their source lines, as
        `torchcap run --profile` prints them."""
        return self._table

    def chrome_trace(self) -> str:
        """The last run as a Chrome trace: JSON for chrome://tracing or
        Perfetto, one event per node."""
        return self._trace

    def __str__(self) -> str:
        return self._table


def profile(gm: GraphModule, *args: Any, runs: int = 10, **kwargs: Any) -> Profile:
    """Runs `gm` (a module torchcap made) on the arguments `runs` times after
    one run not counted, in the C++ interpreter, timing each node; returns a
    Profile.

    gm: a module made by torchcap.trace, torchcap.export or torchcap.load
    (with its graph as made; TypeError otherwise).
    args, kwargs: the arguments gm takes, as for a call gm(*args, **kwargs);
    their leaves must be tensors.
    runs: how many runs are timed, at least 1 (ValueError otherwise).
    """
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
