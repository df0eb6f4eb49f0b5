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

import collections
import copy
import operator
import os

import torch
import torch.nn
import torch.utils._pytree as pytree
from torch.fx.graph_module import _WrappedCall

from torchcap import _errors
from torchcap._errors import Error, InputError, TraceError
from torchcap._load import (_BUFFER_UPDATES_LOCK, _FIRST_USE_LOCK, TorchcapCodeGen, _InputMeta,
                            _Spec, _check_inputs, _cyclic_gc_paused,
                            _forward_after_generating_code, _fx_illegal_names, _generated_code,
                            _placeholder_names, _refuse_pickling, _refuse_unbound_weights,
                            _set_generated_code, _set_graph_generating_code_later)

try:
    from torchcap import _C
except ImportError as e:  # the package works as a loader without its compiled part
    _C = None
    _C_IMPORT_ERROR = e

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TORCHCAP_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames in these files are the tracer's and torch's own: stack traces skip them.
_INTERNAL_DIRS = [_TORCH_DIR, _TORCHCAP_DIR]

# Messages of LibTorch's autograd when a program differentiates while traced
# (the tracer runs it under no_grad).
_GRADIENT_PHRASES = ("does not require grad and does not have a grad_fn",
                     "One of the differentiated Tensors does not require grad")
# The C++ option names in those messages, as the Python API spells them.
_OPTION_NAMES = {
    "TraceOptions::allow_data_dependent_values": "allow_data_dependent_values=True",
    "TraceOptions::allow_input_mutation": "allow_input_mutation=True",
    "TraceOptions::preserve": "preserve",
    "expected e.g. aten::linear": "expected e.g. 'aten::linear' or torch.ops.aten.linear",
    "torch::where": "torch.where",
    "torchcap::trace": "torchcap.trace",
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
    elif not training and any(p in message for p in _GRADIENT_PHRASES):
        cls = TraceError
        message = ("the program computes gradients (backward() or torch.autograd.grad) while "
                   "traced: torchcap.trace and export record the forward computation, under "
                   "no_grad, and capture no gradients. To capture a training step (forward, "
                   "backward and the optimizer's update) use torchcap.export_training. "
                   f"(LibTorch: {message.splitlines()[0]})")
    else:
        return None
    message = _python_message(message)
    if "Immutable tensor" in message and "graph input" in message:
        message += (" Or let the program write to its inputs: torchcap.trace(..., "
                    "allow_input_mutation=True), or torchcap.export.")
    where = None if '\n  File "' in message else _user_frame(e.__traceback__)
    if where is not None:
        file, line, function, code = where
        message += f'\n  File "{file}", line {line}, in {function}'
        if code:
            message += f"\n    {code}"
    return cls(message)


# --- Tracing ---------------------------------------------------------------------

def _operator_name(op):
    """"aten::linear" for "aten::linear", "linear", torch.ops.aten.linear(.default)."""
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        schema_name, _, overload = str(op).partition(".")[2].partition(".")
        op = f"{str(op).partition('.')[0]}::{schema_name}" + (
            f".{overload}" if overload and overload != "default" else "")
    op = str(op)
    return op if "::" in op else "aten::" + op


def _module_of(f):
    if isinstance(f, torch.nn.Module):
        return f
    owner = getattr(f, "__self__", None)  # a bound method of a module
    return owner if isinstance(owner, torch.nn.Module) else None


def _check_args(args, kwargs):
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
             refuse_out_into_inputs=False):
    _require_C()
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
        preserve = [_operator_name(op) for op in preserve]
    out_spec = []
    in_spec, structure = _argument_specs(args, kwargs)
    named = _spec_holds_named_tuple(in_spec)

    def call(*a, **k):
        if named:  # Note [Named tuples]
            a, k = _as_spec((a, k), in_spec)
        out = f(*a, **k)
        out_spec.append(_LEAF_SPEC if isinstance(out, torch.Tensor) else pytree.tree_flatten(out)[1])
        return out

    with _cyclic_gc_paused():  # Note [No collections] in _load.py
        try:
            graph = _C.trace(call, parameters, buffers, args, kwargs, export, inference, preserve,
                             allow_input_mutation, allow_data_dependent_values,
                             record_stack_traces, _INTERNAL_DIRS, modules, meta=meta,
                             refuse_out_into_inputs=refuse_out_into_inputs)
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
        gm = _to_fx(graph, kwargs)
    # Plain attributes, set in the instance's __dict__ as nn.Module would set
    # them; its __setattr__ would attach the attributes first (Note
    # [Attributes attached on first use]).
    gm.__dict__.update(in_spec=in_spec, out_spec=out_spec[0] if out_spec else None,
                       _torchcap_call_structure=structure)
    if out_spec and _spec_holds_named_tuple(out_spec[0]):
        gm.__dict__["_torchcap_named_result"] = True
    # Note [Inputs of the traced shapes] in _load.py: checked on each call.
    leaves = args if _tensors_only(args, kwargs) else _spec_leaves(in_spec, (args, kwargs), [])
    written = iter(graph.written_inputs())
    gm.__dict__["_torchcap_inputs"] = tuple(
        _InputMeta.of(t, next(written, False)) if isinstance(t, torch.Tensor) else None
        for t in leaves)
    return gm


# Note [Named tuples]
# The C++ tracer hands the program its arguments through IValues, whose
# tuples have no names, and the graph's results are built from the C++
# graph's output structure, which has none either: a namedtuple argument
# reached the program as a plain tuple (`p.a` failed), and a namedtuple
# result came back from the traced module as a plain tuple. The pytree specs
# keep the types, and torch's pytree flattens a named tuple as its fields in
# order, the leaves of the plain tuple in its place. So both are rebuilt
# the same way, from their spec (_as_spec): the program's arguments before
# it runs, from in_spec, and a traced module's result after each call
# (_CheckedCall), from out_spec. A .tcg file has no named tuples:
# torchcap.load and C++ give plain tuples in their place.

def _spec_holds_named_tuple(spec):
    return spec.type is collections.namedtuple or any(
        _spec_holds_named_tuple(c) for c in spec.children_specs)


def _as_spec(value, spec):
    """`value`, of `spec`'s structure with plain tuples in places, as `spec`
    has it (Note [Named tuples])."""
    return pytree.tree_unflatten(pytree.tree_flatten(value)[0], spec)


def _tensors_only(args, kwargs):
    """Whether a call passes positional tensors only: its spec, leaves and
    structure need no walk."""
    return not kwargs and all(isinstance(a, torch.Tensor) for a in args)


# Note [Specs of tensor arguments]
# The pytree specs of a trace's arguments cost several times more right
# after a trace than when made on their own, nearly all of it in cache
# misses: after the program ran, pytree's Python code had left the caches. A program
# called with tensors only, and returning one tensor, has specs that depend
# only on the number of tensors: made once, and shared by the traced
# modules, which never change them.
_LEAF_SPEC = pytree.LeafSpec()
_TENSOR_ARGUMENT_SPECS = {}  # n -> (in_spec, call structure) of n positional tensors


def _argument_specs(args, kwargs):
    """(pytree spec of (args, kwargs), _call_structure(args, kwargs))."""
    if _tensors_only(args, kwargs):
        known = _TENSOR_ARGUMENT_SPECS.get(len(args))
        if known is None:
            known = _TENSOR_ARGUMENT_SPECS[len(args)] = (pytree.tree_flatten((args, kwargs))[1],
                                                        _call_structure(args, kwargs))
        return known
    return pytree.tree_flatten((args, kwargs))[1], _call_structure(args, kwargs)


# --- Calling a traced module ---------------------------------------------------
# The generated forward unpacks nested arguments by indexing: called with
# another structure it fails with Python's own TypeError or an operator's,
# or, given a tensor where a tuple was traced, indexes the tensor and
# computes something else. So each call's structure is compared with the
# traced one first (a walk over the arguments, no copies).

def _fits(spec, value):
    """Whether `value` has the structure of pytree spec `spec`; a leaf fits any
    value that is not a container (tensors; scalars were fixed when traced)."""
    if isinstance(spec, pytree.LeafSpec):
        return pytree._is_leaf(value)
    if pytree._is_leaf(value) or pytree._get_node_type(value) is not spec.type:
        return False
    if spec.type is dict:  # by key, in any order
        return (len(value) == len(spec.context) and
                all(k in value and _fits(c, value[k])
                    for k, c in zip(spec.context, spec.children_specs)))
    children, context = pytree.SUPPORTED_NODES[spec.type].flatten_fn(value)
    return (context == spec.context and len(children) == len(spec.children_specs) and
            all(_fits(c, v) for c, v in zip(spec.children_specs, children)))


def _spec_leaves(spec, value, out):
    """The leaves of `value`, which fits pytree spec `spec`, in the spec's
    order (a dict's in the traced call's key order, whatever the call's)."""
    if isinstance(spec, pytree.LeafSpec):
        out.append(value)
        return out
    if spec.type is dict:
        children = [value[k] for k in spec.context]
    else:
        children = pytree.SUPPORTED_NODES[spec.type].flatten_fn(value)[0]
    for child_spec, child in zip(spec.children_specs, children):
        _spec_leaves(child_spec, child, out)
    return out


def _structure(value):
    """"Tensor", "(Tensor, [Tensor, int])", "{'mask': Tensor}": a value's
    structure, with the types of its leaves."""
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if pytree._is_leaf(value):
        return type(value).__name__
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_structure(v)}" for k, v in value.items()) + "}"
    inner = ", ".join(_structure(v) for v in value)
    if pytree._is_namedtuple_instance(value):
        return f"{type(value).__name__}({inner})"
    if isinstance(value, tuple):
        return f"({inner}{',' if len(value) == 1 else ''})"
    return f"[{inner}]"


def _call_structure(args, kwargs):
    return "(" + ", ".join([_structure(a) for a in args] +
                           [f"{k}={_structure(v)}" for k, v in kwargs.items()]) + ")"


class _CheckedCall:
    """A traced module's _wrapped_call: refuses a call whose arguments are not
    structured as the traced ones with an InputError, before anything runs."""

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def __call__(self, obj, /, *args, **kwargs):
        spec = getattr(obj, "in_spec", None)
        if spec is not None and not _fits(spec, (args, kwargs)):
            args, kwargs = _bound_as_traced(obj, spec, args, kwargs)
        inputs = obj.__dict__.get("_torchcap_inputs")
        if inputs is not None:  # Note [Inputs of the traced shapes] in _load.py
            flat = spec is None or _tensors_only(args, kwargs)
            relaid = _check_inputs(inputs, args if flat else _spec_leaves(spec, (args, kwargs), []),
                                   _traced_input_labels, obj)
            if relaid is not None:  # Note [Inputs in the traced layout]
                args, kwargs = (tuple(relaid), kwargs) if flat else \
                    pytree.tree_unflatten(relaid, spec)
        if kwargs and "obj" in kwargs:
            # A program's keyword that torch.fx's _WrappedCall would take for
            # its own parameter (Note [Keywords that are no parameter names]):
            # what it calls, called directly.
            result = super(self.wrapped.cls, obj).__call__(*args, **kwargs)
        else:
            result = self.wrapped(obj, *args, **kwargs)
        if obj.__dict__.get("_torchcap_named_result"):  # Note [Named tuples]
            result = _as_spec(result, obj.out_spec)
        return result


def _traced_input_labels(gm):
    """"ph_1, kwargs['scale']": each tensor input's placeholder, and where the
    traced call passed it (Note [Inputs of the traced shapes] in _load.py)."""
    names = _placeholder_names(gm)
    spec = getattr(gm, "in_spec", None)
    if spec is None:
        return names
    paths = []
    for root, child in zip(("args", "kwargs"), spec.children_specs):
        _spec_paths(child, root, paths)
    paths = [p for p, want in zip(paths, gm._torchcap_inputs) if want is not None]
    return [f"{n}, {p}" for n, p in zip(names, paths)]


def _spec_paths(spec, path, out):
    """The access path ("args[0][1]", "kwargs['mask']") of each leaf of pytree
    spec `spec`, in the order of _spec_leaves."""
    if isinstance(spec, pytree.LeafSpec):
        out.append(path)
        return out
    keys = spec.context if spec.type is dict else range(len(spec.children_specs))
    for key, child in zip(keys, spec.children_specs):
        _spec_paths(child, f"{path}[{key!r}]", out)
    return out


def _bound_as_traced(gm, spec, args, kwargs):
    """The call's arguments as the traced call passed them (positional
    parameters given by keyword are moved to their place), or InputError."""
    import inspect
    try:
        bound = inspect.signature(type(gm).forward).bind(gm, *args, **kwargs)
        positional, keywords = [], {}
        for name, value in list(bound.arguments.items())[1:]:
            kind = bound.signature.parameters[name].kind
            if kind == inspect.Parameter.KEYWORD_ONLY:
                keywords[name] = value
            elif kind == inspect.Parameter.VAR_POSITIONAL:
                positional.extend(value)
            elif kind == inspect.Parameter.VAR_KEYWORD:
                keywords.update(value)
            else:
                positional.append(value)
        if _fits(spec, (tuple(positional), keywords)):
            return tuple(positional), keywords
    except TypeError:
        pass
    expected = getattr(gm, "_torchcap_call_structure", None) or repr(spec)
    raise InputError(f"the traced module takes arguments structured as {expected}, as when it "
                     f"was traced; it was called with {_call_structure(args, kwargs)}. Pass "
                     f"the same nesting of tuples, lists and dicts and the same keywords "
                     f"(tensor values may differ; other values were fixed when traced)")


class _KeywordCodeGen(TorchcapCodeGen):
    """forward(self, <positional>, *, <keywords>): the program's keyword
    arguments, which the graph takes as one trailing dict argument.

    Note [Keywords that are no parameter names]: a program takes whatever
    keywords its caller passes, `class` or `torch` among them
    (f(x, **{"class": y})). Made a parameter of the generated forward, such
    a name is a syntax error (a Python keyword) or hides a name the code
    reads (torch.ops..., getattr, float('inf'), a placeholder). Those
    keywords come in through one `**` parameter, under a name the code does
    not use, so callers pass them by their own names as before; the others
    stay keyword-only parameters, which the signature shows. Which keywords
    a call must pass is checked before forward runs (_CheckedCall).
    """

    def __init__(self, base, keywords):
        super().__init__(base.in_spec, base.out_spec, base.mutations, base.placeholders)
        self.keywords = list(keywords)

    def gen_fn_def(self, free_vars, maybe_return_annotation):
        text = super().gen_fn_def(free_vars, maybe_return_annotation)
        head, _, body = text.partition("\n")
        params = head[head.index("(") + 1:head.rindex(")")].split(", ")
        packed = params.pop()  # the dict parameter
        used = _fx_illegal_names().union(params, [_BUFFER_UPDATES_LOCK])
        named = [k for k in self.keywords if k.isidentifier() and k not in used]
        signature, values, rest = list(params), [], None
        if any(k in params for k in self.keywords):
            signature.append("/")  # so that such a keyword reaches `rest`
        if named:
            signature += ["*"] + named
        if len(named) < len(self.keywords):
            rest = "keywords"
            while rest in used or rest in self.keywords:
                rest += "_"
            signature.append(f"**{rest}")
        named = set(named)
        for k in self.keywords:
            values.append(f"{k!r}: {k}" if k in named else f"{k!r}: {rest}[{k!r}]")
        head = f"def forward({', '.join(signature)}){maybe_return_annotation}:"
        pack = f"    {packed} = {{{', '.join(values)}}}"
        return "\n".join([head, pack] + ([body] if body else []))

    def process_inputs(self, *args, **kwargs):
        return super().process_inputs(*args, kwargs) if self.keywords else \
            super().process_inputs(*args)


def _set_tensor(gm, name, tensor, is_parameter):
    owner = gm
    *path, leaf = name.split(".")
    for part in path:
        child = owner._modules.get(part)
        if child is None:
            # The names are a module's own attribute paths, so add_module's
            # checks (which cost a failed attribute lookup each) cannot fail.
            child = owner._modules[part] = torch.nn.Module()
        owner = child
    if is_parameter and isinstance(tensor, torch.nn.Parameter):
        owner._parameters[leaf] = tensor
        owner._buffers.pop(leaf, None)
    else:
        owner._parameters.pop(leaf, None)
        owner._buffers[leaf] = tensor


def _module_maker():
    """A function making a torch.nn.Module as torch.nn.Module() makes it.

    A trace's attributes sit in one plain module per dotted prefix ("0" for
    "0.weight" in an nn.Sequential), and Module() is slow enough to show in
    a trace's time per node on small models. A new module's __dict__ holds
    only constants and empty containers (`training`, `_parameters`, ...),
    so a copy of one, with new containers, is a new module: made by one dict
    display. If this torch makes modules otherwise, Module() it is.
    """
    Module = torch.nn.Module
    template = vars(Module())
    fields, names = [], {"Module": Module, "new": object.__new__}
    for i, (key, value) in enumerate(template.items()):
        if type(value) in (dict, set, collections.OrderedDict) and not value:
            names[f"c{i}"] = type(value)
            fields.append(f"{key!r}: c{i}()")
        elif value is None or type(value) is bool:
            fields.append(f"{key!r}: {value!r}")
        else:
            return Module
    if Module.__new__ is not object.__new__ or type(Module) is not type:
        return Module
    source = ("def new_module():\n"
              "    m = new(Module)\n"
              f"    m.__dict__.update({{{', '.join(fields)}}})\n"
              "    return m\n")
    exec(source, names)  # noqa: S102 -- source made above from the template's keys
    made = names["new_module"]()
    if type(made) is not Module or vars(made) != template:
        return Module
    return names["new_module"]


_new_module = _module_maker()


def _fx_graph(graph, keywords, direct=True):
    """The torch.fx.Graph of a torchcap._C.GraphModule, with its code generator.

    Built as torchcap.load builds a graph from a file (the same code
    generator and conventions), from the C++ graph directly (Note [Building the
    torch.fx graph directly] in src/python/module.cpp). direct=False: every
    node made by Graph.create_node (Note [Creating torch.fx nodes directly]).
    """
    fx_graph = torch.fx.Graph()
    with _cyclic_gc_paused():  # Note [No collections] in _load.py
        in_spec, out_spec, mutations, placeholders = graph.build_fx(fx_graph, _Spec, direct)
    if mutations:
        # As the loader: written inputs are passed to the output too, so that
        # the generated code keeps them bound until the writes at the end.
        output = next(iter(reversed(fx_graph.nodes)))
        written = [placeholders[t] for k, t in mutations if k == "input_mutation"]
        output.args = ((list(output.args[0]), written),)
    codegen = TorchcapCodeGen(in_spec, out_spec, mutations, placeholders)
    fx_graph.set_codegen(_KeywordCodeGen(codegen, keywords) if keywords else codegen)
    return fx_graph


def _to_fx(graph, kwargs, checked=True):
    """A torch.fx.GraphModule of a torchcap._C.GraphModule, sharing its tensors.
    checked: calls are checked against the traced arguments' structure
    (_CheckedCall; in_spec is set on the module afterwards).

    Its torch.fx graph is made when first needed (Note [Graph made on first
    use]) and its forward() generated and compiled when first needed after
    that, as a loaded module's (Note [Code generated on first use] in
    _load.py).
    """
    keywords = list(kwargs.keys())
    gm = _new_traced_module(checked, lambda: _fx_graph(graph, keywords))
    # The traced tensors become the module's attributes when first needed
    # (Note [Attributes attached on first use]).
    d = gm.__dict__
    for container in _ATTRIBUTE_CONTAINERS:
        del d[container]
    d.update(_torchcap_unattached=True, _torchcap_graph=graph, _torchcap_keywords=keywords)
    # A model traced on the meta device: running the graph on real inputs is
    # refused until its weights hold values (Note [Runs with unbound weights]).
    if graph.has_meta_attributes():
        gm.register_forward_pre_hook(_refuse_unbound_weights)
    return gm


# Note [Attributes attached on first use]
# A traced module's attributes are the trace's tensors, each in the plain
# module of its dotted prefix, as torch.fx's constructor places them (Note
# [The traced module's attributes] in module.cpp). Making those modules was
# a large share of a trace's overhead (and a collection walked them
# afterwards), and a module traced to be saved or
# run in C++ never needs them. So a traced module starts without its
# `_parameters`, `_buffers` and `_modules`: nearly everything nn.Module does
# reads them as attributes (named_parameters, state_dict, to, the generated
# forward's self.layer1), which reaches the class's __getattr__ since they
# are not in the instance's __dict__, and it attaches the tensors first.
# nn.Module's __setattr__, register_buffer and register_parameter read the
# instance's __dict__ directly, so the class's own attach them first too
# (_ATTACHING_METHODS). Once they are attached and the graph made (Note
# [Graph made on first use]), these leave the class. Saving and
# pickling an unattached module read the tensors from the C++ graph, which
# holds the same ones.
_ATTRIBUTE_CONTAINERS = ("_parameters", "_buffers", "_modules")


def _attach_attributes(gm):
    """Attaches the traced tensors if not yet; under _FIRST_USE_LOCK."""
    d = gm.__dict__
    if not d.get("_torchcap_unattached", False):
        return
    # Made in a module of their own, then given to gm with the rest of its
    # __dict__ in one step: a thread reading gm's attributes without
    # reaching __getattr__ sees them all or none (Note [First use from
    # several threads] in _load.py). The module's own parameters and buffers
    # (the same objects), except buffers the program wrote, of which the
    # graph keeps the values from before the trace (the trace ran the
    # program, which updated the module's own).
    holder = _new_module()
    listed = d["_torchcap_graph"].attach_attributes(holder, _new_module)
    # In the order of a module made with them (vars(gm) as torch.fx makes it).
    attached = {}
    for key, value in vars(holder).items():
        if key in _ATTRIBUTE_CONTAINERS:
            attached[key] = value
        elif key in d:
            attached[key] = d[key]
    attached.update((k, v) for k, v in d.items() if k not in attached)
    del attached["_torchcap_unattached"]
    attached["_torchcap_attributes"] = listed
    object.__setattr__(gm, "__dict__", attached)
    _settle(gm)


def _settle(gm):
    """Removes the class's lazy methods once nothing is left to make."""
    d, cls = gm.__dict__, type(gm)
    if "_torchcap_unattached" in d:
        return
    for name, method in _ATTACHING_METHODS.items():
        if cls.__dict__.get(name) is method:
            delattr(cls, name)
    if "_torchcap_build_graph" not in d and cls.__dict__.get("__getattr__") is _getattr_of_traced:
        del cls.__getattr__


def _current_tensors(gm):
    """(name, tensor) of each of a traced module's attributes, as it holds them now."""
    graph = gm._torchcap_graph
    if gm.__dict__.get("_torchcap_unattached", False):
        return [(name, t) for name, _, t in graph.attributes()]
    return [(name, _attribute(gm, name)) for name, _, _ in graph.attributes()]


def _new_graph_module(checked):
    """torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph(),
    class_name="TorchcapGraphModule"), without generating and compiling the
    code of that empty graph, which its graph setter does (time every trace
    would pay; the traced graph replaces it, Note [Graph made on first use]).

    That compile also sets what calling the module runs, once per class (each
    GraphModule has a class of its own): `_wrapped_call`, kept across
    recompiles, and `__call__`, which calls it. They are set here as it sets
    them; `checked`: with _CheckedCall around the wrapped call.
    """
    gm = torch.fx.GraphModule.__new__(torch.fx.GraphModule)
    cls = type(gm)
    cls.recompile = lambda self: None
    try:
        gm.__init__(torch.nn.Module(), torch.fx.Graph(), class_name="TorchcapGraphModule")
    finally:
        del cls.recompile
    cls._wrapped_call = _WrappedCall(cls, None)
    if checked:
        cls._wrapped_call = _CheckedCall(cls._wrapped_call)
    cls.__call__ = _call_wrapped
    return gm


def _call_wrapped(self, *args, **kwargs):
    return self._wrapped_call(self, *args, **kwargs)


def _set_graph_built_later(gm, build):
    """gm.graph = build(), called when gm's graph is first needed.

    Note [Graph made on first use]: making the torch.fx nodes of a traced
    graph costs about as much as the trace itself, and a program traced to
    be saved (torchcap.save writes the C++ graph) or run by the C++ side never needs them. So the module holds
    no graph until something asks for one: gm.graph, gm.code, print(gm),
    or the first call. Every one of these reads `self._graph`, which is not
    in the instance's __dict__ until then, so the lookup reaches the class's
    __getattr__ (nn.Module's fallback), which makes the graph. Deep copies
    and pickles are made from the C++ graph (Note [Pickling a traced
    module]) and need none. `gm` must be of its own class, as every
    GraphModule is (torch.fx makes one per instance).
    """
    gm.__dict__.pop("_graph", None)
    gm.__dict__["_torchcap_build_graph"] = build
    cls = type(gm)
    for name, value in _traced_class_attributes().items():
        setattr(cls, name, value)


def _traced_class_attributes():
    """What _set_graph_built_later sets on a traced module's class."""
    attributes = {"__getattr__": _getattr_of_traced, **_ATTACHING_METHODS,
                  "__deepcopy__": _deepcopy_traced(torch.fx.GraphModule.__deepcopy__),
                  "__reduce__": _reduce_traced,
                  "forward": _forward_after_generating_code,
                  "_code": property(_generated_code, _set_generated_code)}
    for name in ("__reduce_package__", "__reduce_deploy__"):
        attributes[name] = _after_making_code(getattr(torch.fx.GraphModule, name))
    return attributes


def _traced_module_maker():
    """A function (checked, build) that makes what _new_graph_module(checked)
    and then _set_graph_built_later(gm, build) make, in less time.

    Right after the program ran (its arithmetic had taken the caches), those
    two took several times as long as run in a loop: a class statement,
    then ten assignments to the class, each of which makes Python update it
    (and for a special method, its slots), and GraphModule.__init__, which
    makes a module and a graph only to drop them. The class torch.fx makes is
    a subclass of GraphModule with nothing of its own, so one type() call
    with all of its attributes makes the same class; the module's __dict__
    is a new module's with GraphModule's fields. Both are compared with the
    slow way's at import, and if this torch makes them otherwise (another
    field, another class), the slow way it is.
    """
    def slow(checked, build):
        gm = _new_graph_module(checked)
        _set_graph_built_later(gm, build)
        return gm

    reference = slow(True, None)
    cls = type(reference)
    # Named as GraphModule.__new__ names it (which it reads back to find
    # the base class), then renamed by __init__.
    shared = dict(_traced_class_attributes(), __call__=_call_wrapped,
                  __module__=cls.__module__, __qualname__=cls.__qualname__)
    new_module = _new_module

    def fast(checked, build):
        cls = type("TorchcapGraphModule", (torch.fx.GraphModule,), dict(shared))
        call = _WrappedCall(cls, None)
        cls._wrapped_call = _CheckedCall(call) if checked else call
        gm = new_module()
        gm.__class__ = cls
        gm.__dict__.update(_tracer_cls=None, _tracer_extras={}, meta={},
                           _torchcap_build_graph=build)
        return gm

    def same(made, expected):
        if made.keys() != expected.keys():
            return False
        for key, value in expected.items():
            if type(made[key]) is not type(value):
                return False
            if (value is None or type(value) in (bool, str, dict, set, collections.OrderedDict)) \
                    and made[key] != value:
                return False
        return True

    made = fast(True, None)
    if (type(made).__bases__ != cls.__bases__ or type(made).__name__ != cls.__name__ or
            not same(vars(made), vars(reference)) or not same(vars(type(made)), vars(cls))):
        return slow
    return fast


def _getattr_of_traced(self, name):
    # Note [First use from several threads] in _load.py.
    with _FIRST_USE_LOCK:
        _attach_attributes(self)
        if name == "_graph" and "_torchcap_build_graph" in self.__dict__:
            _set_graph_generating_code_later(self, self.__dict__["_torchcap_build_graph"]())
            del self.__dict__["_torchcap_build_graph"]
            _settle(self)
        if name in self.__dict__:
            return self.__dict__[name]
    return torch.nn.Module.__getattr__(self, name)


def _attaching_first(method):
    """nn.Module's `method`, which reads the module's __dict__ directly,
    after attaching the traced tensors (Note [Attributes attached on first use])."""
    def attaching(self, *args, **kwargs):
        with _FIRST_USE_LOCK:
            _attach_attributes(self)
        return method(self, *args, **kwargs)
    attaching.__name__, attaching.__qualname__ = method.__name__, method.__qualname__
    attaching.__doc__ = method.__doc__
    return attaching


# nn.Module's methods that read the containers from __dict__ itself: a
# traced module's class has them attach the tensors first, until attached.
_ATTACHING_METHODS = {name: _attaching_first(getattr(torch.nn.Module, name))
                      for name in ("__setattr__", "register_buffer", "register_parameter")}


def _after_making_code(method):
    """Pickling copies the module's __dict__, then generates its code, and
    reads the code from the copy: the code must exist before."""
    def with_code(self, *args):
        self._code  # noqa: B018 -- the graph and its code, made now if not yet
        return method(self, *args)
    return with_code


# Note [Pickling a traced module]
# pickle and torch.save make a traced module again as torchcap.trace made
# it: from its C++ graph (pickled without tensors, Note [A pickled C++
# graph] in module.cpp) and the module's current tensors, with its
# argument structure. torch.fx's own way, code re-traced by torch.fx's
# symbolic tracer, gives a module that takes no arguments. A module whose
# graph was edited since the trace has no C++ graph of its code, and the
# torch.fx way would be wrong: refused (_refuse_pickling).
_KEPT_WHEN_PICKLED = ("in_spec", "out_spec", "_torchcap_call_structure", "training",
                      "training_signature", "_torchcap_named_result", "_torchcap_inputs")


def _reduce_traced(self):
    if not _as_traced(self):
        _refuse_pickling(self)
    graph = self._torchcap_graph
    tensors = _current_tensors(self)
    checked = isinstance(type(self)._wrapped_call, _CheckedCall)
    kept = {k: self.__dict__[k] for k in _KEPT_WHEN_PICKLED if k in self.__dict__}
    return _unpickle_traced, (graph, tensors, self._torchcap_keywords, checked, kept)


def _deepcopy_traced(fx_deepcopy):
    """copy.deepcopy makes a traced module again as unpickling does, with
    copies of its tensors; an edited one (whose graph exists, since editing
    made it) is copied the torch.fx way, which copies its graph."""
    def deepcopy(self, memo):
        if not _as_traced(self):
            return fx_deepcopy(self, memo)
        make, args = _reduce_traced(self)
        return make(*copy.deepcopy(args, memo))
    return deepcopy


def _unpickle_traced(graph, tensors, keywords, checked, kept):
    gm = _to_fx(graph.with_attributes(tensors), dict.fromkeys(keywords), checked)
    gm.__dict__.update(kept)
    return gm


def _as_traced(gm):
    """Whether gm's code is the one its trace made: not generated since (the
    graph may only change through recompile(), which generates it), or the
    same as the traced graph's."""
    if type(gm).__dict__.get("forward") is _forward_after_generating_code:
        return True
    traced = _fx_graph(gm._torchcap_graph, getattr(gm, "_torchcap_keywords", ()))
    return gm.code == traced.python_code(root_module="self").src


_new_traced_module = _traced_module_maker()


def trace(f, args, kwargs=None, *, inference=False, preserve=None, allow_input_mutation=False,
          allow_data_dependent_values=False, record_stack_traces=True, meta=False):
    """Runs f(*args, **kwargs) once and returns the aten operators it ran as a torch.fx.GraphModule.

    f: an nn.Module or any callable. Its parameters and buffers (those of the
    module, or of the module a bound method belongs to) become get_attr nodes
    by qualified name; other tensors it reads are lifted as _tensor_constantN.
    args, kwargs: pytrees (tuples, lists, dicts) of tensors and scalars;
    tensors become placeholders, scalars are specialised. The result takes
    the same arguments and returns the same structure as f.

    inference: run under torch.inference_mode, where `preserve` operators
    (default aten::linear, aten::layer_norm) are recorded whole.
    allow_input_mutation: let f write to its inputs (on copies during the
    trace; the graph records the writes). allow_data_dependent_values: let f
    read tensor values into Python (.item(), `if t.sum() > 0`), baking them in.
    record_stack_traces: node.meta["stack_trace"] with f's Python frames and
    node.meta["nn_module_stack"].
    meta: meta mode. f computes on meta tensors (shapes, no data) and no
    kernel computes anything, so tracing costs little time and memory; the
    graph is the one a real trace records, attributes included (the
    module's real tensors). args may hold meta tensors (device="meta"),
    which stand for CPU tensors; f sees tensors on the devices the real
    program would use. Operators without a meta kernel, and those whose
    result depends on values (.item(), nonzero), raise TraceError.

    Raises TraceError when the program cannot be traced; exceptions f raises
    propagate unchanged.
    """
    return _capture(f, args, kwargs, False, inference, preserve, allow_input_mutation,
                    allow_data_dependent_values, record_stack_traces, meta)


def export(f, args, kwargs=None, *, inference=False, preserve=None,
           allow_data_dependent_values=False, record_stack_traces=True, meta=False):
    """trace, then dead-code elimination and a functionalizing re-trace.

    The graph has no in-place or view operators. Writes the program makes to
    its buffers (BatchNorm's running statistics in train mode) and inputs are
    extra outputs of the graph, written back when the module runs, so calling
    the result has the program's effect. meta: as for trace.
    """
    return _capture(f, args, kwargs, True, inference, preserve, True,
                    allow_data_dependent_values, record_stack_traces, meta)


def dispatch_trace(f, args):
    """Upstream's dispatch_trace: export(f, args), with the inputs immutable to
    out= arguments as upstream's tracer has them (writes of in-place operators
    to inputs are exported; `torch.add(a, b, out=a)` with `a` an input is a
    TraceError, as in torchcap.trace)."""
    return _capture(f, args, None, True, False, None, True, False, True,
                    refuse_out_into_inputs=True)


def save(gm, path):
    """Writes a graph to a `.tcg` file, which torchcap::load (C++) and
    torchcap.load read.

    gm: a GraphModule made by torchcap.trace or torchcap.export, saved with
    its arguments and results as traced and the module's current tensors; or
    another torch.fx.GraphModule of aten operators (make_fx's), saved with
    flat arguments and a tuple of results. Raises torchcap.Error naming what
    cannot be stored.
    """
    _require_C()
    path = os.fspath(path)
    graph = getattr(gm, "_torchcap_graph", None)
    if graph is not None and _as_traced(gm):
        graph.save(path, _current_tensors(gm))
        return
    _C.save_fx(*_describe_fx(gm), path)


def _attribute(gm, name):
    owner_path, _, leaf = name.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    t = getattr(owner, leaf, None)
    if not isinstance(t, torch.Tensor):
        raise Error(f"torchcap.save: attribute '{name}' is not a tensor")
    return t


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
