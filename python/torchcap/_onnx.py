"""torchcap.to_onnx: a module torchcap made, written as an ONNX model by
torch.onnx.export, after the aten operators its exporter has no rule for are
lowered to ones it has (docs/python.md, "Exporting to ONNX").

Note [Lowering for the ONNX exporter]
torch.onnx.export (torch 1.13) runs a module under TorchScript's tracer and
translates each aten operator the trace records by a "symbolic" rule of its
opset. A torchcap graph calls the operators the dispatcher saw, below the
ones eager models call and the rules were written for: BatchNorm reaches
aten::native_batch_norm, a matmul of 3-D by 2-D ends in aten::_unsafe_view,
an exported graph calls the *_copy forms of views (view_copy, t_copy) and
writes slices with slice_scatter, and a model in eval mode calls the fused
transformer kernels (aten::_native_multi_head_attention,
aten::_transformer_encoder_layer_fwd). None of these has a rule. So the
graph is copied into a plain torch.fx.GraphModule with flat inputs and
outputs, the copy rewritten into operators that have one (_LOWERINGS, each
computing what the operator computes), and that copy exported. The user's
module is only read.

The copy writes nothing (Note [In-place operators]), so the exporter's own
handling of in-place operators, and of views they write through, is never
relied on.

What cannot be written as ONNX is refused with torchcap.Error naming the
node, its operator and the user's line, before the exporter runs: a batch
norm in training mode, a write to a graph input or a weight (an ONNX graph
cannot update either), an operator no rule and no lowering covers. Failures
the exporter finds itself (a rule that refuses some arguments) are reported
as torchcap.Error with the exporter's message and the nodes of the operator
it names, without the exporter's traceback.
"""

import keyword
import math
import operator
import os
import re
import warnings
from typing import Any, BinaryIO, Mapping, Optional, Sequence, Union

import torch
import torch.fx
import torch.nn.functional as F
import torch.utils._pytree as pytree

from torchcap._codegen import TorchcapCodeGen
from torchcap._errors import Error

_aten = torch.ops.aten


def to_onnx(gm: torch.fx.GraphModule, args: Union[tuple[Any, ...], list[Any], torch.Tensor],
            path: Union[str, "os.PathLike[str]", BinaryIO], *,
            kwargs: Optional[dict[str, Any]] = None, input_names: Optional[Sequence[str]] = None,
            output_names: Optional[Sequence[str]] = None, opset_version: Optional[int] = None,
            dynamic_axes: Optional[Mapping[str, Union[Mapping[int, str], Sequence[int]]]] = None,
            do_constant_folding: bool = True, export_params: bool = True,
            verbose: bool = False) -> None:
    """Writes `gm` as an ONNX model to `path` (torch.onnx.export after
    lowering; Note [Lowering for the ONNX exporter]).

    gm: a module made by torchcap.trace, torchcap.export or torchcap.load
    (or another torch.fx.GraphModule of aten operators), of a model in eval
    mode. It is not modified.
    args: the positional arguments gm is called with, a tuple (or one
    tensor); kwargs: its keyword arguments. gm is run once on them, which
    checks them as a call does (torchcap.InputError), and the exporter runs
    the lowered copy on them. The ONNX model takes the tensors among them,
    flattened in order, and returns gm's result tensors, flattened in order.
    path: a file name (str or path-like), or a binary file object (io.BytesIO).
    input_names, output_names: the ONNX names of those inputs and outputs;
    by default the graph's placeholder names and output_0, output_1, ...
    opset_version: the ONNX opset, as for torch.onnx.export (its default,
    14, when None).
    dynamic_axes: as for torch.onnx.export ({name: {axis: "batch"}} or
    {name: [axis, ...]}). The graph holds the shapes it was traced with, so
    only the dimensions a dynamic graph (traced with dynamic_shapes) takes at
    any size may be dynamic inputs; by default those are. A static axis
    named here is refused.
    do_constant_folding, export_params, verbose: as for torch.onnx.export.

    Raises torchcap.Error naming the node and operator of what ONNX cannot
    express: a batch norm in training mode, a write to an input or a weight,
    an operator the exporter has no rule for and torchcap does not lower.
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"to_onnx takes a torch.fx.GraphModule (a module made by torchcap.trace, "
                        f"torchcap.export or torchcap.load), not {type(gm).__name__}")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"to_onnx: args must be a tuple of gm's positional arguments, "
                        f"not {type(args).__name__}")
    args, kwargs = tuple(args), dict(kwargs or {})
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    opset = opset_version if opset_version is not None else _default_opset()
    with torch.no_grad():
        gm(*args, **kwargs)  # the module's own checks of its arguments
        lowered, leaves = lower(gm, args, kwargs)
        placeholders = [n for n in lowered.graph.nodes if n.op == "placeholder"]
        tensors = sum(isinstance(t, torch.Tensor) for t in leaves)
        if len(leaves) != len(placeholders) or tensors != len(leaves):
            raise Error(f"to_onnx: the graph takes {len(placeholders)} tensors, but the arguments "
                        f"hold {tensors} tensors and {len(leaves) - tensors} other values; an ONNX "
                        "model's inputs are tensors")
        num_outputs = len(next(iter(reversed(lowered.graph.nodes))).args[0])
        input_names = _names(input_names, [p.name for p in placeholders], "input_names")
        output_names = _names(output_names, [f"output_{i}" for i in range(num_outputs)],
                              "output_names")
        dynamic_axes = _dynamic_axes(gm, dynamic_axes, input_names, output_names)
        _refuse_unknown_operators(lowered, opset)
        _export(lowered, tuple(leaves), path, input_names=input_names, output_names=output_names,
                opset_version=opset, dynamic_axes=dynamic_axes,
                do_constant_folding=do_constant_folding, export_params=export_params,
                verbose=verbose)


def lower(gm, args, kwargs=None):
    """(lowered, inputs): a plain torch.fx.GraphModule computing what `gm`
    computes on `args` and `kwargs`, with gm's tensors, whose operators
    torch.onnx.export can translate and which writes nothing (Note [Lowering
    for the ONNX exporter]); it takes the input tensors one per placeholder,
    `inputs` being those of this call, and returns a tuple of gm's result
    tensors. Raises torchcap.Error for what cannot be lowered."""
    kwargs = dict(kwargs or {})
    try:
        return _lower(gm), _flat_inputs(gm, args, kwargs)
    except _WritesLeft as left:
        node = left.node
    # See Note [In-place operators].
    from torchcap._trace import _C, export
    if _C is None:
        raise _refusal(node, "writes into a view, or into a tensor read again after the write; "
                       "without torchcap's compiled part (torchcap._C), which makes the graph "
                       "functional first, that cannot be exported. Save the graph made by "
                       "torchcap.export, or load it with the compiled part.")
    if gm.__dict__.get("_torchcap_dynamic"):
        # The re-trace would hold the sizes of `args`.
        raise _refusal(node, "writes into a view, or into a tensor read again after the write, in "
                       "a dynamic graph; make the graph with torchcap.export (and the same "
                       "dynamic_shapes), which writes nothing, and export that.")
    functional = export(gm, args, kwargs)
    return _lower(functional), _flat_inputs(functional, args, kwargs)


def _lower(gm):
    codegen = gm.graph._codegen
    if getattr(codegen, "mutations", None):
        kind, target = codegen.mutations[0]
        what = "buffer" if kind == "buffer_mutation" else "input"
        more = f" and {len(codegen.mutations) - 1} more" if len(codegen.mutations) > 1 else ""
        raise Error(f"to_onnx: the graph writes {what} {target}{more}; an ONNX model cannot update its "
                    "inputs or weights. Export the model in eval mode (model.eval()), where batch "
                    "norms update nothing.")
    root = torch.nn.Module()
    graph = _flat_copy(gm, root)
    _refuse_writes_to_inputs(graph)
    _eliminate_dead_code(graph)
    _functional_forms(graph)
    for node in list(graph.nodes):
        if node.op == "call_function":
            lowering = _lowering_of(node.target)
            if lowering is not None:
                lowering(graph, node)
    _call_with_dynamic_sizes(graph)
    _eliminate_dead_code(graph)
    graph.lint()
    return torch.fx.GraphModule(root, graph, class_name="OnnxLowered")


def _flat_copy(gm, root):
    """gm's graph copied, with one placeholder per input tensor and the
    result tensors returned as a tuple; its attributes set on `root`."""
    codegen = gm.graph._codegen
    graph = torch.fx.Graph()
    env, attributes = {}, {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.placeholder(node.name)
        elif node.op == "get_attr":
            if node.target not in attributes:
                attributes[node.target] = _attribute_name(node.target, root)
                value = _fetch(gm, node.target)
                if isinstance(value, torch.Tensor) and value.dim() == 0 and \
                        not isinstance(value, torch.nn.Parameter):
                    # A scalar the program computed with may be a "wrapped
                    # number", which TorchScript's tracer takes for a Python
                    # number and fails on: a copy is a plain tensor.
                    value = value.clone()
                torch.fx.graph_module._assign_attr(value, root, attributes[node.target])
            env[node] = graph.get_attr(attributes[node.target])
        elif node.op == "output":
            graph.output(tuple(env[n] for n in _output_nodes(node, codegen)))
            continue
        elif node.op == "call_function":
            env[node] = graph.node_copy(node, lambda n: env[n])
        else:
            raise Error(f"to_onnx: node {node.name} is a {node.op} node; torchcap's graphs call "
                        "functions only (call to_onnx on the module made by torchcap.trace, export "
                        "or load)")
        env[node].meta = dict(node.meta)
    return graph


def _fetch(module, target):
    value = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
_MODULE_ATTRIBUTES = frozenset(dir(torch.nn.Module()))


def _attribute_name(target, root):
    """The name of attribute `target` in the lowered module: the same where
    each part is a plain name torch.fx's code can write (self.layer1, the
    "0" of a Sequential), else a new one. ONNX names the weights by these."""
    parts = target.split(".")
    if all(_PLAIN_NAME.fullmatch(p) and not keyword.iskeyword(p) and p not in _MODULE_ATTRIBUTES
           for p in parts):
        try:
            _fetch(root, target)
        except AttributeError:
            return target
    i = 0
    while hasattr(root, f"_attribute_{i}"):
        i += 1
    return f"_attribute_{i}"


def _output_nodes(output, codegen):
    """The result tensors' nodes in order: the leaves of the output's
    structure (torchcap's code generator holds them flat)."""
    values = output.args[0]
    leaves = list(values) if isinstance(codegen, TorchcapCodeGen) else pytree.tree_flatten(values)[0]
    for leaf in leaves:
        if not isinstance(leaf, torch.fx.Node):
            raise Error(f"to_onnx: the graph returns {leaf!r}, which is not a tensor; an ONNX model's "
                        "outputs are tensors")
    return leaves


def _flat_inputs(gm, args, kwargs):
    """The input tensors of a call, in the order of the graph's placeholders."""
    codegen = gm.graph._codegen
    if kwargs:
        if type(codegen) is torch.fx.graph.CodeGen:
            raise Error("to_onnx: this graph takes no keyword arguments")
        return list(codegen.process_inputs(*args, **kwargs))
    return list(codegen.process_inputs(*args))


def _names(given, default, what):
    if given is None:
        return default
    given = list(given)
    if len(given) != len(default) or not all(isinstance(n, str) for n in given):
        raise Error(f"to_onnx: {what} must be {len(default)} strings (the graph's "
                    f"{'inputs' if what == 'input_names' else 'outputs'}: {', '.join(default)}), "
                    f"got {given!r}")
    return given


def _dynamic_axes(gm, given, input_names, output_names):
    """dynamic_axes for torch.onnx.export: the given ones, checked against
    the dimensions of the graph's inputs that are dynamic, or those."""
    inputs = gm.__dict__.get("_torchcap_inputs")
    dynamic = {}  # input name -> its dynamic dimensions
    if inputs is not None and gm.__dict__.get("_torchcap_dynamic"):
        metas = [m for m in inputs if m is not None]  # the tensors' (a None shape size: dynamic)
        for name, meta in zip(input_names, metas):
            dims = [d for d, s in enumerate(meta.shape or ()) if s is None]
            if dims:
                dynamic[name] = dims
    if given is None:
        return {name: {d: f"{name}_dim{d}" for d in dims} for name, dims in dynamic.items()} or None
    for name, axes in given.items():
        if name in output_names:
            continue
        if name not in input_names:
            raise Error(f"to_onnx: dynamic_axes names {name!r}, which is no input or output "
                        f"(inputs: {', '.join(input_names)}; outputs: {', '.join(output_names)})")
        for axis in axes:
            if axis not in dynamic.get(name, ()):
                raise Error(f"to_onnx: dynamic_axes makes dimension {axis} of input {name} dynamic, but "
                            "the graph holds the size it was traced with there (its views and "
                            "reshapes keep it). Trace with dynamic_shapes for that dimension "
                            "(docs/dynamic-shapes.md).")
    return dict(given)


def _default_opset():
    from torch.onnx import _constants
    return _constants.ONNX_DEFAULT_OPSET


_LOWERED_FROM = "torchcap_lowered_from"  # node.meta: (name, operator) of the node it replaced


def _describe(node):
    """'node convolution (aten::convolution.default)'; a lowered node by the
    one it replaced."""
    lowered = node.meta.get(_LOWERED_FROM)
    if lowered is not None:
        return f"node {lowered[0]} ({lowered[1]}, lowered to {_operator_name(node.target)})"
    return f"node {node.name} ({_operator_name(node.target)})"


def _source(node):
    """The program's lines that made `node` (its recorded stack trace), on
    lines of their own, or nothing."""
    stack = node.meta.get("stack_trace")
    return "\n" + stack.rstrip("\n") if stack else ""


def _refusal(node, text):
    """torchcap.Error: the node, what is wrong with it, then where the program made it."""
    return Error(f"to_onnx: {_describe(node)} {text}{_source(node)}")


def _operator_name(target):
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return f"{schema.name}.{schema.overload_name or 'default'}"
    return getattr(target, "__name__", str(target))


# --- Writes -------------------------------------------------------------------

def _argument(node, schema, i):
    a = schema.arguments[i]
    return node.args[i] if i < len(node.args) else node.kwargs.get(a.name)


def _written_arguments(node):
    """The argument nodes `node` writes, by its schema's alias annotations."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return []
    written = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = _argument(node, schema, i)
            if isinstance(value, torch.fx.Node):
                written.append(value)
    return written


def _viewed_argument(node):
    """The argument node whose storage `node`'s result shares (a view, or an
    element of a list of views: split), or None."""
    if node.op == "call_function" and node.target is operator.getitem:
        return _viewed_argument(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.returns:
        return None
    alias = schema.returns[0].alias_info
    if alias is None or alias.is_write:
        return None
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and set(a.alias_info.before_set) & set(alias.before_set):
            value = _argument(node, schema, i)
            return value if isinstance(value, torch.fx.Node) else None
    return None


def _refuse_writes_to_inputs(graph):
    """torchcap.Error for a node that writes a graph input or attribute
    (directly or through a view of it): ONNX has no way to say it."""
    for node in graph.nodes:
        for value in _written_arguments(node):
            base = value
            while base.op == "call_function":
                viewed = _viewed_argument(base)
                if viewed is None:
                    break
                base = viewed
            if base.op in ("placeholder", "get_attr"):
                what = "input" if base.op == "placeholder" else f"attribute {base.target}"
                hint = ("an ONNX model cannot update its inputs" if base.op == "placeholder" else
                        "an ONNX model cannot update its weights: trace the model in eval mode "
                        "(model.eval()), where batch norms do not update their statistics")
                raise _refusal(node, f"writes the graph's {what} ({base.name}); {hint}")


# Note [In-place operators]
# A traced graph keeps the program's in-place operators (relu_, add_, copy_
# into a slice), and a node after a write reads the written value through
# the in-place node (Note [Proxy rebinding for in-place ops] in
# src/trace/dispatch.cpp), or through a view sharing the written tensor's
# storage. Where no node reads that storage after the write (through the
# written tensor, the tensor it views, or any view of either) but through
# the in-place node, the write changes nothing another node sees, and the
# functional operator (relu for relu_) computes the same. That covers what
# CNNs do (an in-place ReLU, a residual add_, a ReLU on the view an instance
# norm returns). Any other write is left to torchcap.export, whose
# functionalizing re-trace (docs/passes.md) turns writes through views into
# slice_scatter and friends, which are lowered; it needs the compiled part,
# without which such a graph is refused.

class _WritesLeft(Exception):
    def __init__(self, node):
        super().__init__(node.name)
        self.node = node


def _functional_forms(graph):
    """Each in-place node whose write no other node can see made the call of
    its functional operator; _WritesLeft for the first write that is left."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        written = _written_arguments(node)
        if not written:
            continue
        functional = _functional_operator(node)
        if functional is None or written != [node.args[0]]:  # out= arguments, for one
            raise _WritesLeft(node)
        for sharing in _sharing_storage(written[0]):
            if any(user is not node and order[user] > order[node] for user in sharing.users):
                raise _WritesLeft(node)
        node.target = functional


def _sharing_storage(node):
    """The nodes whose values share `node`'s storage: the tensor it views
    (transitively) and every view of that, `node` among them."""
    base = node
    while _viewed_argument(base) is not None:
        base = _viewed_argument(base)
    found, stack = [base], [base]
    while stack:
        for user in stack.pop().users:
            if user not in found and _viewed_argument(user) in found:
                found.append(user)
                stack.append(user)
    return found


def _functional_operator(node):
    """aten::relu for aten::relu_ (the same overload and arguments, no writes), or None."""
    schema = node.target._schema
    name = schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(_aten, name[:-1], None)
    overload = getattr(packet, schema.overload_name or "default", None)
    if overload is None or [a.name for a in overload._schema.arguments] != \
            [a.name for a in schema.arguments] or \
            any(a.alias_info is not None for a in overload._schema.arguments):
        return None
    return overload


def _eliminate_dead_code(graph):
    """Removes nodes no one uses that write nothing (the trace keeps some:
    aten::empty for a batch norm's reserve, the indices of a max pool)."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and not _written_arguments(node):
            graph.erase_node(node)


# --- Lowerings ----------------------------------------------------------------
# Each takes the lowered graph and a node, and replaces the node by ones the
# exporter translates, computing the same values. Python functions among
# them are recorded by TorchScript's tracer as the torch operators they call.

def _call_before(graph, node, target, args, kwargs=None):
    """A new node calling target, before `node`, with its metadata and a
    record of the node it lowers (for messages)."""
    with graph.inserting_before(node):
        new = graph.call_function(target, tuple(args), kwargs or {})
    new.meta = dict(node.meta)
    new.meta.setdefault(_LOWERED_FROM, (node.name, _operator_name(node.target)))
    return new


def _replace(graph, node, target, args, kwargs=None):
    new = _call_before(graph, node, target, args, kwargs)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


def _lower_to(target):
    """A lowering calling `target` with the node's arguments."""
    def lowering(graph, node):
        _replace(graph, node, target, node.args, node.kwargs)
    return lowering


def _lower_to_argument(graph, node):
    """lift_fresh(t) -> t: it only marks a tensor the program made."""
    node.replace_all_uses_with(node.args[0])
    graph.erase_node(node)


def _lower_native_batch_norm(graph, node):
    # native_batch_norm(input, weight, bias, running_mean, running_var,
    # training, momentum, eps) -> (out, save_mean, save_invstd). With running
    # statistics and training=False (eval mode), out is batch_norm's. Without
    # them (track_running_stats=False, instance norm), it normalizes by the
    # batch's statistics in eval mode too, and updates nothing.
    x, weight, bias, mean, var, training, momentum, eps = node.args
    if training and (mean is not None or var is not None):
        raise _refusal(node, "is a batch norm in training mode: it normalizes by the batch's "
                       "statistics and updates the running ones, which an ONNX inference model does "
                       "not do. Trace the model in eval mode (model.eval()).")
    for user in node.users:
        if user.target is not operator.getitem or (user.args[1] != 0 and user.users):
            raise _refusal(node, f"is a batch norm whose saved mean or inverse deviation node "
                           f"{user.name} reads; torchcap lowers its result only")
    if training or mean is None:
        new = _call_before(graph, node, _batch_norm_by_batch_statistics, (x, weight, bias, eps))
    else:
        new = _call_before(graph, node, _aten.batch_norm.default,
                           (x, weight, bias, mean, var, False, momentum, eps, False))
    for user in list(node.users):  # getitem 0 is the result; 1 and 2 have no users
        user.replace_all_uses_with(new)
        graph.erase_node(user)
    graph.erase_node(node)


def _batch_norm_by_batch_statistics(x, weight, bias, eps):
    """native_batch_norm(x, weight, bias, None, None, True, _, eps)[0]: x
    normalized per channel (dimension 1) by its mean and biased variance."""
    dims = [0] + list(range(2, x.dim()))
    centered = x - x.mean(dims, keepdim=True)
    y = centered / torch.sqrt((centered * centered).mean(dims, keepdim=True) + eps)
    shape = [1, -1] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _lower_softmax(softmax):
    """_softmax(x, dim, half_to_float) -> softmax(x, dim[, dtype=float32])."""
    def lowering(graph, node):
        x, dim, half_to_float = node.args
        _replace(graph, node, softmax, (x, dim), {"dtype": torch.float32} if half_to_float else {})
    return lowering


def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    """aten::_to_copy: a copy, of another dtype if given. An ONNX model has
    no devices, layouts or memory formats."""
    return x.to(dtype) if dtype is not None and dtype != x.dtype else x.clone()


def _zero(x):
    """aten::zero (functional zero_)."""
    return torch.zeros_like(x)


def _copy(x, src):
    """aten::copy (functional copy_) and aten::fill.Tensor (a 0-dim src): a
    tensor of x's shape and dtype holding src, broadcast. The exporter has
    no rule for the first and fails an internal check of TorchScript on the
    second."""
    return src.to(x.dtype).expand_as(x).clone()


def _slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """aten::slice_scatter with step 1: x with x[start:end] along dim replaced
    by src, as the concatenation of what is kept and src. The slices are
    Python's, as aten::slice's are (negative bounds count from the end, both
    are clamped), and take any size: they hold no size of x."""
    start = 0 if start is None else start
    end = _MAX_INDEX if end is None else end
    if 0 <= end < start:
        end = start
    before = (slice(None),) * (dim % x.dim())
    return torch.cat([x[before + (slice(None, start),)], src, x[before + (slice(end, None),)]], dim)


_MAX_INDEX = 2 ** 63 - 1


def _select_scatter(x, src, dim, index):
    """aten::select_scatter: x with x.select(dim, index) replaced by src."""
    return _slice_scatter(x, src.unsqueeze(dim), dim, index, _MAX_INDEX if index == -1 else index + 1)


def _lower_slice_scatter(graph, node):
    step = node.args[5] if len(node.args) > 5 else node.kwargs.get("step", 1)
    if step != 1:
        raise _refusal(node, f"writes a slice with step {step}; torchcap lowers slice_scatter "
                             "with step 1 only")
    _replace(graph, node, _slice_scatter, node.args, node.kwargs)


def _adaptive_avg_pool2d(x, output_size):
    """aten::_adaptive_avg_pool2d. The exporter's rule is a pooling of fixed
    windows, which needs each input size to be a multiple of the output's;
    otherwise the same averages, as products with averaging matrices: output
    row i averages input rows floor(i * H / h) to ceil((i + 1) * H / h)."""
    sizes = [int(s) for s in x.shape[-2:]]
    if all(n % m == 0 for n, m in zip(sizes, output_size)):
        return F.adaptive_avg_pool2d(x, output_size)

    def averaging(n, m):  # [m, n]
        rows = []
        for i in range(m):
            start, end = (i * n) // m, -((-(i + 1) * n) // m)
            rows.append([1.0 / (end - start) if start <= j < end else 0.0 for j in range(n)])
        return torch.tensor(rows, dtype=x.dtype)

    return torch.matmul(torch.matmul(averaging(sizes[0], output_size[0]), x),
                        averaging(sizes[1], output_size[1]).t())


def _lower_fused_attention(graph, node):
    (query, key, value, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
     mask, need_weights, average) = _bound(node, _aten._native_multi_head_attention.default)
    _refuse_mask(node, mask)
    _replace(graph, node, _multi_head_attention,
             (query, key, value, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
              proj_bias, need_weights, average))


def _lower_fused_encoder_layer(graph, node):
    bound = _bound(node, _aten._transformer_encoder_layer_fwd.default)
    _refuse_mask(node, bound[18])
    _replace(graph, node, _transformer_encoder_layer, bound[:18])


def _bound(node, overload):
    """The node's arguments by its schema, defaults filled in, mask_type
    (the last) dropped: it is only read with a mask, which is refused."""
    schema = overload._schema
    values = []
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            values.append(node.args[i])
        else:
            values.append(node.kwargs.get(a.name, a.default_value))
    return values[:-1]


def _refuse_mask(node, mask):
    if mask is not None:
        raise _refusal(node, "is a fused attention with a mask, which torchcap does not lower; "
                             "trace the model without the mask")


def _multi_head_attention(query, key, value, embed_dim, num_heads, qkv_weight, qkv_bias,
                          proj_weight, proj_bias, need_weights, average_attn_weights):
    """aten::_native_multi_head_attention without a mask:
    nn.MultiheadAttention(batch_first=True) on [batch, length, embed_dim]
    inputs, with the packed input projection."""
    head_dim = embed_dim // num_heads
    w_q, w_k, w_v = qkv_weight.chunk(3)
    b_q, b_k, b_v = qkv_bias.chunk(3)

    def heads(x, w, b):  # [B, L, E] -> [B, H, L, D]
        x = F.linear(x, w, b)
        return x.reshape(x.size(0), x.size(1), num_heads, head_dim).transpose(1, 2)

    q, k, v = heads(query, w_q, b_q), heads(key, w_k, b_k), heads(value, w_v, b_v)
    weights = torch.matmul(q * (1.0 / math.sqrt(head_dim)), k.transpose(2, 3)).softmax(-1)
    out = torch.matmul(weights, v).transpose(1, 2)
    out = F.linear(out.reshape(out.size(0), out.size(1), embed_dim), proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, weights.mean(1) if average_attn_weights else weights


def _transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                               proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
                               norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                               ffn_bias_2):
    """aten::_transformer_encoder_layer_fwd without a mask:
    nn.TransformerEncoderLayer(batch_first=True) in eval mode."""
    def attention(x):
        return _multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias,
                                     proj_weight, proj_bias, False, False)[0]

    def feed_forward(x):
        x = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(x) if use_gelu else F.relu(x), ffn_weight_2, ffn_bias_2)

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = src
    if norm_first:
        x = x + attention(norm(x, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(x + attention(x), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)


def _size(x, dim):
    """aten::sym_size.int: see Note [Dynamic sizes]."""
    return x.size(dim)


def _lower_sym_size(graph, node):
    if len(node.args) != 2:
        raise _refusal(node, "reads all sizes; torchcap lowers the size of one dimension only")
    _replace(graph, node, _size, node.args)


_LOWERINGS = {
    _aten.native_batch_norm.default: _lower_native_batch_norm,
    # Applied to a new tensor (a matmul's result), as a reshape is.
    _aten._unsafe_view.default: _lower_to(_aten.reshape.default),
    # A reshape that could be a view (Note [Reshape aliases are recorded as
    # views] in src/trace/dispatch.cpp); the strides do not change values.
    _aten._reshape_alias.default: lambda graph, node: _replace(
        graph, node, _aten.reshape.default, node.args[:2]),
    _aten._native_multi_head_attention.default: _lower_fused_attention,
    _aten._transformer_encoder_layer_fwd.default: _lower_fused_encoder_layer,
    _aten._softmax.default: _lower_softmax(_aten.softmax.int),
    _aten._log_softmax.default: _lower_softmax(_aten.log_softmax.int),
    _aten._adaptive_avg_pool2d.default: _lower_to(_adaptive_avg_pool2d),
    _aten._adaptive_avg_pool3d.default: _lower_to(_aten.adaptive_avg_pool3d.default),
    _aten.lift_fresh.default: _lower_to_argument,
    _aten.lift_fresh_copy.default: _lower_to(_aten.clone.default),
    _aten._to_copy.default: _lower_to(_to_copy),
    _aten.zero.default: _lower_to(_zero),
    _aten.copy.default: lambda graph, node: _replace(graph, node, _copy, node.args[:2]),
    _aten.fill.Tensor: _lower_to(_copy),
    _aten.slice_scatter.default: _lower_slice_scatter,
    _aten.select_scatter.default: _lower_to(_select_scatter),
    # The exporter's rule (GridSample, from opset 16) is for grid_sampler.
    _aten.grid_sampler_2d.default: _lower_to(_aten.grid_sampler.default),
    _aten.sym_size: _lower_sym_size,
    _aten.sym_size.int: _lower_sym_size,
}


def _lowering_of(target):
    lowering = _LOWERINGS.get(target)
    if lowering is not None:
        return lowering
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.name.startswith("aten::") and schema.name.endswith("_copy"):
        # Functionalization's copies of views: aten::view_copy -> aten::view.
        # The graph writes nothing (Note [In-place operators]), so no
        # write can reach through the view.
        view = getattr(getattr(_aten, schema.name[len("aten::"):-len("_copy")], None),
                       schema.overload_name or "default", None)
        if view is not None:
            return _lower_to(view)
    return None


# Note [Dynamic sizes]
# A dynamic graph reads sizes with aten::sym_size and computes with them
# (operator.mul, ...) before a view or an expand takes them. Under
# TorchScript's tracer, Tensor.size records aten::size, and its result,
# given to a Tensor method or torch function, is recorded as an input of
# that call, so the exporter computes it from the ONNX input's shape and a
# dynamic axis stays dynamic. An operator called through torch.ops sees a
# plain int instead, which the exporter writes as a constant. So sym_size
# becomes Tensor.size, and an operator that takes a size computed from one
# is called as the Tensor method (or torch function) of its name.
_SIZE_ARITHMETIC = frozenset([operator.add, operator.sub, operator.mul, operator.floordiv,
                              operator.mod, operator.neg, operator.truediv])


def _slice(x, dim=0, start=None, end=None, step=1):
    """aten::slice.Tensor by indexing (Tensor has no slice method)."""
    return x[(slice(None),) * (dim % x.dim()) + (slice(start, end, step),)]


_DYNAMIC_CALLS = {"slice": _slice}


def _call_with_dynamic_sizes(graph):
    sizes = set()
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if node.target is _size or (node.target in _SIZE_ARITHMETIC and
                                     any(n in sizes for n in inputs)):
            sizes.add(node)
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None or not any(n in sizes for n in inputs):
            continue
        name = schema.name.split("::")[-1]
        if name in _DYNAMIC_CALLS:
            new = _call_before(graph, node, _DYNAMIC_CALLS[name], node.args, node.kwargs)
        elif hasattr(torch.Tensor, name):
            with graph.inserting_before(node):
                new = graph.call_method(name, node.args, node.kwargs)
            new.meta = dict(node.meta)
        elif getattr(getattr(torch, name, None), "__module__", None):
            new = _call_before(graph, node, getattr(torch, name), node.args, node.kwargs)
        else:
            raise _refusal(node, "takes a dynamic size, and has no Tensor method or torch function "
                                 "to call it through (Note [Dynamic sizes] in _onnx.py)")
        node.replace_all_uses_with(new)
        graph.erase_node(node)


# --- Export -------------------------------------------------------------------

def _has_rule(name, opset):
    """Whether torch.onnx has a rule for aten operator `name` (aten::add) at
    `opset`; None if this torch cannot say."""
    try:
        from torch.onnx._internal import registration
    except ImportError:
        return None
    return registration.registry.is_registered_op(name, opset)


def _refuse_unknown_operators(lowered, opset):
    unknown = {}
    for node in lowered.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and _has_rule(schema.name, opset) is False:
            unknown.setdefault(schema.name, []).append(node)
    if not unknown:
        return
    from torch.onnx import _constants
    lines = [f"to_onnx: torch.onnx has no rule at opset {opset} for "
             f"{', '.join(sorted(unknown))}, and torchcap does not lower "
             f"{'it' if len(unknown) == 1 else 'them'}:"]
    for name, nodes in sorted(unknown.items()):
        later = [v for v in range(opset + 1, _constants.ONNX_MAX_OPSET + 1) if _has_rule(name, v)]
        hint = f" (torch.onnx has one from opset {later[0]}: opset_version={later[0]})" if later else ""
        lines.append(f"  {name}{hint}: {len(nodes)} node(s), the first {_describe(nodes[0])}, from"
                     + _source(nodes[0]))
    raise Error("\n".join(lines))


def _export(lowered, leaves, path, **options):
    try:
        with warnings.catch_warnings():
            # The lowered graph's code reads sizes (Tensor.size) where a
            # dynamic graph needs them, and makes constants (torch.tensor);
            # the tracer warns at each, as it would for any model.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(lowered, leaves, path, **options)
    except OSError:
        raise  # the file could not be written, as open() would say
    except Exception as e:  # a rule's refusal, or one of TorchScript's passes'
        message = str(e).strip()
        named = re.search(r"operator '?(?:aten::)?(\w+)'?", message)
        nodes = []
        if named:
            nodes = [n for n in lowered.graph.nodes
                     if getattr(getattr(n.target, "_schema", None), "name", None) ==
                     f"aten::{named.group(1)}"]
        where = f" (the first of its nodes: {_describe(nodes[0])})" if nodes else ""
        first = message.splitlines()[0].split("  [Caused by")[0] if message else ""
        raise Error(f"to_onnx: torch.onnx.export failed on the lowered graph{where}: "
                    f"{type(e).__name__}: {first}{_source(nodes[0]) if nodes else ''}") from None
