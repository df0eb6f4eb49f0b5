"""What Python knows of an operator: its name, as the format and the C++
side write it ("aten::add.Tensor"; the default overload without a name,
"aten::addmm"), the operator a name resolves to, and which arguments it
writes or its result aliases. The one
place Python reads or makes operator names or reads alias information
(src/graph/operator_name.cpp and src/graph/operator_facts.cpp are C++'s)."""

import functools

import torch


def split_operator_name(name):
    """(namespace, name, overload) of "namespace::name[.overload]", the
    overload "" for the default; None if `name` has not that form."""
    namespace, sep, rest = name.partition("::")
    if not sep or not namespace or not rest:
        return None
    op, _, overload = rest.partition(".")
    return namespace, op, overload


def resolve_operator(target):
    """(the OpOverload named `target`, None), or (None, why not) when the name
    is malformed or no such operator is registered in torch.ops."""
    parts = split_operator_name(target)
    if parts is None:
        return None, (f"'{target}' is not a qualified operator name; expected "
                      "namespace::name[.overload], e.g. aten::add.Tensor")
    ns, name, overload = parts
    op = None
    # The default overload is written without a name ("aten::addmm"), as
    # LibTorch names it; "aten::addmm.default" is not an operator name.
    if overload != "default":
        try:
            op = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
        except (AttributeError, RuntimeError):
            pass
    # getattr also finds Python attributes of the packet (__call__, ...).
    if isinstance(op, torch._ops.OpOverload):
        return op, None
    if ns == "torchvision" and _import_torchvision():
        return resolve_operator(target)
    if ns in ("aten", "prim", "prims"):
        return None, f"call_function: no operator {target} is registered"
    if ns == "torchcap":
        # Note [torchcap's packed convolution] in src/kernels/onednn.h, Note
        # [Guards of values the program read] in src/kernels/guards.cpp
        return None, (f"call_function: {target} is one of torchcap's own operators (a graph "
                      "optimized for inference, or a check of a value the traced program "
                      "read), which its compiled part, torchcap._C, registers; this Python "
                      "reader runs without it")
    # A custom operator: registered only once its library is loaded.
    return None, (f"call_function: no operator {target} is registered in torch.ops; load the "
                  "library that defines it first: torch.ops.load_library(path), or import the "
                  "Python package that registers it (import torchvision for torchvision:: "
                  "operators)")


_TORCHVISION_IMPORTED = []


def _import_torchvision():
    """Note [Operator libraries found by their namespace] (include/torchcap/
    library.h): torchvision's operators are registered by importing it.
    Whether this call imported it now (once; False when it is not installed)."""
    if _TORCHVISION_IMPORTED:
        return False
    _TORCHVISION_IMPORTED.append(True)
    try:
        import torchvision  # noqa: F401 -- registers torch.ops.torchvision
    except ImportError:
        return False
    return True


def operator_name(op):
    """The qualified name of an operator given as torch.ops.aten.linear(.default),
    "aten::linear" or "linear" (an aten operator)."""
    if isinstance(op, torch._ops.OpOverload):
        schema = op._schema
        return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name
    op = str(op)
    return op if split_operator_name(op) is not None else "aten::" + op


@functools.lru_cache(maxsize=None)
def memory_effects(op):
    """(written, aliased) of an OpOverload: the names of the arguments it
    writes in place, and the name of the argument whose memory its first
    result is (a view, or a write returned), or None."""
    schema = op._schema
    written = tuple(a.name for a in schema.arguments
                    if a.alias_info is not None and a.alias_info.is_write)
    aliased = None
    if schema.returns and schema.returns[0].alias_info is not None:
        sets = schema.returns[0].alias_info.before_set
        aliased = next((a.name for a in schema.arguments
                        if a.alias_info is not None and a.alias_info.before_set == sets), None)
    return written, aliased
