"""The one bridge from a C++ graph (torchcap._C.GraphModule) to a
torch.fx.GraphModule, for traced, exported, training-step and loaded modules
alike: the torch.fx graph built in C++ when first needed (Note [Graph made on
first use]), the attributes attached when first needed (Note [Attributes
attached on first use]), pickling and copying from the C++ graph (Note
[Pickling a traced module]).
"""

import collections
import copy

import torch
import torch.nn
import torch.utils._pytree as pytree
from torch.fx.graph_module import _WrappedCall

from torchcap._errors import Error
from torchcap._codegen import (TorchcapCodeGen, _KeywordCodeGen, _Spec, _set_output_val,
                               _spec_unflatten)
from torchcap._runtime import (_ANY_TENSOR, _FIRST_USE_LOCK, _CheckedCall, _call_structure,
                               _cyclic_gc_paused, _file_input_meta,
                               _forward_after_generating_code, _generated_code,
                               _refuse_pickling, _refuse_unbound_weights, _runs_cpp_graph,
                               _set_generated_code, _set_graph_generating_code_later)


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
    torch.fx graph directly] in src/python/fx_bridge.cpp). direct=False: every
    node made by Graph.create_node (Note [Creating torch.fx nodes directly]).
    """
    fx_graph = torch.fx.Graph()
    with _cyclic_gc_paused():  # Note [No collections] in _runtime.py
        in_spec, out_spec, mutations, placeholders = graph.build_fx(fx_graph, _Spec, direct)
    if mutations:
        # As the loader: written inputs are passed to the output too, so that
        # the generated code keeps them bound until the writes at the end.
        output = next(iter(reversed(fx_graph.nodes)))
        written = [placeholders[t] for k, t in mutations if k == "input_mutation"]
        output.args = ((list(output.args[0]), written),)
    _set_output_val(fx_graph, mutations)
    codegen = TorchcapCodeGen(in_spec, out_spec, mutations, placeholders, graph.call_names())
    fx_graph.set_codegen(_KeywordCodeGen(codegen, keywords) if keywords else codegen)
    return fx_graph


def _to_fx(graph, checked=True):
    """A torch.fx.GraphModule of a torchcap._C.GraphModule, sharing its tensors.
    checked: calls are checked against the traced arguments' structure
    (_CheckedCall; in_spec is set on the module afterwards).

    Its torch.fx graph is made when first needed (Note [Graph made on first
    use]) and its forward() generated and compiled when first needed after
    that (Note [Code generated on first use] in _runtime.py).
    """
    # Note [Calling convention] in src/graph/call_convention.cpp
    keywords = graph.call_keywords()
    gm = _new_traced_module(checked, lambda: _fx_graph(graph, keywords))
    # The traced tensors become the module's attributes when first needed
    # (Note [Attributes attached on first use]).
    d = gm.__dict__
    for container in _ATTRIBUTE_CONTAINERS:
        del d[container]
    d.update(_torchcap_unattached=True, _torchcap_graph=graph, _torchcap_keywords=keywords,
             _torchcap_dynamic=graph.is_dynamic())
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
    # several threads] in _runtime.py). The module's own parameters and buffers
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
                  "forward": _FORWARD_ON_FIRST_USE, "train": _train,
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
    # Note [First use from several threads] in _runtime.py.
    with _FIRST_USE_LOCK:
        if name == "_graph" and "_torchcap_build_graph" in self.__dict__:
            # The graph needs no attributes (its get_attr nodes name them).
            _set_graph_generating_code_later(self, self.__dict__["_torchcap_build_graph"]())
            del self.__dict__["_torchcap_build_graph"]
            _settle(self)
            return self.__dict__["_graph"]
        _attach_attributes(self)
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
    return _unpickle_traced, (graph, tensors, checked, kept)


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


def _unpickle_traced(graph, tensors, checked, kept):
    gm = _to_fx(graph.with_attributes(tensors), checked)
    gm.__dict__.update(kept)
    return gm


def _to_fx_of_file(graph):
    """The torch.fx module of a C++ module read from a file (Note [One bridge
    to torch.fx] in _load.py): as a trace's, each call checked against the
    argument structure the file records (its input spec and calling
    convention: Note [Calling convention] in src/graph/call_convention.cpp)
    and its inputs against the placeholders' recorded metadata (Note
    [Inputs of the traced shapes] in _runtime.py), keyword arguments
    included."""
    gm = _to_fx(graph, checked=True)
    in_spec = graph.fx_specs(_Spec)[0]
    args, kwargs, tensor_leaves = _example_call(in_spec, graph.call_keywords())
    metas = iter(_ANY_TENSOR if meta is None else _file_input_meta(*meta, written)
                 for meta, written in zip(graph.placeholder_metas(), graph.written_inputs()))
    gm.__dict__.update(
        in_spec=pytree.tree_flatten((args, kwargs))[1],
        _torchcap_call_structure=_call_structure(args, kwargs),
        _torchcap_inputs=tuple(next(metas) if tensor else None for tensor in tensor_leaves))
    return gm


def _example_call(in_spec, keywords):
    """(args, kwargs) structured as a file's input spec says a call passes
    them (an empty tensor per tensor; constants and None as recorded), and
    for each of their pytree leaves, in order, whether it is a tensor."""
    def build(spec):
        if spec.kind == "leaf":
            return torch.empty(0)
        if spec.kind == "none":
            return None
        if spec.kind == "constant":
            return spec.value
        children = [build(c) for c in spec.children]
        if spec.kind == "dict":
            return dict(zip(spec.keys, children))
        return tuple(children) if spec.kind == "tuple" else children
    top = [build(c) for c in in_spec.children] if in_spec.kind == "tuple" else [build(in_spec)]
    args, kwargs = (tuple(top[:-1]), top[-1]) if keywords else (tuple(top), {})
    leaves = pytree.tree_flatten((args, kwargs))[0]
    return args, kwargs, [isinstance(v, torch.Tensor) for v in leaves]


def _as_traced(gm):
    """Whether gm's code is the one its trace made: not generated since (the
    graph may only change through recompile(), which generates it), or the
    same as the traced graph's."""
    forward = type(gm).__dict__.get("forward")
    if forward is _forward_after_generating_code or _runs_cpp_graph(type(gm)):
        return True
    traced = _fx_graph(gm._torchcap_graph, getattr(gm, "_torchcap_keywords", ()))
    return gm.code == traced.python_code(root_module="self").src


# --- Calls ------------------------------------------------------------------------

class _ForwardMadeOnFirstUse:
    """A traced module's forward until it is first looked up (called, or its
    signature read, as TorchScript's tracer reads it), which makes the one
    that runs the C++ graph (Note [Calls run from the C++ graph] in
    src/python/runner.cpp), with the signature of torch.fx's code."""

    _torchcap_runs_cpp = True

    def __get__(self, module, owner=None):
        if module is None:
            return self
        _make_forward(module)
        return type(module).__dict__["forward"].__get__(module, owner)

    @staticmethod
    def _torchcap_make(module):
        _make_forward(module)


_FORWARD_ON_FIRST_USE = _ForwardMadeOnFirstUse()


def _make_forward(gm):
    """Makes gm's forward if it is still to be made: the one that runs the C++
    graph, or torch.fx's (if the graph must be made first)."""
    with _FIRST_USE_LOCK:
        cls = type(gm)
        forward = cls.__dict__.get("forward")
        if forward is _FORWARD_ON_FIRST_USE:
            cls.forward = _cpp_forward(gm)
        elif forward is _forward_after_generating_code:
            gm.recompile()


# The names the code of _cpp_forward reads besides forward's parameters.
_CPP_FORWARD_NAMES = ("_torchcap_result", "_torchcap_run", "_torchcap_fx_forward")


def _cpp_forward(gm):
    """forward() of a module made from a C++ graph, with the signature of the
    code torch.fx would generate, which binds the inputs' placeholders as
    that code does and runs the graph with the interpreter, or, where that
    is declined (_run_cpp), recompiles the module and calls its torch.fx code."""
    graph = gm.__dict__["_torchcap_graph"]
    in_spec, out_spec, mutations = graph.fx_specs(_Spec)
    names = graph.placeholder_names()
    keywords = gm.__dict__.get("_torchcap_keywords", ())
    codegen = TorchcapCodeGen(in_spec, out_spec, mutations, names=graph.call_names())
    if keywords:
        codegen = _KeywordCodeGen(codegen, keywords)
    head = codegen.gen_fn_def(["self"] + names, "")
    line = head.partition("\n")[0]
    params = line[line.index("(") + 1:line.rindex(")")].split(", ")[1:]
    if any(n in _CPP_FORWARD_NAMES for n in list(params) + list(names)):
        gm.recompile()  # names the code below would hide
        return type(gm).forward
    arguments, keyword_only = [], False
    for p in params:
        if p == "/":
            continue
        if p == "*":
            keyword_only = True
        elif p.startswith("**"):
            arguments.append(p)
        else:
            arguments.append(f"{p}={p}" if keyword_only else p)
    source = (f"{head}\n"
              f"    _torchcap_result = _torchcap_run(self, [{', '.join(names)}])\n"
              f"    if _torchcap_result is not _torchcap_run:\n"
              f"        return _torchcap_result\n"
              f"    return _torchcap_fx_forward(self)({', '.join(arguments)})\n")
    try:
        runner = graph.runner()
    except Error:
        runner = None  # the interpreter cannot run it: torch.fx's code will

    def run(module, leaves):
        # Attributes attached may since have been replaced (.to(), assignment),
        # and a graph made may since have been edited: torch.fx's code, made
        # now, runs what the module holds.
        d = module.__dict__
        if runner is None or "_torchcap_unattached" not in d or "_graph" in d or \
                torch._C._is_torch_function_mode_enabled():
            return run
        flat = runner.run(leaves)
        return run if flat is None else _spec_unflatten(out_spec, flat)

    namespace = {"_torchcap_run": run, "_torchcap_fx_forward": _fx_forward}
    exec(compile(source, "<torchcap forward>", "exec"), namespace)  # noqa: S102 -- made above
    forward = namespace["forward"]
    forward._torchcap_runs_cpp = True
    return forward


def _fx_forward(gm):
    """gm's torch.fx forward, compiled now if it runs the C++ graph: a call
    the interpreter declined, or any call once its attributes were attached
    or its graph made."""
    with _FIRST_USE_LOCK:
        if _runs_cpp_graph(type(gm)):
            gm.recompile()
    return gm.forward


def _train(self, mode=True):
    """nn.Module.train, without attaching the attributes to set their
    holders' flags (Note [Attributes attached on first use]): a module not
    yet attached has none, and `training` changes nothing a graph computes."""
    if not self.__dict__.get("_torchcap_unattached", False):
        return torch.nn.Module.train(self, mode)
    if not isinstance(mode, bool):
        raise ValueError("training mode is expected to be boolean")
    self.__dict__["training"] = mode
    return self


_new_traced_module = _traced_module_maker()


def _attribute(gm, name):
    owner_path, _, leaf = name.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    t = getattr(owner, leaf, None)
    if not isinstance(t, torch.Tensor):
        raise Error(f"torchcap.save: attribute '{name}' is not a tensor")
    return t
