"""Binding weights to a loaded module's attributes by name (torchcap.load's
`weights`), with the rules of the C++ GraphModule::bind_weights."""

from typing import Any, Mapping, Optional, Sequence

import torch

from torchcap._errors import WeightError
from torchcap._runtime import _dense, _describe


def _in_recorded_layout(w: torch.Tensor, recorded: torch.Tensor) -> torch.Tensor:
    """`w`, copied into `recorded`'s strides when they differ where it matters
    (as load_state_dict copies into a parameter); the graph then sees the
    layout it was traced with."""
    if all(s <= 1 or a == b for s, a, b in zip(w.shape, w.stride(), recorded.stride())):
        return w
    if not _dense(recorded):
        return w
    with torch.no_grad():
        out = torch.empty_strided(recorded.shape, recorded.stride(), dtype=w.dtype,
                                  device=w.device)
        out.copy_(w)
    return out


def _bind(attributes: Sequence[tuple[str, str, Optional[torch.Tensor]]],
          weights: Mapping[str, Any],
          strict: bool) -> list[tuple[str, str, Optional[torch.Tensor]]]:
    """(name, kind, tensor) of each attribute with `weights` bound, by name.

    The rules of the C++ GraphModule::bind_weights: every weightless (meta)
    attribute needs a weight; a stored one keeps its tensor unless `weights`
    names it; attributes that share a tensor take the weight of the first of
    their names that `weights` has; each weight must hold values, be dense
    and have its attribute's dtype and shape. Raises WeightError listing
    every problem.
    """
    if not hasattr(weights, "items"):
        raise WeightError(f"weights must be a dict of tensors by name (a state dict), not a "
                          f"{type(weights).__name__}")
    # id(tensor) -> attribute indices; an undefined attribute stands alone
    groups: dict[Any, list[int]] = {}
    for i, (_, _, tensor) in enumerate(attributes):
        groups.setdefault(id(tensor) if tensor is not None else ("none", i), []).append(i)
    missing, problems, bound = [], [], {}  # missing weights are listed first
    for members in groups.values():
        name0, kind, current = attributes[members[0]]
        given = next(((attributes[i][0], weights[attributes[i][0]]) for i in members
                      if attributes[i][0] in weights), None)
        if given is None:
            if current is not None and current.is_meta:
                missing.append(f"missing: {kind} '{name0}' ({_describe(current)})")
            continue
        name, w = given
        where = f"weight '{name}' ({kind}): "
        if current is None:
            problems.append(where + "the module's attribute is undefined (None), so it takes "
                                    "no tensor")
        elif not isinstance(w, torch.Tensor):
            problems.append(where + f"expected {_describe(current)}, got a "
                                    f"{type(w).__name__}")
        elif w.is_meta:
            problems.append(where + "the tensor is on the meta device: it has no values to bind")
        elif w.layout != torch.strided:
            # The graph's operators, and the copy into the recorded layout,
            # take dense tensors only.
            layout = str(w.layout).replace("torch.", "").lstrip("_")
            problems.append(where + f"expected a dense tensor {_describe(current)}, got a "
                                    f"{layout} tensor; pass the dense one (to_dense())")
        elif w.dtype != current.dtype or w.shape != current.shape:
            problems.append(where + f"expected {_describe(current)}, got {_describe(w)}")
        else:
            w = _in_recorded_layout(w.detach(), current)
            for i in members:
                bound[i] = w
    problems = missing + problems
    if strict:
        names = {a[0] for a in attributes}
        for name in sorted(weights):
            if name not in names:
                problems.append(f"extra: weight '{name}' is not an attribute of the module "
                                f"(strict=False ignores such weights)")
    if problems:
        shown = problems[:20]
        more = [f"... and {len(problems) - 20} more"] if len(problems) > 20 else []
        raise WeightError("the weights do not fit the module's attributes:\n  "
                          + "\n  ".join(shown + more))
    return [(name, kind, bound.get(i, tensor)) for i, (name, kind, tensor) in
            enumerate(attributes)]
