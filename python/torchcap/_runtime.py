"""What a module torchcap made does when it runs, whichever way it was made
(traced, exported, a training step, loaded from a file): its code generated
on first use (the code itself is _codegen.py's), the check of each call's
inputs against the graph's and of their structure against the traced
call's, and the pause of Python's cyclic collector while many objects are
made.
"""

import collections
import contextlib
import gc
import threading
import warnings

import torch
import torch.fx
import torch.utils._pytree as pytree

from torchcap._codegen import TorchcapCodeGen, _spec_flatten, _spec_unflatten
from torchcap._errors import Error, InputError, WeightError


def _set_graph_generating_code_later(gm, graph):
    """gm.graph = graph, with forward() generated and compiled when first needed.

    Note [Code generated on first use]: torch.fx generates a module's Python
    code and compiles it whenever its graph is set, which for a big graph
    takes longer than reading the file (a large part of torchcap.load on a
    long chain). Loading defers it, as later torch.fx does
    (_LazyGraphModule): the first call of the module, or the first look at its
    code (gm.code, print(gm)), generates it; gm.recompile() after editing the
    graph works as always. `gm` must be of its own class, as every
    GraphModule is (torch.fx makes one per instance), since the class's
    forward and _code are replaced until then.
    """
    cls = type(gm)
    # What GraphModule's graph setter does, but generating the code: through
    # __dict__, which a traced module's own __setattr__ would first attach
    # its attributes to (Note [Attributes attached on first use] in _bridge.py).
    assert isinstance(graph, torch.fx.Graph)
    gm.__dict__["_graph"] = graph
    graph.owning_module = gm
    if not _runs_cpp_graph(cls):  # that forward stays until recompile()
        cls.forward = _forward_after_generating_code
    cls._code = property(_generated_code, _set_generated_code)
    gm.__dict__.pop("_code", None)  # an empty graph's, from GraphModule.__init__
    if "__reduce__" not in cls.__dict__:  # a traced module has its own
        cls.__reduce__ = _refuse_pickling


def _refuse_pickling(self):
    """torch.fx pickles a module as its code and rebuilds it by tracing that
    code symbolically, which gives a module of torchcap's code that takes no
    arguments: refused here rather than made wrong."""
    raise Error("this torch.fx module, edited since torchcap made it (or loaded without "
                "torchcap's compiled part), cannot be pickled: torch.fx would rebuild it from its code without the "
                "arguments it takes. Save it with torchcap.save and read it with torchcap.load")


# Note [First use from several threads]
# What a module makes on first use (its code here; a traced module's graph
# and attribute submodules, Note [Graph made on first use] in _bridge.py)
# is made under this lock, and the code made once: threads calling a new
# module at once would otherwise each generate it, replacing the class's
# forward and graph under one another (wrong code, unbound locals, runaway
# recursion). Reentrant: making the code makes the graph, which sets it.
_FIRST_USE_LOCK = threading.RLock()


def _forward_after_generating_code(self, *args, **kwargs):
    with _FIRST_USE_LOCK:
        if type(self).__dict__.get("forward") is _forward_after_generating_code:
            self.recompile()  # replaces forward
    return self.forward(*args, **kwargs)


# The source is kept in the instance's __dict__ under torch.fx's own key,
# where pickling a GraphModule looks for it (the property, a data
# descriptor, takes precedence over that entry for attribute lookups).
def _generated_code(self):
    with _FIRST_USE_LOCK:
        if "_code" not in self.__dict__:
            if _runs_cpp_graph(type(self)):
                # Shown, not compiled: calls run the C++ graph until
                # recompile() (Note [Calls run from the C++ graph] in
                # src/python/runner.cpp).
                self.__dict__["_code"] = self.graph.python_code(root_module="self").src
            else:
                self.recompile()
        return self.__dict__["_code"]


def _runs_cpp_graph(cls):
    """Whether a module class's forward runs its C++ graph (_bridge.py)."""
    return getattr(cls.__dict__.get("forward"), "_torchcap_runs_cpp", False)


def _set_generated_code(self, src):
    self.__dict__["_code"] = src


_SHORT_DTYPE_NAMES = {
    "float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64",
    "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "b8",
    "complex32": "c32", "complex64": "c64", "complex128": "c128"}


def _describe(t):
    """f32[16, 8]; the device only when it is known and neither the CPU nor meta."""
    name = str(t.dtype).replace("torch.", "")
    sizes = ", ".join("?" if s is None else str(s) for s in t.shape)  # ?: a dynamic size
    text = f"{_SHORT_DTYPE_NAMES.get(name, name)}[{sizes}]"
    device = t.device
    return text if device is None or device.type in ("cpu", "meta") else f"{text}@{device}"


# Note [Inputs of the traced shapes]
# A graph holds the shapes its trace saw: a view to [2, -1] stays a view to
# [2, -1] whatever the input. Called on inputs of other shapes, such a graph
# computes something else without a word (a [5, 3, 4] input viewed as
# [2, 30]). The C++ Interpreter refuses inputs whose dtype, shape or device
# differ from the placeholders' (InputError); the Python modules torchcap
# makes (traced, exported, loaded) refuse them the same way. A placeholder
# recorded on the meta device takes an input on any device (a model traced
# on meta tensors, then bound to weights), and a meta input goes anywhere.
# What is no tensor at all (None, a NumPy array, a Python number) is refused
# too: an operator would fail on it with an error of its own, or compute
# with a number in place of the tensor. Messages name each input as the C++
# Interpreter does, "input 1 (ph_1)", and for a traced module where the
# call passed it, "input 1 (ph_1, kwargs['scale'])". The check runs on every
# call: the usual case is one pass over the inputs, building nothing; the
# message is made only when something is wrong.
class _InputMeta(collections.namedtuple("_InputMeta", "dtype shape device stride written")):
    """What a graph input was traced with; device None: not recorded (files).
    stride: the traced strides when they are dense, else None; written:
    whether the graph writes the input (Note [Inputs in the traced layout]
    in src/runtime/interpreter.cpp)."""

    @staticmethod
    def of(t, written=False):
        return _InputMeta(t.dtype, tuple(t.shape), t.device,
                          t.stride() if t.layout == torch.strided and _dense(t) else None, written)


_InputMeta.__new__.__defaults__ = (None, False)


def _fits_sizes(shape, want):
    """Whether `shape` has the rank of `want` and its sizes where `want`
    has one (None: a dynamic size, checked by the graph's check_sizes)."""
    return len(shape) == len(want) and all(w is None or s == w for s, w in zip(shape, want))

# A tensor input whose dtype and shape the file does not record.
_ANY_TENSOR = _InputMeta(None, None, None)


def _check_inputs(expected, leaves, labels=None, module=None):
    """InputError unless each of `leaves` is a tensor that matches its
    `expected` _InputMeta (None: not a tensor input; _ANY_TENSOR: any tensor).
    labels(module): each tensor input's name, for the message.
    Note [Inputs of the traced shapes].

    Returns None, or `leaves` as a list with each input of other strides than
    traced copied into the traced layout (Note [Inputs in the traced layout]
    in src/runtime/interpreter.cpp); an input the graph writes must come in
    that layout."""
    if torch._C._is_tracing():
        # TorchScript's tracer records the sizes read here and warns at each
        # comparison of them; the check is the module's, not the program's.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return _check_inputs_now(expected, leaves, labels, module)
    return _check_inputs_now(expected, leaves, labels, module)


def _check_inputs_now(expected, leaves, labels, module):
    relaid = None
    for i, (want, got) in enumerate(zip(expected, leaves)):
        if want is None:
            continue
        # _fits_input, inlined: this runs on every call.
        if isinstance(got, torch.Tensor):
            if want.dtype is None:
                continue
            if got.dtype == want.dtype and (got.shape == want.shape or
                                            (None in want.shape and _fits_sizes(got.shape, want.shape))):
                device = want.device
                if device is None or got.device == device or device.type == "meta" or got.is_meta:
                    stride = want.stride
                    if stride is None or got.stride() == stride or _has_layout(got, stride):
                        continue
                    if want.written:
                        _refuse_layout(expected, i, got, labels(module) if labels else None)
                    if relaid is None:
                        relaid = list(leaves)
                    relaid[i] = torch.empty_strided(got.shape, stride, dtype=got.dtype,
                                                    device=got.device).copy_(got)
                    continue
        _refuse_inputs(expected, leaves, labels(module) if labels is not None else None)
    if module is not None and module.__dict__.get("_torchcap_dynamic"):
        # A dynamic graph's ranges and relations between sizes (Note
        # [Dynamic shapes by aligned traces] in src/trace/dynamic.cpp).
        module.__dict__["_torchcap_graph"].check_sizes(
            [t for t in (relaid or leaves) if isinstance(t, torch.Tensor)])
    return relaid


def _has_layout(t, stride):
    """Whether `t` has strides `stride` where they matter (dimensions of size > 1)."""
    return t.is_meta or all(a == b for a, b, s in zip(t.stride(), stride, t.shape) if s > 1)


def _refuse_layout(expected, index, got, labels):
    k = sum(1 for want in expected[:index] if want is not None)
    where = f"input {k}" + (f" ({labels[k]})" if labels is not None and k < len(labels) else "")
    raise InputError(f"{where} is written by the graph and must have the strides it was traced "
                     f"with, {list(expected[index].stride)}; got {list(got.stride())}. Pass it in "
                     f"that layout (contiguous())")


def _fits_input(want, got):
    """Whether `got` is a tensor as `want`, an _InputMeta, describes."""
    if not isinstance(got, torch.Tensor):
        return False
    if want.dtype is None:
        return True
    device = want.device
    return (got.dtype == want.dtype and
            (got.shape == want.shape or (None in want.shape and _fits_sizes(got.shape, want.shape))) and
            (device is None or got.device == device or device.type == "meta" or got.is_meta))


def _refuse_inputs(expected, leaves, labels):
    """The InputError of _check_inputs, naming every input that does not fit."""
    problems, not_tensors, k = [], False, -1
    for want, got in zip(expected, leaves):
        if want is None:
            continue
        k += 1  # the tensor inputs are numbered as the graph's placeholders
        where = f"input {k}" + (f" ({labels[k]})" if labels is not None and k < len(labels)
                                else "")
        wanted = "" if want.dtype is None else " " + _describe(want)
        if not isinstance(got, torch.Tensor):
            not_tensors = True
            problems.append(f"\n  {where}: expected a tensor{wanted}, got {_describe_value(got)}")
        elif not _fits_input(want, got):
            problems.append(f"\n  {where}: expected{wanted}, got {_describe(got)}")
    advice = ("\nA graph runs on tensors of the dtypes and shapes it was traced with; trace "
              "again for others")
    if not_tensors:
        advice += " (torch.as_tensor makes a tensor of a number or a NumPy array)"
    raise InputError("inputs do not match the graph:" + "".join(problems) + advice)


def _describe_value(v):
    """None, "a float (2.0)", "a numpy.ndarray": what was given for a tensor."""
    if v is None:
        return "None"
    kind = type(v)
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")
    article = "an" if name[0] in "aeiouAEIOU" else "a"
    if kind in (bool, int, float, complex):
        return f"{article} {name} ({v!r})"
    return f"{article} {name}"


def _placeholder_names(gm):
    """The names of a module's placeholders, in order (labels for _check_inputs)."""
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def _loaded_input_labels(gm, in_spec):
    """"c, args[1]['k']": each input's placeholder and where a call passes it,
    for a module of the pure-Python loader (in_spec: the file's), as
    _traced_input_labels says it for the others."""
    keywords = gm.__dict__.get("_torchcap_keywords", False)
    top = in_spec.children if in_spec.kind == "tuple" else [in_spec]
    paths = []

    def walk(spec, path):
        if spec.kind == "leaf":
            paths.append(path)
        elif spec.kind in ("tuple", "list", "dict"):
            keys = spec.keys if spec.kind == "dict" else range(len(spec.children))
            for key, child in zip(keys, spec.children):
                walk(child, f"{path}[{key!r}]")
    for i, child in enumerate(top):
        walk(child, "kwargs" if keywords and i == len(top) - 1 else f"args[{i}]")
    return [f"{n}, {p}" for n, p in zip(_placeholder_names(gm), paths)]


def _file_input_meta(dtype, shape, stride, written, device=None):
    """The _InputMeta of a placeholder from its recorded metadata (no
    device, unless given). A dynamic size is None, and so are its strides."""
    if stride is None:
        return _InputMeta(dtype, tuple(shape), device, None, written)
    stride = tuple(stride)
    expected = 1
    for st, size in sorted((st, s) for s, st in zip(shape, stride) if s != 1):
        if st != expected:
            stride = None
            break
        expected *= size
    return _InputMeta(dtype, tuple(shape), device, stride, written)


def _check_loaded_inputs(gm, args):
    """Forward pre-hook of a loaded module: Note [Inputs of the traced shapes].
    Arguments of another structure are left to forward, which fails on them.
    Returns the arguments with inputs in the traced layout when some were not."""
    d = gm.__dict__
    if "_graph" in d:
        codegen = d["_graph"]._codegen
        if not isinstance(codegen, TorchcapCodeGen):  # a graph set by the user since
            return None
        in_spec = codegen.in_spec
    else:  # not made yet (Note [Calls run from the C++ graph] in src/python/runner.cpp)
        in_spec = d["_torchcap_in_spec"]
    try:
        leaves = _spec_flatten(in_spec, tuple(args) if in_spec.kind == "tuple" else args[0])
    except (IndexError, KeyError, TypeError):
        return None
    relaid = _check_inputs(gm._torchcap_inputs, leaves,
                           lambda gm: _loaded_input_labels(gm, in_spec), gm)
    if relaid is None:
        return None
    value = _spec_unflatten(in_spec, list(relaid))
    return value if in_spec.kind == "tuple" else (value,)


def _dense(t):
    """Whether `t`'s strides lay its elements out without gaps or overlap."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _unbound(module):
    """'parameter 'fc.weight' (f32[4, 8])' for each attribute of a loaded module
    that holds no values."""
    out = []
    for name, kind in getattr(module, "_torchcap_attributes", ()):
        owner_path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        t = getattr(owner, leaf, None)
        if isinstance(t, torch.Tensor) and t.is_meta:
            out.append(f"{kind} '{name}' ({_describe(t)})")
    return out


def _refuse_unbound_weights(module, args):
    """A forward pre-hook of modules loaded with weightless attributes
    (Note [Runs with unbound weights] in src/runtime/interpreter.cpp): a call
    on real inputs is refused, naming them, instead of failing inside an
    operator or returning meta tensors. Calls on meta inputs only compute
    shapes and go ahead. Once every attribute holds values (given to it by
    to_empty and load_state_dict, say) the hook removes itself."""
    unbound = _unbound(module)
    if not unbound:
        for key, hook in list(module._forward_pre_hooks.items()):
            if hook is _refuse_unbound_weights:
                del module._forward_pre_hooks[key]
        return None
    leaves = pytree.tree_flatten(args)[0]
    tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
    if tensors and all(t.is_meta for t in tensors):
        return None
    shown = ", ".join(unbound[:5]) + (f" and {len(unbound) - 5} more" if len(unbound) > 5 else "")
    raise WeightError(f"the module's weights are not bound: {len(unbound)} attribute(s) hold no "
                      f"values (the module was traced on the meta device or loaded from a "
                      f"weightless file): {shown}. Bind them first: torchcap.load(path, "
                      f"weights=state_dict)")


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Note [No collections]: Python's cyclic garbage collector runs every few
    hundred new objects and, now and then, walks every live object. Loading,
    tracing and making a torch.fx graph make many objects that all stay
    alive, so those walks free nothing: they took a large share of
    torchcap.load's time on big graphs, and of torchcap.trace's on small
    operators. These run without them.

    The collector is one switch for the whole process, and pauses overlap
    when threads trace or load at once. Each pause saving and restoring the
    switch on its own let them undo one another: a pause that began while
    another held the collector off saw it off, and left it off for good
    once the other had switched it back on in between. So pauses are
    counted, under a lock: the first switches the collector off (if it was
    on) and the last switches it back on; none ends while another runs."""
    global _gc_pauses, _gc_was_enabled
    with _GC_PAUSES_LOCK:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _GC_PAUSES_LOCK:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


# The pauses of _cyclic_gc_paused under way, in every thread, and whether the
# collector was on when the first of them began.
_GC_PAUSES_LOCK = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


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
        spec = obj.__dict__.get("in_spec")  # a plain attribute: looked up, it would attach
        if spec is not None and not _fits(spec, (args, kwargs)):
            args, kwargs = _bound_as_traced(obj, spec, args, kwargs)
        inputs = obj.__dict__.get("_torchcap_inputs")
        if inputs is not None:  # Note [Inputs of the traced shapes]
            flat = spec is None or _tensors_only(args, kwargs)
            relaid = _check_inputs(inputs, args if flat else _spec_leaves(spec, (args, kwargs), []),
                                   _traced_input_labels, obj)
            if relaid is not None:  # Note [Inputs in the traced layout]
                args, kwargs = (tuple(relaid), kwargs) if flat else \
                    pytree.tree_unflatten(relaid, spec)
        if kwargs and "obj" in kwargs:
            # A program's keyword that torch.fx's _WrappedCall would take for
            # its own parameter (Note [Keywords that are no parameter names]
            # in _codegen.py): what it calls, called directly.
            result = super(self.wrapped.cls, obj).__call__(*args, **kwargs)
        else:
            result = self.wrapped(obj, *args, **kwargs)
        if obj.__dict__.get("_torchcap_named_result"):  # Note [Named tuples]
            result = _as_spec(result, obj.out_spec)
        return result


def _traced_input_labels(gm):
    """"ph_1, kwargs['scale']": each tensor input's placeholder, and where the
    traced call passed it (Note [Inputs of the traced shapes])."""
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
    # Bound by the signature of forward as made for the module: made now if
    # not yet (it is made on the first call, which this is).
    forward = type(gm).__dict__.get("forward")
    make = getattr(forward, "_torchcap_make", None)
    if make is not None:
        make(gm)
    elif forward is _forward_after_generating_code:
        with _FIRST_USE_LOCK:
            if type(gm).__dict__.get("forward") is _forward_after_generating_code:
                gm.recompile()
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
