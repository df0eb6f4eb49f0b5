"""The arguments some LibTorch 1.13 kernels would not survive, checked by the
Python reader at each call_function node as the C++ loader checks them
(Note [Integers kernels divide by] and Note [Kernels that trust their
arguments] in src/graph/schema_check.cpp; docs/FORMAT.md, "Arguments kernels
would not survive").
"""

import re

import torch

from torchcap._format_tables import TABLES as _TABLES

_INT64_MAX = (1 << 63) - 1
_MAX_DIMS = _TABLES["limits"]["max_tensor_dims"]


# A value of kind "none": no tensor_meta.
_NO_TENSOR_META = object()


# --- Arguments kernels trust ------------------------------------------------------

# Note [Integers kernels divide by] and Note [Kernels that trust their
# arguments] (src/graph/schema_check.cpp): some LibTorch kernels divide by an
# integer argument, read a list argument's values or make a view without
# checking them, and die of SIGFPE or SIGSEGV, which no loader can catch
# (issue 42). This loader refuses such calls by the C++ loader's rule and with
# its messages, so that a file is refused by both or by neither
# (fuzz/compare_loaders.py holds them to it). Like the schema checks, the shape
# check of the C++ loader (Note [Checking a file's shapes]) is not made here: a
# call whose arguments do not fit its inputs' shapes fails when it runs, with
# an error.
_MAX_FACTOR = 2**31 - 1
# name -> (lowest value, only in convolutions and pools)
_INT_RANGES = {
    "groups": (1, False), "group": (1, False), "num_head": (1, False), "num_heads": (1, False),
    "upscale_factor": (1, False), "downscale_factor": (1, False), "chunks": (1, False),
    "sections": (1, False), "step": (1, False), "kernel_size": (1, True), "stride": (1, True),
    "dilation": (1, True), "padding": (0, True), "output_padding": (0, True)}
# Operators whose kernels read N window values unchecked.
_EXACT_WINDOWS = {
    "aten::thnn_conv2d": 2, "aten::_slow_conv2d_forward": 2, "aten::_slow_conv2d_backward": 2,
    "aten::slow_conv3d": 3, "aten::slow_conv3d_forward": 3,
    "aten::mkldnn_reorder_conv2d_weight": 2, "aten::mkldnn_reorder_conv3d_weight": 3}
_NAMED_DIMENSIONS = re.compile(r"[A-Za-z]([123])d(?:_|$)")
_CALL_CHECKS = {}  # OpOverload -> what _check_call checks for it, or None


class _AtLeastOne:
    """The counts of a window list of an operator not named for its dimensions."""

    def __contains__(self, count):
        return count >= 1


_AT_LEAST_ONE = _AtLeastOne()


def _int_kind(t):
    """'int' or 'list' for a parameter of an int, int[] or optional type, else None."""
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    if isinstance(t, (torch.IntType, torch.SymIntType)):
        return "int"
    if isinstance(t, torch.ListType) and isinstance(t.getElementType(),
                                                    (torch.IntType, torch.SymIntType)):
        return "list"
    return None


def _mentions_tensor(t):
    if isinstance(t, torch.TensorType):
        return True
    if isinstance(t, (torch.OptionalType, torch.ListType)):
        return _mentions_tensor(t.getElementType())
    return False


def _call_checks(op):
    """What _check_call checks for calls of `op`, or None if nothing: made once."""
    try:
        return _CALL_CHECKS[op]
    except KeyError:
        pass
    schema = op._schema
    name, params = schema.name, schema.arguments
    # torchcap's own check of a number read from a tensor (Note [Guards of
    # values the program read] in src/kernels/guards.cpp) divides by nothing.
    tensors = name == "torchcap::guard_value" or any(
        _mentions_tensor(a.type) for a in params) or any(
        _mentions_tensor(r.type) for r in schema.returns)
    windows = "conv" in name or "pool" in name or any(
        a.name in ("kernel_size", "dilation", "groups") for a in params)
    exact = _EXACT_WINDOWS.get(name)
    found = [int(m.group(1)) for m in _NAMED_DIMENSIONS.finditer(name)]
    dims = exact or (found[-1] if found else 0)
    kernel_size = any(a.name == "kernel_size" for a in params)
    ints = []  # (index, name, kind, lowest or "mode", counts allowed or None, their text)
    for i, a in enumerate(params):
        kind = _int_kind(a.type)
        if kind is None:
            continue
        if a.name == "mode" and "embedding_bag" in name:
            ints.append((i, a.name, kind, "mode", None, None))
            continue
        rule = _INT_RANGES.get(a.name)
        if rule is None or (rule[1] and not windows):
            continue
        counts = text = None
        if kind == "list" and rule[1]:
            pool_stride = not exact and a.name == "stride" and kernel_size
            if not dims:
                counts, text = _AT_LEAST_ONE, "at least 1"
            elif exact:
                counts, text = {dims}, f"exactly {dims}"
            else:
                counts = {1, dims} | ({0} if pool_stride else set())
                text = ("none, 1 or " if pool_stride else "1 or ") + str(dims)
        ints.append((i, a.name, kind, rule[0], counts, text))
    trusting = name in _TRUSTING_KERNELS
    plan = None
    if not tensors or ints or trusting:
        plan = (tensors, ints, trusting, {a.name: i for i, a in enumerate(params)}, params)
    _CALL_CHECKS[op] = plan
    return plan


def _is_plain_int(v):
    return type(v) is int


def _dims_text(values):
    return "[" + ", ".join(str(v) for v in values) + "]"


def _last_offset(sizes, strides):
    """The highest element offset a view reaches (negative strides count
    nothing), or None if it has no elements or the offset passes 64 bits."""
    last = 0
    for size, stride in zip(sizes, strides):
        if size == 0:
            return None
        if stride > 0:
            last += (size - 1) * stride
    return last if last <= _INT64_MAX else None


def _check_call(op, target, args, kwargs, shape_of):
    """'' if a call of `op` passes the rule; otherwise the C++ loader's message.
    shape_of(node) is (sizes, strides) as recorded, or None."""
    plan = _call_checks(op)
    if plan is None:
        return ""
    tensors, ints, trusting, index_of, params = plan
    if not tensors:
        return (f"{target} computes on plain numbers, not tensors; graphs do not record such "
                "operators")
    given = [None] * len(params)
    present = [False] * len(params)
    for i, a in enumerate(args[:len(params)]):
        given[i], present[i] = a, True
    for k, v in kwargs.items():
        if k in index_of:
            given[index_of[k]], present[index_of[k]] = v, True
    for i, pname, kind, lowest, counts, text in ints:
        v = given[i]
        if kind == "int":
            if not _is_plain_int(v):
                continue  # none, or of a type the schema refuses (the C++ loader says so)
            values, shown = [v], str(v)
        else:
            if not isinstance(v, (list, tuple)) or not all(_is_plain_int(e) for e in v):
                continue
            values, shown = list(v), _dims_text(v)
        what = f"argument '{pname}' of {target} is {shown}"
        if lowest == "mode":
            if any(not 0 <= e <= 2 for e in values):
                return f"{what}; it must be 0 (sum), 1 (mean) or 2 (max)"
            continue
        if any(not lowest <= e <= _MAX_FACTOR for e in values):
            each = "each value must be" if kind == "list" else "it must be"
            return f"{what}; {each} between {lowest} and {_MAX_FACTOR}"
        if counts is not None and len(values) not in counts:
            n = len(values)
            return (f"argument '{pname}' of {target} has {n} value{'' if n == 1 else 's'}; "
                    f"{target} takes {text}")
    check = _TRUSTING_KERNELS.get(op._schema.name) if trusting else None
    if check is None:
        return ""
    try:
        return check(_TrustingCall(target, given, present, params, shape_of))
    except _Unrecorded as e:
        return str(e)


class _Unrecorded(Exception):
    """The file records no shape for an input a kernel's check needs (or the
    argument is of a type the schema refuses: the message is then empty, and
    the C++ loader names the type)."""


class _TrustingCall:
    """A call of one of the kernels Note [Kernels that trust their arguments]
    lists, as its check reads it."""

    def __init__(self, target, given, present, params, shape_of):
        self.op, self.given, self.present, self.params = target, given, present, params
        self.shape_of = shape_of

    def input(self, i):
        """(sizes, strides) of tensor argument i as recorded; raises _Unrecorded."""
        a = self.given[i]
        if isinstance(a, torch.fx.Node):
            recorded = self.shape_of(a)
            if recorded is not None:
                return recorded
        described = f"%{a.name}" if isinstance(a, torch.fx.Node) else "not a node"
        raise _Unrecorded(f"argument '{self.params[i].name}' of {self.op} is {described}, whose "
                          "shape the file does not record; the loader checks this operator's "
                          "arguments against it, as its kernel does not")

    def ref(self, i):
        return f"%{self.given[i].name}"

    def flag(self, i):
        v = self.given[i] if self.present[i] else self.params[i].default_value
        return v is True

    def ints(self, i):
        v = self.given[i] if self.present[i] else self.params[i].default_value
        v = list(v) if isinstance(v, (list, tuple)) else [] if v is None else [v]
        if not all(_is_plain_int(e) for e in v):
            raise _Unrecorded("")
        return v


def _check_reshape_alias(c):
    self_sizes, self_strides = c.input(0)
    sizes, strides = c.ints(1), c.ints(2)
    view = (f"{c.op} views {c.ref(0)} (sizes {_dims_text(self_sizes)}, strides "
            f"{_dims_text(self_strides)}) with sizes {_dims_text(sizes)} and strides "
            f"{_dims_text(strides)}")
    if len(sizes) != len(strides):
        return view + ": one stride per size is needed"
    numel = 1
    for size, stride in zip(sizes, strides):
        if size < 0 or stride < 0:
            return view + ": they cannot be negative"
        numel *= size
        if numel > _INT64_MAX:
            return view + ": more elements than 64 bits count"
    if numel == 0:
        return ""
    reach, within = _last_offset(sizes, strides), _last_offset(self_sizes, self_strides)
    if reach is None or within is None or reach > within:
        return view + ", which reach past its elements"
    return ""


def _check_mkldnn_convolution(c):
    weight, _ = c.input(1)
    if len(weight) < 3:
        return (f"argument 'weight' of {c.op} is {c.ref(1)}, of sizes {_dims_text(weight)}; a "
                "convolution's weight has at least 3 dimensions")
    spatial = len(weight) - 2
    for i in (3, 4, 5):  # padding, stride, dilation
        n = len(c.ints(i))
        if n != spatial:
            return (f"argument '{c.params[i].name}' of {c.op} has {n} value"
                    f"{'' if n == 1 else 's'}; its weight {c.ref(1)} (sizes {_dims_text(weight)}) "
                    f"has {spatial} spatial dimensions")
    return ""


def _check_mkldnn_transpose(c):
    rank = len(c.input(0)[0])
    for i in (1, 2):
        d = c.ints(i)[0]
        if not -rank <= d < rank:
            return (f"argument '{c.params[i].name}' of {c.op} is {d}; {c.ref(0)} has {rank} "
                    "dimensions")
    return ""


def _check_channel_shuffle(c):
    sizes, _ = c.input(0)
    groups = c.ints(1)[0]
    if len(sizes) < 2 or sizes[0] == 0 or sizes[1] == 0 or sizes[1] % groups:
        return (f"argument 'groups' of {c.op} is {groups}; its kernel needs {c.ref(0)} (sizes "
                f"{_dims_text(sizes)}) to have a batch and a positive multiple of it as channels")
    return ""


def _check_unfold_backward(c):
    """The gradient of unfold(input, dim, size, step) for an input of sizes
    input_sizes: the kernel writes where that unfold would have read."""
    grad, _ = c.input(0)
    input_sizes = c.ints(1)
    dim, size, step = c.ints(2)[0], c.ints(3)[0], c.ints(4)[0]
    rank = len(input_sizes)
    expected = None  # what unfold gives (a 0-dim input unfolds as [1])
    if -max(rank, 1) <= dim < max(rank, 1) and size >= 0:
        d = 0 if rank == 0 else (dim + rank) % rank
        expected = list(input_sizes) if rank else [1]
        length = expected[d]
        expected[d] = (length - size) // step + 1 if length >= size else -1
        expected.append(size)
        if rank == 0:
            del expected[0]
    if expected is None or expected != list(grad):
        return (f"argument 'grad_in' of {c.op} is {c.ref(0)} (sizes {_dims_text(grad)}), which is "
                f"not the gradient of unfold(dimension {dim}, size {size}, step {step}) of sizes "
                f"{_dims_text(input_sizes)}; its kernel writes where that unfold would have read")
    return ""


def _check_rescale_qkv(c):
    qkv, _ = c.input(0)
    bias, _ = c.input(1)
    if len(qkv) != 3 or qkv[0] == 0 or len(bias) != 1 or bias[0] != qkv[2]:
        return (f"arguments 'qkv' and 'qkv_bias' of {c.op} are {c.ref(0)} (sizes "
                f"{_dims_text(qkv)}) and {c.ref(1)} (sizes {_dims_text(bias)}); its kernel takes "
                "[batch of at least 1, tokens, 3 * embedding] and [3 * embedding]")
    return ""


def _check_embedding_bag(c):
    """(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
    per_sample_weights, include_last_offset, ...): 2-D indices (with offsets)
    abort; in mode max, no bag at all is a SIGSEGV."""
    indices, _ = c.input(1)
    offsets, _ = c.input(2)
    bags = (offsets[0] if offsets else 0) - (1 if c.flag(7) else 0)
    if len(indices) != 1 or len(offsets) != 1 or (c.ints(4)[0] == 2 and bags < 1):
        return (f"arguments 'indices' and 'offsets' of {c.op} are {c.ref(1)} (sizes "
                f"{_dims_text(indices)}) and {c.ref(2)} (sizes {_dims_text(offsets)}); its kernel "
                "takes 1-D indices and offsets, and in mode 2 (max) at least one bag")
    return ""


# Note [Kernels that trust their arguments]: each kernel's check.
_TRUSTING_KERNELS = {
    "aten::_reshape_alias": _check_reshape_alias,
    "aten::mkldnn_convolution": _check_mkldnn_convolution,
    "aten::_mkldnn_transpose": _check_mkldnn_transpose,
    "aten::_mkldnn_transpose_": _check_mkldnn_transpose,
    "aten::native_channel_shuffle": _check_channel_shuffle,
    "aten::unfold_backward": _check_unfold_backward,
    "aten::_transform_bias_rescale_qkv": _check_rescale_qkv,
    "aten::embedding_bag": _check_embedding_bag,
    "aten::_embedding_bag": _check_embedding_bag,
    "aten::_embedding_bag_forward_only": _check_embedding_bag,
}


def _plain_dims(dims, lowest):
    """Whether `dims` is a list of at most _MAX_DIMS ints in [lowest, int64 max]."""
    if type(dims) is not list or len(dims) > _MAX_DIMS:
        return False
    for d in dims:
        if type(d) is not int or not lowest <= d <= _INT64_MAX:
            return False
    return True
