"""What Python knows of an operator: its name, as the format and the C++
side write it ("aten::add.Tensor"; the default overload without a name,
"aten::addmm"), and which arguments it writes or its result aliases. The one
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
