"""Capturing a training step of a Python nn.Module with the C++ tracer.

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = torchcap.export_training(model, F.cross_entropy, (x,), (y,), optimizer=opt)
    for x, y in batches:
        loss = step(x, y)["loss"]       # forward, backward and the optimizer's update
    torchcap.save(step, "step.tcg")     # trains on in C++ (Interpreter) or Python

The step is one functional graph of aten operators: the forward, the
backward autograd ran, and the optimizer's update written with the same
operators as torch.optim's. The parameters, the optimizer's state (buffers
named optimizer.<state>.<parameter>, and optimizer.step) and the model's
buffers are the returned module's own tensors, updated by each call.
"""

from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch.fx.graph_module import GraphModule  # as in _trace.py

from torchcap._errors import Error, TraceError
from torchcap._bridge import _to_fx
from torchcap._runtime import _InputMeta, _file_input_meta
from torchcap._trace import (_INTERNAL_DIRS, _as_trace_error, _check_args, _dynamic_dims,
                             _module_contents, _require_C)

try:
    from torchcap import _C
except ImportError:
    _C = None

# torch.optim's hyperparameters each supported optimizer keeps in its group,
# and the values the captured update implements for the rest.
_SUPPORTED = {
    torch.optim.SGD: ("sgd", ("lr", "momentum", "dampening", "weight_decay", "nesterov")),
    torch.optim.Adam: ("adam", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    torch.optim.AdamW: ("adamw", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
}
_MUST_BE_OFF = ("maximize", "differentiable", "capturable")


def _optimizer_spec(optimizer, module):
    """("none" | "sgd" | "adam" | "adamw", {hyperparameter: value})."""
    if optimizer is None:
        return "none", {}
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"torchcap.export_training: optimizer must be a torch.optim.SGD, Adam or "
                        f"AdamW (or None for gradients), not a {type(optimizer).__name__}")
    kind = _SUPPORTED.get(type(optimizer))
    if kind is None:
        raise Error(f"torchcap.export_training: {type(optimizer).__name__} is not supported; a "
                    f"captured step implements SGD, Adam and AdamW")
    if len(optimizer.param_groups) != 1:
        raise Error(f"torchcap.export_training: the optimizer has {len(optimizer.param_groups)} "
                    f"parameter groups; a captured step takes one")
    group = optimizer.param_groups[0]
    for option in _MUST_BE_OFF:
        if group.get(option):
            raise Error(f"torchcap.export_training: the optimizer's {option}=True is not supported")
    if optimizer.state:
        raise Error("torchcap.export_training: the optimizer has already taken steps; the "
                    "captured step starts from a fresh optimizer's state")
    names = {id(p): name for name, p in module.named_parameters()}
    held = {id(p) for p in group["params"]}
    trained = [name for name, p in module.named_parameters() if p.requires_grad]
    missing = [name for name, p in module.named_parameters() if p.requires_grad and id(p) not in held]
    foreign = [p for p in group["params"] if id(p) not in names]
    if missing or foreign:
        what = (f"misses {', '.join(missing)}" if missing else
                f"holds {len(foreign)} tensor(s) that are not the module's parameters")
        raise Error(f"torchcap.export_training: the optimizer must hold exactly the module's "
                    f"trainable parameters ({len(trained)}); it {what}")
    name, keys = kind
    return name, {k: group[k] for k in keys}


def export_training(module: torch.nn.Module, loss_fn: Callable[..., torch.Tensor],
                    args: Union[tuple[Any, ...], list[Any]],
                    targets: Union[tuple[Any, ...], list[Any]], *,
                    optimizer: Optional[torch.optim.Optimizer] = None,
                    record_stack_traces: bool = True,
                    dynamic_shapes: Optional[Sequence[Sequence[Any]]] = None) -> GraphModule:
    """Captures one training step of `module` as a torch.fx.GraphModule.

    module: an nn.Module in training mode. loss_fn(outputs, *targets) returns
    the loss, a tensor with one element (torch.nn.functional.cross_entropy,
    an nn.MSELoss(), ...). args, targets: tuples of example inputs and
    targets; the step takes (*args, *targets).
    optimizer: a torch.optim.SGD, Adam or AdamW made on the module's
    trainable parameters (one parameter group, no steps taken yet), whose
    hyperparameters the step uses; or None, for a step that returns every
    parameter's gradient and updates nothing.

    Calling the result runs one step: it returns {"loss": loss} (and
    "gradients" without an optimizer) and updates its parameters, the
    optimizer's state and the model's buffers in place, as
    `optimizer.zero_grad(); loss_fn(module(*args), *targets).backward();
    optimizer.step()` does. Capturing leaves `module` as it was, and the
    step trains copies of its parameters and buffers (step.named_parameters(),
    step.named_buffers(); the optimizer's state is among the buffers). Its
    `training_signature` lists each output's role as (role, target,
    parameter, state): "loss", "gradient", "parameter update", "optimizer
    state", "buffer update".

    record_stack_traces: as for torchcap.trace: node.meta["stack_trace"]
    and node.meta["nn_module_stack"] from the module's Python frames.
    dynamic_shapes: as torchcap.trace's, one entry per element of args, then
    one per target: (({0: batch},), ({0: batch},)) for a dynamic batch.

    Raises TraceError when the module is in eval mode, the loss has more than
    one element, a parameter gets no gradient (named), or an operator has no
    derivative. A step called with inputs of other dtypes or shapes than
    those captured, or with something other than a tensor where it takes
    one, raises InputError naming them.
    """
    _require_C()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"torchcap.export_training: module must be an nn.Module, not a "
                        f"{type(module).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"torchcap.export_training: loss_fn must be callable, not a "
                        f"{type(loss_fn).__name__}")
    if not module.training:
        raise TraceError("torchcap.export_training: the module is in eval mode; call train() on "
                         "it first (dropout and BatchNorm behave differently in training)")
    args, _ = _check_args(args, None)
    targets, _ = _check_args(targets, None)
    kind, options = _optimizer_spec(optimizer, module)
    parameters, buffers, modules = _module_contents(module, record_stack_traces)
    dynamic = []
    if dynamic_shapes is not None:
        if not isinstance(dynamic_shapes, (tuple, list)) or len(dynamic_shapes) != 2:
            raise TypeError("torchcap.export_training: dynamic_shapes is (shapes of args, shapes "
                            "of targets)")
        dynamic = _dynamic_dims(tuple(dynamic_shapes[0]) + tuple(dynamic_shapes[1]),
                                (*args, *targets))
    try:
        graph = _C.export_training(module, loss_fn, parameters, buffers, args, targets, kind,
                                   options, record_stack_traces, _INTERNAL_DIRS, modules,
                                   dynamic=dynamic)
    except RuntimeError as e:
        error = _as_trace_error(e, training=True)
        if error is None:
            raise
        raise error.with_traceback(e.__traceback__) from None
    # The step computes its gradients itself: its parameters do not require
    # grad (autograd would record every call, and refuses some of the backward
    # operators' arguments), as in torchcap.load's modules. Parameters the
    # step updates are its own copies; without an optimizer they are the
    # module's (detached, same storage). Set in the C++ graph, whose tensors
    # the module's attributes are once attached (Note [Attributes attached on
    # first use] in _bridge.py).
    graph = graph.with_attributes([
        (name, torch.nn.Parameter(t.detach(), requires_grad=False))
        for name, kind, t in graph.attributes() if kind == "parameter"])
    step = _to_fx(graph, checked=True)
    # Note [Inputs of the traced shapes] in _runtime.py: each step's inputs are
    # checked (a plain attribute, as _capture sets it).
    if graph.is_dynamic():
        metas = iter(graph.placeholder_metas())
        step.__dict__["_torchcap_inputs"] = tuple(
            _file_input_meta(*next(metas), False, t.device) if isinstance(t, torch.Tensor) else None
            for t in (*args, *targets))
    else:
        step.__dict__["_torchcap_inputs"] = tuple(
            _InputMeta.of(t) if isinstance(t, torch.Tensor) else None for t in (*args, *targets))
    step.__dict__["training_signature"] = [tuple(entry) for entry in graph.training_signature()]
    return step
