"""Tracing Python programs with torchcap's C++ tracer (torchcap._C).

    gm = torchcap.trace(model, (x,))          # a torch.fx.GraphModule of aten ops
    ep = torchcap.export(model, (x,))         # functional, with the program's writes
    torchcap.save(gm, "model.tcg")            # for torchcap::load + Interpreter in C++

The tracer runs the program once for real: the tensors it is given are
wrapped so that every aten operator they reach is recorded, in C++, at about
the cost of running the operator. The C++ graph then becomes a
torch.fx.GraphModule, with torchcap.load's code generator, whose attributes
are the module's own parameters and buffers.
"""

import inspect
import operator
import os
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch
import torch.nn
import torch.utils._pytree as pytree
# torch.fx.GraphModule where it is defined: torch.fx does not export the name
# to type checkers (mypy --strict finds no torch.fx.GraphModule).
from torch.fx.graph_module import GraphModule

from torchcap import _errors
from torchcap._errors import Error, TraceError
from torchcap._operators import operator_name
from torchcap._bridge import _as_traced, _attribute, _current_tensors, _to_fx
from torchcap._runtime import (_LEAF_SPEC, _TENSOR_ARGUMENT_SPECS, _InputMeta, _as_spec,
                               _call_structure, _cyclic_gc_paused, _file_input_meta,
                               _spec_holds_named_tuple, _spec_leaves, _tensors_only)

try:
    from torchcap import _C
except ImportError as e:  # the package works as a loader without its compiled part
    _C = None
    _C_IMPORT_ERROR = e

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TORCHCAP_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames in these files are the tracer's and torch's own: stack traces skip them.
_INTERNAL_DIRS = [_TORCH_DIR, _TORCHCAP_DIR]

# Where torch's autograd enters its engine: an error raised there while traced
# comes from a program that differentiates (the tracer runs it under no_grad).
_AUTOGRAD_FILE = os.path.abspath(torch.autograd.__file__)
_AUTOGRAD_ENTRIES = ("backward", "grad")
# The C++ option names in those messages, as the Python API spells them.
_OPTION_NAMES = {
    "TraceOptions::allow_data_dependent_values": "allow_data_dependent_values=True",
    "TraceOptions::allow_input_mutation": "allow_input_mutation=True",
    "TraceOptions::preserve": "preserve",
    "expected e.g. aten::linear": "expected e.g. 'aten::linear' or torch.ops.aten.linear",
    "torch::where": "torch.where",
    "torchcap::trace": "torchcap.trace",
    "torchcap::export": "torchcap.export",
    "Trace without meta mode": "Trace with meta=False",
    "trace without meta mode": "trace with meta=False",
}


def _require_C():
    if _C is None:
        raise ImportError("torchcap's compiled part (torchcap._C) is not available; tracing "
                          "needs it (torchcap.load does not): " + str(_C_IMPORT_ERROR))


# --- Module stacks -----------------------------------------------------------
# torchcap._C reads each node's module stack from the Python frames (Note
# [Module stacks from frames] in src/python/python_source.h): it is given the
# traced module's submodules and needs no hooks.

def _class_name(cls, names={}):  # noqa: B006 -- a cache, per class
    name = names.get(cls)
    if name is None:
        name = names[cls] = f"{cls.__module__}.{cls.__qualname__}"
    return name


_WALKED = (torch.nn.Module.named_modules, torch.nn.Module.named_parameters,
           torch.nn.Module.named_buffers, torch.nn.Module._named_members)


def _walks_as_module(cls, plain={torch.nn.Module: True}):  # noqa: B006 -- a cache, per class
    """Whether cls lists its modules, parameters and buffers as nn.Module does."""
    known = plain.get(cls)
    if known is None:
        known = plain[cls] = all(getattr(cls, f.__name__, None) is f for f in _WALKED)
    return known


def _module_contents(root, with_modules):
    """(named_parameters(), named_buffers(), and if with_modules the
    (module, qualified path, class) of root and its submodules) of root, in
    one walk over its modules.

    The root comes first, with the path "": every node's nn_module_stack starts
    with it, as torch.export records the root module ({"": ("", "pkg.Model"),
    "layer1": ("layer1", ...), ...}), whether f is the module or a bound method
    of it.

    The module tree is walked once, in C++ (Note [Walking a module in C++] in
    src/python/module.cpp), as named_modules() walks it (depth first, each
    module once), collecting each module's parameters and buffers as
    named_parameters() and named_buffers() do (each tensor once, under its
    first name, None skipped). A module whose class lists them its own way is
    asked through its methods.
    """
    _require_C()
    contents = _C.module_contents(root, with_modules, _walks_as_module, _class_name)
    if contents is not None:
        return contents
    return (list(root.named_parameters()), list(root.named_buffers()),
            [(m, name, _class_name(type(m))) for name, m in root.named_modules()]
            if with_modules else [])


# --- Errors --------------------------------------------------------------------

def _user_frame(tb):
    """(file, line, function, code) of the innermost frame of `tb` outside torch and torchcap."""
    import linecache
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not any(code.co_filename.startswith(d) for d in _INTERNAL_DIRS):
            found = (code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    if found is None:
        return None
    return found + (linecache.getline(found[0], found[1]).strip(),)


def _raised_by_autograd(tb):
    """Whether the innermost frame of `tb` is torch.autograd's backward or grad:
    the error is the engine's, which the program called (errors are told by
    where they come from, not by their text)."""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return os.path.abspath(code.co_filename) == _AUTOGRAD_FILE and code.co_name in _AUTOGRAD_ENTRIES


def _python_message(message):
    for cpp, py in _OPTION_NAMES.items():
        message = message.replace(cpp, py)
    return message


def _as_trace_error(e, training=False):
    """The torchcap error that a RuntimeError from torch's bindings was (Note
    [Errors raised inside operators] in src/trace/trace_state.h), with the
    program's line; a TraceError for a program that differentiates while
    traced (unless `training`: export_training's steps); or None."""
    if type(e) is not RuntimeError or _C is None:
        return None
    message = str(e)
    kind = _C.operator_error_kind(message)
    if kind:
        cls = getattr(_errors, kind)
    elif not training and _raised_by_autograd(e.__traceback__):
        cls = TraceError
        message = ("the program computes gradients (backward() or torch.autograd.grad) while "
                   "traced: torchcap.trace and export record the forward computation, under "
                   "no_grad, and capture no gradients. To capture a training step (forward, "
                   "backward and the optimizer's update) use torchcap.export_training. "
                   f"(LibTorch: {message.splitlines()[0]})")
    else:
        return None
    message = _python_message(message)
    where = None if '\n  File "' in message else _user_frame(e.__traceback__)
    if where is not None:
        file, line, function, code = where
        message += f'\n  File "{file}", line {line}, in {function}'
        if code:
            message += f"\n    {code}"
    return cls(message)


# --- Tracing ---------------------------------------------------------------------

def _module_of(f):
    if isinstance(f, torch.nn.Module):
        return f
    owner = getattr(f, "__self__", None)  # a bound method of a module
    return owner if isinstance(owner, torch.nn.Module) else None


def _argument_names(f, count):
    """The names of f's first `count` positional parameters, which name the
    graph's placeholders and its forward's parameters (Note [Calling
    convention] in src/graph/call_convention.cpp): those of a module's
    forward, `*inputs` as inputs_0, inputs_1, ...; [] when f's signature
    cannot be read or does not take `count` arguments by position."""
    target = f.forward if isinstance(f, torch.nn.Module) else f
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # builtins, some C extensions
        return []
    names = []
    for p in parameters:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            names += [f"{p.name}_{i}" for i in range(max(count - len(names), 0))]
            break
    names = names[:count]
    if len(names) != count or len(set(names)) != count:
        return []
    return names


def _check_args(args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(args, list):
        args = tuple(args)
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple of the program's positional arguments, not a "
                        f"{type(args).__name__}; for one tensor write (x,)")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, not a {type(kwargs).__name__}")
    for k in kwargs:
        if not isinstance(k, str) or not k.isidentifier() or k == "self":
            raise TypeError(f"kwargs: {k!r} is not a keyword argument name")
    return args, kwargs


def _capture(f, args, kwargs, export, inference, preserve, allow_input_mutation,
             allow_data_dependent_values, record_stack_traces, meta=False,
             refuse_out_into_inputs=False, passes=None, dynamic_shapes=None):
    _require_C()
    if isinstance(passes, str):
        passes = [passes]
    if not callable(f):
        raise TypeError(f"torchcap: f must be an nn.Module or a callable, not a "
                        f"{type(f).__name__}")
    args, kwargs = _check_args(args, kwargs)
    module = _module_of(f)
    parameters, buffers, modules = (_module_contents(module, record_stack_traces)
                                    if module is not None else ([], [], []))
    if preserve is not None:
        # One name or operator where a list belongs: iterating a name would
        # name its letters ("'aten::a' is not a registered operator").
        if isinstance(preserve, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise TypeError(f"preserve must be a list of operators (for example "
                            f"['aten::linear'] or [torch.ops.aten.linear]), not one "
                            f"{type(preserve).__name__}: {preserve!r}")
        preserve = [operator_name(op) for op in preserve]
    dynamic = _dynamic_dims(dynamic_shapes, args) if dynamic_shapes is not None else []
    out_spec = []
    in_spec, structure = _argument_specs(args, kwargs)
    named = _spec_holds_named_tuple(in_spec)

    def call(*a, **k):
        if named:  # Note [Named tuples]
            a, k = _as_spec((a, k), in_spec)
        out = f(*a, **k)
        out_spec.append(_LEAF_SPEC if isinstance(out, torch.Tensor) else pytree.tree_flatten(out)[1])
        return out

    with _cyclic_gc_paused():  # Note [No collections] in _runtime.py
        try:
            graph = _C.trace(call, parameters, buffers, args, kwargs, export, inference, preserve,
                             allow_input_mutation, allow_data_dependent_values,
                             record_stack_traces, _INTERNAL_DIRS, modules, meta=meta,
                             refuse_out_into_inputs=refuse_out_into_inputs, dynamic=dynamic,
                             argument_names=_argument_names(f, len(args)))
        except Error as e:  # from torchcap._C: the C++ option names, as Python spells them
            message = _python_message(str(e))
            if message == str(e):
                raise
            raise type(e)(message).with_traceback(e.__traceback__) from None
        except RuntimeError as e:
            error = _as_trace_error(e)
            if error is None:
                raise
            raise error.with_traceback(e.__traceback__) from None
        if passes:
            graph = graph.with_passes(list(passes))
        gm = _to_fx(graph)
    # Plain attributes, set in the instance's __dict__ as nn.Module would set
    # them; its __setattr__ would attach the attributes first (Note
    # [Attributes attached on first use]).
    gm.__dict__.update(in_spec=in_spec, out_spec=out_spec[0] if out_spec else None,
                       _torchcap_call_structure=structure)
    if out_spec and _spec_holds_named_tuple(out_spec[0]):
        gm.__dict__["_torchcap_named_result"] = True
    # Note [Inputs of the traced shapes] in _runtime.py: checked on each call.
    leaves = args if _tensors_only(args, kwargs) else _spec_leaves(in_spec, (args, kwargs), [])
    written = iter(graph.written_inputs())
    if graph.is_dynamic():
        metas = iter(graph.placeholder_metas())
        gm.__dict__["_torchcap_inputs"] = tuple(
            _file_input_meta(*next(metas), next(written, False), t.device)
            if isinstance(t, torch.Tensor) else None for t in leaves)
        return gm
    gm.__dict__["_torchcap_inputs"] = tuple(
        _InputMeta.of(t, next(written, False)) if isinstance(t, torch.Tensor) else None
        for t in leaves)
    return gm


def _argument_specs(args, kwargs):
    """(pytree spec of (args, kwargs), _call_structure(args, kwargs))."""
    if _tensors_only(args, kwargs):
        known = _TENSOR_ARGUMENT_SPECS.get(len(args))
        if known is None:
            known = _TENSOR_ARGUMENT_SPECS[len(args)] = (pytree.tree_flatten((args, kwargs))[1],
                                                        _call_structure(args, kwargs))
        return known
    return pytree.tree_flatten((args, kwargs))[1], _call_structure(args, kwargs)


class Dim:
    """A dynamic size, as torch.export's Dim: Dim("batch", min=1, max=64).

    name: an identifier. Dimensions given one Dim (or one name) are one
    symbol, equal in every call.
    min: the smallest size, default 2: a program traced at sizes of 2 or
    more may take another path at 1; asking for 1 makes the trace check the
    graph there.
    max: the largest size; None: no bound (every call is still checked
    against min)."""

    name: str
    min: int
    max: Optional[int]

    def __init__(self, name: str, *, min: int = 2, max: Optional[int] = None) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"Dim: the name must be an identifier, got {name!r}")
        self.name, self.min, self.max = name, int(min), None if max is None else int(max)

    def __repr__(self) -> str:
        bounds = "" if self.max is None else f", max={self.max}"
        return f"Dim({self.name!r}, min={self.min}{bounds})"


def _dynamic_dims(dynamic_shapes, args):
    """TraceOptions::dynamic of `dynamic_shapes`, a pytree over `args` whose
    entry for a tensor is None or {dim: Dim or name}; tensors are numbered
    as the placeholders are (in flattening order)."""
    out, count = [], [0]

    def walk(arg, spec, where):
        if isinstance(arg, torch.Tensor):
            index = count[0]
            count[0] += 1
            if spec is None:
                return
            if not isinstance(spec, dict):
                raise TypeError(f"dynamic_shapes{where}: expected None or {{dim: Dim}} for a tensor, "
                                f"got {type(spec).__name__}")
            for dim, d in spec.items():
                if isinstance(d, str):
                    d = Dim(d)
                if not isinstance(dim, int) or not isinstance(d, Dim):
                    raise TypeError(f"dynamic_shapes{where}: expected {{int: Dim}}, got "
                                    f"{{{dim!r}: {d!r}}}")
                out.append((index, dim, d.name, d.min, d.max))
        elif isinstance(arg, (tuple, list)):
            if spec is not None and (not isinstance(spec, (tuple, list)) or len(spec) != len(arg)):
                raise TypeError(f"dynamic_shapes{where}: expected a sequence of {len(arg)} "
                                f"entries, as the argument, got {spec!r}")
            for i, a in enumerate(arg):
                walk(a, None if spec is None else spec[i], f"{where}[{i}]")
        elif isinstance(arg, dict):
            if spec is not None and not isinstance(spec, dict):
                raise TypeError(f"dynamic_shapes{where}: expected a dict, as the argument")
            for k, a in arg.items():
                walk(a, None if spec is None else spec.get(k), f"{where}[{k!r}]")
        elif spec is not None:
            raise TypeError(f"dynamic_shapes{where}: the argument is not a tensor")

    if not isinstance(dynamic_shapes, (tuple, list)):
        raise TypeError("dynamic_shapes: expected one entry per positional argument (a tuple), "
                        f"got {type(dynamic_shapes).__name__}")
    walk(tuple(args), tuple(dynamic_shapes), "")
    return out


def trace(f: Callable[..., Any], args: Union[tuple[Any, ...], list[Any]],
          kwargs: Optional[dict[str, Any]] = None, *, inference: bool = False,
          preserve: Optional[Iterable[Union[str, torch._ops.OpOverload,
                                            torch._ops.OpOverloadPacket]]] = None,
          allow_input_mutation: bool = False, allow_data_dependent_values: bool = False,
          record_stack_traces: bool = True, meta: bool = False,
          passes: Union[str, Sequence[str], None] = None,
          dynamic_shapes: Optional[Sequence[Any]] = None) -> GraphModule:
    """Runs f(*args, **kwargs) once and returns the aten operators it ran as a torch.fx.GraphModule.

    f: an nn.Module or any callable. Its parameters and buffers (those of the
    module, or of the module a bound method belongs to) become get_attr nodes
    by qualified name; other tensors it reads are lifted as _tensor_constantN.
    args, kwargs: pytrees (tuples, lists, dicts, named tuples) of tensors and
    scalars; tensors become placeholders, scalars are specialised. args is
    the tuple of positional arguments ((x,) for one tensor), kwargs a dict
    of keyword arguments. The result takes the same arguments and returns
    the same structure as f.

    inference: run under torch.inference_mode, where the `preserve`
    operators are recorded whole instead of decomposed.
    preserve: the operators kept whole under inference, as names
    ("aten::linear") or torch.ops.aten operators; default aten::linear and
    aten::layer_norm.
    allow_input_mutation: let f write to its inputs (on copies during the
    trace; the graph records the writes).
    allow_data_dependent_values: let f read tensor values into Python
    (.item(), `if t.sum() > 0`), baking them in.
    record_stack_traces: node.meta["stack_trace"] with f's Python frames and
    node.meta["nn_module_stack"].
    meta: meta mode. f computes on meta tensors (shapes, no data) and no
    kernel computes anything, so tracing costs little time and memory; the
    graph is the one a real trace records, attributes included (the
    module's real tensors). args may hold meta tensors (device="meta"),
    which stand for CPU tensors; f sees tensors on the devices the real
    program would use. Operators without a meta kernel, and those whose
    result depends on values (.item(), nonzero), raise TraceError.
    passes: graph passes run on the trace, in order, by name (one name or a
    list): "dce", "cse", "shapes", "fold_bn", "fold_constants", "no_ops",
    "prepack", or the pipelines "cleanup" (cse and dce until neither
    changes the graph) and "optimize" (what optimize_for_inference runs);
    docs/passes.md. torchcap.Error names an unknown one.
    dynamic_shapes: the input dimensions the graph takes at any size, as
    torch.export has them: one entry per positional argument, for a tensor
    None or {dim: torchcap.Dim("batch", max=64)}, nested as the argument is.
    f is traced at several sizes and the graphs aligned into one; calls
    out of range are refused (docs/dynamic-shapes.md).

    Raises TraceError when the program cannot be traced; exceptions f raises
    propagate unchanged.
    """
    return _capture(f, args, kwargs, False, inference, preserve, allow_input_mutation,
                    allow_data_dependent_values, record_stack_traces, meta, passes=passes,
                    dynamic_shapes=dynamic_shapes)


def export(f: Callable[..., Any], args: Union[tuple[Any, ...], list[Any]],
           kwargs: Optional[dict[str, Any]] = None, *, inference: bool = False,
           preserve: Optional[Iterable[Union[str, torch._ops.OpOverload,
                                             torch._ops.OpOverloadPacket]]] = None,
           allow_data_dependent_values: bool = False, record_stack_traces: bool = True,
           meta: bool = False, passes: Union[str, Sequence[str], None] = None,
           dynamic_shapes: Optional[Sequence[Any]] = None) -> GraphModule:
    """trace, then dead-code elimination and a functionalizing re-trace.

    The graph has no in-place or view operators. Writes the program makes to
    its buffers (BatchNorm's running statistics in train mode) and inputs are
    extra outputs of the graph, written back when the module runs, so calling
    the result has the program's effect (f may write to its inputs: there is
    no allow_input_mutation).

    f, args, kwargs, inference, preserve, allow_data_dependent_values,
    record_stack_traces, meta, passes, dynamic_shapes: as for trace.
    """
    return _capture(f, args, kwargs, True, inference, preserve, True,
                    allow_data_dependent_values, record_stack_traces, meta, passes=passes,
                    dynamic_shapes=dynamic_shapes)


def dispatch_trace(f: Callable[..., Any],
                   args: Union[tuple[Any, ...], list[Any]]) -> GraphModule:
    """Upstream's dispatch_trace: export(f, args), with the inputs immutable to
    out= arguments as upstream's tracer has them (writes of in-place operators
    to inputs are exported; `torch.add(a, b, out=a)` with `a` an input is a
    TraceError, as in torchcap.trace).

    f: an nn.Module or any callable; args: the tuple of its positional
    arguments, as for trace.
    """
    return _capture(f, args, None, True, False, None, True, False, True,
                    refuse_out_into_inputs=True)


def save(gm: GraphModule, path: Union[str, os.PathLike[str]]) -> None:
    """Writes a graph to a `.tcg` file, which torchcap::load (C++) and
    torchcap.load read.

    gm: a GraphModule made by torchcap.trace or torchcap.export, saved with
    its arguments and results as traced and the module's current tensors; or
    another torch.fx.GraphModule of aten operators (make_fx's), saved with
    flat arguments and a tuple of results.
    path: the file to write, a str or path-like object.

    Raises torchcap.Error naming what cannot be stored.
    """
    _require_C()
    path = os.fspath(path)
    graph = getattr(gm, "_torchcap_graph", None)
    if graph is not None and _as_traced(gm):
        graph.save(path, _current_tensors(gm))
        return
    _C.save_fx(*_describe_fx(gm), path)


def _describe_fx(gm):
    """The nodes and attributes of a torch.fx.GraphModule for torchcap._C.save_fx."""
    if not isinstance(gm, torch.fx.GraphModule):
        raise Error(f"torchcap.save: expected a torch.fx.GraphModule, got a {type(gm).__name__}")
    nodes, attributes, seen = [], [], set()
    for n in gm.graph.nodes:
        target, args = "", n.args
        if n.op == "call_function":
            if n.target is operator.getitem:
                target = "getitem"
            elif isinstance(n.target, torch._ops.OpOverload):
                schema = n.target._schema
                target = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
            else:
                raise Error(f"torchcap.save: node %{n.name} calls {n.target}, which is not an "
                            f"operator (only aten operators and getitem can be stored; trace "
                            f"the program with torchcap.trace or make_fx)")
        elif n.op == "get_attr":
            target = n.target
            if target not in seen:
                seen.add(target)
                t = _attribute(gm, target)
                kind = ("parameter" if isinstance(t, torch.nn.Parameter) else
                        "constant" if target.startswith("_tensor_constant") else "buffer")
                attributes.append((target, kind, t))
        elif n.op == "output":
            results, _ = pytree.tree_flatten(n.args[0])
            if not all(isinstance(r, torch.fx.Node) for r in results):
                raise Error("torchcap.save: the graph returns values that are not tensors")
            args = results
        elif n.op != "placeholder":
            raise Error(f"torchcap.save: node %{n.name} is a {n.op} node; only graphs of aten "
                        f"operators can be stored (trace with torchcap.trace or make_fx)")
        meta = n.meta.get("tensor_meta")
        if meta is not None and not hasattr(meta, "shape"):
            meta = None
        if meta is not None:
            meta = (meta.dtype, list(meta.shape), list(meta.stride))
        nodes.append((n.op, n.name, target, args, n.kwargs, meta))
    return nodes, attributes
