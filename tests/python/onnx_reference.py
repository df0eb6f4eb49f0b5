"""A small reference evaluator of ONNX models in NumPy, for tests of
torchcap.to_onnx on machines without onnxruntime (Debian has none).

Each operator is written plainly from the ONNX operator specification
(onnx.ai/onnx/operators), in the forms of opsets 13 to 17, which torch 1.13's
exporter writes: inputs where opset 13 moved attributes to inputs (Split,
Squeeze, Unsqueeze), attributes where they stayed (ReduceMean's axes until
opset 18). It covers what the tested models use. An operator it does not
know, or an attribute value it does not implement, fails the run with
UnsupportedOperator: never skipped, never guessed.

    outputs = run(onnx.load("model.onnx"), [x])   # a list of numpy arrays
"""

import math

import numpy as np
import onnx
from onnx import numpy_helper


class UnsupportedOperator(AssertionError):
    """The model uses an operator (or a form of one) this evaluator lacks."""


MIN_OPSET, MAX_OPSET = 13, 17


def run(model, inputs):
    """The model's outputs, in order, for `inputs` (numpy arrays or tensors
    with .numpy(), in the order of the graph's inputs that are no
    initializers)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedOperator(f"opset {opset}: this evaluator implements opsets "
                                  f"{MIN_OPSET} to {MAX_OPSET}")
    graph = model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    feeds = [i for i in graph.input if i.name not in values]
    if len(feeds) != len(inputs):
        raise AssertionError(f"the model takes {len(feeds)} inputs, {len(inputs)} given")
    for info, value in zip(feeds, inputs):
        value = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        want = np_dtype(info.type.tensor_type.elem_type)
        if value.dtype != want:
            raise AssertionError(f"input {info.name}: {value.dtype}, the model takes {want}")
        values[info.name] = value
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedOperator(f"{node.domain}::{node.op_type} (node {node.name})")
        kernel = OPERATORS.get(node.op_type)
        if kernel is None:
            raise UnsupportedOperator(f"{node.op_type} (node {node.name})")
        args = [values[name] if name else None for name in node.input]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        try:
            results = kernel(*args, **attrs)
        except TypeError as e:  # an attribute the kernel does not take
            raise UnsupportedOperator(f"{node.op_type} (node {node.name}): {e}") from e
        if not isinstance(results, tuple):
            results = (results,)
        if len(results) < len([o for o in node.output if o]):
            raise UnsupportedOperator(f"{node.op_type} (node {node.name}): "
                                      f"{len(node.output)} outputs asked, {len(results)} computed")
        for name, result in zip(node.output, results):
            if name:
                values[name] = np.asarray(result)
    return [values[o.name] for o in graph.output]


def np_dtype(elem_type):
    """The numpy dtype of an ONNX TensorProto element type."""
    if hasattr(onnx.helper, "tensor_dtype_to_np_dtype"):  # onnx 1.13 on
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    return onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[elem_type]


def unsupported(op, what):
    raise UnsupportedOperator(f"{op}: {what}")


# --- Element-wise ---------------------------------------------------------------

def same_type(result, like):
    return np.asarray(result).astype(like.dtype, copy=False)


def add(a, b):
    return same_type(a + b, a)


def sub(a, b):
    return same_type(a - b, a)


def mul(a, b):
    return same_type(a * b, a)


def div(a, b):
    if np.issubdtype(a.dtype, np.integer):  # integer division truncates
        return same_type(np.trunc(a / b), a)
    return same_type(a / b, a)


def pow_(a, b):
    return same_type(np.power(a, b), a)


def sqrt(x):
    return np.sqrt(x)


def relu(x):
    return np.maximum(x, 0).astype(x.dtype)


def sigmoid(x):
    return same_type(1 / (1 + np.exp(-x)), x)


def tanh(x):
    return np.tanh(x)


def erf(x):
    return same_type(np.vectorize(math.erf, otypes=[np.float64])(x), x)


def clip(x, low=None, high=None):
    # Opset 11 on: min and max are optional inputs.
    if low is not None:
        x = np.maximum(x, low)
    if high is not None:
        x = np.minimum(x, high)
    return x


def equal(a, b):
    return np.equal(a, b)


def not_(x):
    return np.logical_not(x)


def where(condition, a, b):
    return np.where(condition, a, b)


def cast(x, to):
    return x.astype(np_dtype(to))


def identity(x):
    return x


# --- Shapes ---------------------------------------------------------------------

def constant(value=None, value_float=None, value_floats=None, value_int=None, value_ints=None):
    if value is not None:
        return numpy_helper.to_array(value)
    if value_float is not None:
        return np.array(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.array(value_floats, dtype=np.float32)
    if value_int is not None:
        return np.array(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.array(value_ints, dtype=np.int64)
    unsupported("Constant", "no value, value_float(s) or value_int(s)")


def constant_of_shape(shape, value=None):
    fill = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    return np.full(tuple(int(s) for s in shape), fill.reshape(-1)[0], dtype=fill.dtype)


def shape(x, start=0, end=None):
    return np.array(x.shape[start:end], dtype=np.int64)


def reshape(x, shape, allowzero=0):
    shape = [int(s) for s in shape]
    if not allowzero:  # 0 copies the input's size there
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def transpose(x, perm=None):
    return np.transpose(x, perm)


def expand(x, shape):
    return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(s) for s in shape))).copy()


def concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


def split(x, sizes=None, axis=0):
    # Opset 13 on: the sizes are an optional input; without it, equal parts,
    # as many as the node has outputs (which `run` does not tell a kernel, so
    # the exporter's form, with sizes, is the one implemented).
    if sizes is None:
        unsupported("Split", "without the sizes input")
    bounds = np.cumsum([int(s) for s in sizes])[:-1]
    return tuple(np.split(x, bounds, axis=axis))


def normalize_axes(axes, rank):
    return [int(a) + rank if a < 0 else int(a) for a in axes]


def unsqueeze(x, axes):
    rank = x.ndim + len(axes)
    out_shape = list(x.shape)
    for a in sorted(normalize_axes(axes, rank)):
        out_shape.insert(a, 1)
    return x.reshape(out_shape)


def squeeze(x, axes=None):
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(normalize_axes(axes, x.ndim)))


def slice_(x, starts, ends, axes=None, steps=None):
    axes = normalize_axes(axes if axes is not None else range(len(starts)), x.ndim)
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        # Python's slice clamps as the specification does, for either sign of step.
        index[axis] = slice(int(start), int(end), int(step))
    return x[tuple(index)]


def gather(x, indices, axis=0):
    indices = np.where(indices < 0, indices + x.shape[axis], indices)
    return np.take(x, indices, axis=axis)


# --- Reductions, normalization ----------------------------------------------------

def reduce_mean(x, axes=None, keepdims=1):
    axes = tuple(range(x.ndim)) if axes is None else tuple(normalize_axes(axes, x.ndim))
    return same_type(np.mean(x, axis=axes, keepdims=bool(keepdims)), x)


def softmax(x, axis=-1):
    # Opset 13 on: along one axis.
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return same_type(e / np.sum(e, axis=axis, keepdims=True), x)


def batch_normalization(x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0):
    if training_mode:
        unsupported("BatchNormalization", "training_mode=1")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
    return same_type(y * scale.reshape(shape) + bias.reshape(shape), x)


# --- Linear algebra, convolution, pooling -----------------------------------------

def matmul(a, b):
    return np.matmul(a, b)


def gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    y = alpha * np.matmul(a.T if transA else a, b.T if transB else b)
    if c is not None:
        y = y + beta * c
    return same_type(y, a)


def windows(x, kernel, strides, pads, dilations, fill):
    """x [N, C, H, W] padded (pads: top, left, bottom, right) with `fill`,
    as [N, C, out_h, out_w, kernel_h, kernel_w] windows."""
    (top, left, bottom, right) = pads
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=fill)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    view = np.lib.stride_tricks.sliding_window_view(x, span, axis=(2, 3))
    return view[:, :, ::strides[0], ::strides[1], ::dilations[0], ::dilations[1]]


def conv_attributes(op, x, kernel_shape, auto_pad, pads, strides, dilations):
    if auto_pad not in ("NOTSET", b"NOTSET"):
        unsupported(op, f"auto_pad={auto_pad}")
    if x.ndim != 4:
        unsupported(op, f"{x.ndim - 2}-D (2-D only)")
    return (list(kernel_shape), list(pads or [0, 0, 0, 0]), list(strides or [1, 1]),
            list(dilations or [1, 1]))


def conv(x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None):
    kernel, pads, strides, dilations = conv_attributes(
        "Conv", x, kernel_shape or w.shape[2:], auto_pad, pads, strides, dilations)
    n, c = x.shape[:2]
    m = w.shape[0]
    win = windows(x, kernel, strides, pads, dilations, 0)  # [N, C, oh, ow, kh, kw]
    oh, ow = win.shape[2:4]
    # Channels in `group` groups: output channel o of group g reads the
    # input channels of group g only.
    win = win.reshape(n, group, c // group, oh, ow, *kernel)
    wg = w.reshape(group, m // group, c // group, *kernel)
    y = np.einsum("ngchwij,gmcij->ngmhw", win, wg, optimize=True).reshape(n, m, oh, ow)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return same_type(y, x)


def max_pool(x, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None,
             storage_order=0, strides=None):
    if ceil_mode:
        unsupported("MaxPool", "ceil_mode=1")
    kernel, pads, strides, dilations = conv_attributes(
        "MaxPool", x, kernel_shape, auto_pad, pads, strides, dilations)
    return windows(x, kernel, strides, pads, dilations, -np.inf).max(axis=(4, 5))


def average_pool(x, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, pads=None,
                 strides=None):
    if ceil_mode:
        unsupported("AveragePool", "ceil_mode=1")
    kernel, pads, strides, dilations = conv_attributes(
        "AveragePool", x, kernel_shape, auto_pad, pads, strides, None)
    sums = windows(x, kernel, strides, pads, dilations, 0).sum(axis=(4, 5))
    if count_include_pad:
        return same_type(sums / (kernel[0] * kernel[1]), x)
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    counts = windows(ones, kernel, strides, pads, dilations, 0).sum(axis=(4, 5))
    return same_type(sums / counts, x)


OPERATORS = {
    "Add": add, "Sub": sub, "Mul": mul, "Div": div, "Pow": pow_, "Sqrt": sqrt, "Relu": relu,
    "Sigmoid": sigmoid, "Tanh": tanh, "Erf": erf, "Clip": clip, "Equal": equal, "Not": not_,
    "Where": where, "Cast": cast, "Identity": identity,
    "Constant": constant, "ConstantOfShape": constant_of_shape, "Shape": shape,
    "Reshape": reshape, "Transpose": transpose, "Expand": expand, "Concat": concat,
    "Split": split, "Unsqueeze": unsqueeze, "Squeeze": squeeze, "Slice": slice_,
    "Gather": gather,
    "ReduceMean": reduce_mean, "Softmax": softmax, "BatchNormalization": batch_normalization,
    "MatMul": matmul, "Gemm": gemm, "Conv": conv, "MaxPool": max_pool,
    "AveragePool": average_pool,
}
