"""Operator names, as the format and the C++ side write them
("aten::add.Tensor"; the default overload without a name, "aten::addmm"):
the one place Python reads or makes them (src/graph/operator_name.cpp is
C++'s)."""

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
