"""The check that a file agrees with itself, for the reader without the
compiled part: the same check, in the same order and with the same messages,
as the C++ loader's (Note [Checking a file's shapes] in
src/serialize/shapes.cpp), which torchcap.load runs when torchcap._C is there.

Each operator node runs on meta tensors (no memory, no data) made from the
recorded metadata of its inputs; a kernel's error, a result whose kind, dtype
or sizes differ from what the node records, a view past the memory it views,
and a mutation output of another dtype or shape than its target's are each a
problem of the file, at its node. Where a kernel cannot run on meta tensors
(no meta kernel, an input of unknown shape, a factory that takes no device or
makes a sparse tensor), the node's recorded value stands for it.
"""

import operator

import torch

# A node's recorded value is (kind, [(dtype, sizes, strides, device), ...]):
# kind one of the format's value kinds ("tensor", "tuple", "list", "none"),
# device as the file names it ("cpu").


def _meta_tensor(dtype, sizes, strides):
    return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")


def _recorded_value(recorded):
    """The recorded value as meta tensors, or None where there is none (or it
    describes no tensor LibTorch can make)."""
    if recorded is None:
        return None
    kind, metas = recorded
    try:
        tensors = [_meta_tensor(dtype, sizes, strides) for dtype, sizes, strides, _ in metas]
    except (RuntimeError, TypeError):
        return None
    if kind == "tensor":
        return tensors[0]
    if kind == "tuple":
        return tuple(tensors)
    if kind == "list":
        return tensors
    return None


_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
          "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
          "bool": "b8", "complex32": "c32", "complex64": "c64", "complex128": "c128"}


def _tensor_str(dtype, sizes, device):
    """TensorMeta::str(): f32[2, 3], with @device off the CPU."""
    name = str(dtype).replace("torch.", "")
    text = f"{_SHORT.get(name, name)}[{', '.join(str(s) for s in sizes)}]"
    return text if device == "cpu" else f"{text}@{device}"


def _value_str(kind, metas):
    """ValueMeta::str()."""
    if kind == "none":
        return "None"
    if kind == "tensor":
        return _tensor_str(*metas[0])
    inner = ", ".join(_tensor_str(*m) for m in metas)
    if kind == "tuple":
        return f"({inner},)" if len(metas) == 1 else f"({inner})"
    return f"[{inner}]"


def _check_view(t):
    """Empty if every element `t` views lies inside its storage; otherwise why not."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.numel() == 0:
        return ""
    lowest = highest = t.storage_offset()
    for size, stride in zip(t.shape, t.stride()):
        if stride < 0:
            lowest += (size - 1) * stride
        else:
            highest += (size - 1) * stride
    nbytes = t.storage().nbytes()
    if lowest >= 0 and (highest + 1) * t.element_size() <= nbytes:
        return ""
    sizes = _tensor_str(t.dtype, t.shape, "cpu")
    strides = "[" + ", ".join(str(s) for s in t.stride()) + "]"
    return (f"gives a view of sizes {sizes} with strides {strides} and offset "
            f"{t.storage_offset()}, which reaches past the {nbytes} bytes of memory it views")


def _result_value(schema, result):
    """(kind, [(dtype, sizes)]) of what a kernel returned, as result_meta in
    src/graph/evaluator.cpp computes it; None: unknown (a scalar result)."""
    returns = schema.returns
    if not returns:
        return ("none", [])
    if len(returns) == 1:
        if isinstance(result, torch.Tensor):
            return ("tensor", [(result.dtype, tuple(result.shape))])
        if isinstance(result, (list, tuple)) and isinstance(returns[0].type, torch.ListType):
            if all(isinstance(t, torch.Tensor) for t in result):
                return ("list", [(t.dtype, tuple(t.shape)) for t in result])
        return None
    if not isinstance(result, tuple) or not all(isinstance(t, torch.Tensor) for t in result):
        return None
    return ("tuple", [(t.dtype, tuple(t.shape)) for t in result])


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum,
                       eps):
    if input.dim() < 2:
        raise RuntimeError("native_batch_norm: input must have at least 2 dimensions")
    saved = input.shape[1] if training else 0  # eval keeps no batch statistics
    return (torch.empty_like(input),
            input.new_empty((saved,)), input.new_empty((saved,)))


def _native_layer_norm(input, normalized_shape, weight, bias, eps):
    if len(normalized_shape) > input.dim():
        raise RuntimeError("native_layer_norm: normalized_shape has more dimensions than the "
                           "input")
    stat = list(input.shape)
    for d in range(input.dim() - len(normalized_shape), input.dim()):
        stat[d] = 1
    return input.new_empty(input.shape), input.new_empty(stat), input.new_empty(stat)


# Note [Meta kernels that must match the CPU kernel] (src/kernels/meta_kernels.cpp):
# torch's Python meta kernels of these give other auxiliary results than the
# CPU kernels (saved statistics), which torchcap._C replaces for the process;
# without it, the check uses these, which compute what torchcap's do.
_MATCHING_CPU = {
    torch.ops.aten.native_batch_norm.default: _native_batch_norm,
    torch.ops.aten.native_layer_norm.default: _native_layer_norm,
}


# Note [Meta kernels that disagree with the CPU's] (src/serialize/shapes.cpp):
# where the file's record stands for the result (None), or for all but the
# first result (1).
_META_TRUST = {"aten::aminmax": None, "aten::_embedding_bag": 1,
               "aten::_embedding_bag_forward_only": 1}


def _unwrap_optional(t):
    return t.getElementType() if isinstance(t, torch.OptionalType) else t


class ShapeChecker:
    """Runs the nodes of a graph the reader made on meta tensors.

    recorded: node -> its recorded value (absent: unknown); targets: operator
    node -> its target as the file names it (aten::add.Tensor); attribute_of:
    get_attr target -> its tensor or None. problem(node, what) is called with
    the first problem found, and must raise."""

    def __init__(self, graph, recorded, targets, attribute_of, problem):
        self.graph, self.recorded, self.targets = graph, recorded, targets
        self.attribute_of, self.problem = attribute_of, problem
        self.values = {}

    def run(self, mutations, output_results, num_user, placeholder_of):
        with torch.no_grad():
            for node in self.graph.nodes:
                if node.op == "output":
                    self.check_writes(node, mutations, output_results, num_user, placeholder_of)
                    return
                self.values[node] = self.value(node)

    def value(self, node):
        if node.op == "placeholder":
            return _recorded_value(self.recorded.get(node))
        if node.op == "get_attr":
            t = self.attribute_of(node.target)
            return None if t is None else _meta_tensor(t.dtype, t.shape, t.stride())
        if node.target is operator.getitem:
            source, index = self.values.get(node.args[0]), node.args[1]
            if isinstance(source, (tuple, list)) and 0 <= index < len(source):
                return source[index]
            return _recorded_value(self.recorded.get(node))
        return self.call(node)

    def call(self, node):
        op = node.target
        schema = op._schema
        recorded = self.recorded.get(node)
        known, tensors = True, False

        def input_value(a):
            nonlocal known, tensors
            if isinstance(a, torch.fx.Node):
                tensors = True
                v = self.values.get(a)
                known = known and v is not None
                return v
            if isinstance(a, (list, tuple)):
                return [input_value(e) for e in a]
            return a

        args = [input_value(a) for a in node.args]
        kwargs = {k: input_value(v) for k, v in node.kwargs.items()}
        device, strided = False, True
        for i, param in enumerate(schema.arguments):
            t = _unwrap_optional(param.type)
            if isinstance(t, torch.DeviceObjType):
                device = True
                # Factories make meta tensors: a given device, or the default
                # one when none is given, becomes the meta device.
                if i < len(args):
                    args[i] = torch.device("meta")
                else:
                    kwargs[param.name] = torch.device("meta")
            else:
                # Meta tensors are strided: a sparse or MKLDNN factory has no
                # meta kernel. (Python's schemas show a Layout parameter as an
                # int; the file's argument is a layout.)
                given = args[i] if i < len(args) else kwargs.get(param.name)
                if isinstance(given, torch.layout) and given != torch.strided:
                    strided = False
        trust = _META_TRUST.get(schema.name, 0)
        if not known or not strided or (not tensors and not device) or trust is None:
            return _recorded_value(recorded)
        try:
            result = _MATCHING_CPU.get(op, op)(*args, **kwargs)
        except NotImplementedError:
            return _recorded_value(recorded)  # no meta kernel
        except Exception as e:  # noqa: BLE001 -- a kernel's error is the file's problem
            # A node that records nothing claims nothing (a graph built by
            # hand): running it will fail, and say so, but the file does not
            # contradict itself.
            if recorded is None:
                return None
            self.problem(node, f"{self.targets[node]} fails on the recorded shapes: "
                               f"{str(e).rstrip()}")
        target = self.targets[node]
        if trust == 1:
            # The rest as recorded, for the nodes that read them.
            rest = _recorded_value(recorded)
            if not isinstance(rest, tuple) or not isinstance(result, tuple) or (
                    len(rest) != len(result)):
                return None
            result = result[:1] + rest[1:]
        for t in result if isinstance(result, (list, tuple)) else (result,):
            why = _check_view(t)
            if why:
                self.problem(node, f"{target} {why}")
        if recorded is not None and recorded[0] != "none":
            computed = _result_value(schema, result)
            kind, metas = recorded
            if computed is not None and (
                    computed[0] != kind or len(computed[1]) != len(metas)
                    or any(c != (m[0], tuple(m[1])) for c, m in zip(computed[1], metas))):
                # Shown on the recorded devices, not the meta device.
                shown = [(dtype, sizes, metas[i][3] if i < len(metas) else "cpu")
                         for i, (dtype, sizes) in enumerate(computed[1])]
                self.problem(node, f"{target} gives {_value_str(computed[0], shown)} on the "
                                   f"recorded shapes, but the file records "
                                   f"{_value_str(kind, [(m[0], m[1], m[3]) for m in metas])}")
        return result

    def check_writes(self, output, mutations, results, num_user, placeholder_of):
        """The values the output writes into buffers and inputs have their
        targets' dtype and sizes."""
        for i, (kind, target) in enumerate(mutations):
            k = num_user + i
            if k >= len(results) or not isinstance(results[k], torch.fx.Node):
                continue
            value = self.values.get(results[k])
            if not isinstance(value, torch.Tensor):
                continue
            want = None
            if kind == "buffer_mutation":
                t = self.attribute_of(target)
                if t is not None:
                    want = (t.dtype, tuple(t.shape), "meta" if t.is_meta else "cpu")
            else:
                recorded = self.recorded.get(placeholder_of(target))
                if recorded is not None and recorded[0] == "tensor":
                    dtype, sizes, _, device = recorded[1][0]
                    want = (dtype, tuple(sizes), device)
            if want is None or (value.dtype == want[0] and tuple(value.shape) == want[1]):
                continue
            written = _tensor_str(value.dtype, value.shape, want[2])
            what = "buffer '" if kind == "buffer_mutation" else "input '"
            self.problem(output, f"output {k} writes %{results[k].name} ({written} on the "
                                 f"recorded shapes) into {what}{target}' "
                                 f"({_tensor_str(*want)})")
