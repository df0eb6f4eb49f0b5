"""PyTorch's own operator sample inputs through torchcap.

For every operator in torch.testing._internal.common_methods_invocations.op_db
that has float32 CPU samples, and for each chosen sample, the program
f(*tensors) = op(sample.input, *sample.args, **sample.kwargs) (the sample's
tensors are its arguments, everything else a constant) is run eagerly, traced
by make_fx (the reference: what it traces, torchcap should), and captured four
ways:

    trace                      torchcap.trace(f, tensors)
    trace+save+load            that module through torchcap.save and torchcap.load
                               (and the file read by the reader without the
                               compiled part too, which must accept it)
    dispatch_trace             torchcap.dispatch_trace(f, tensors)
    dispatch_trace+save+load   that module through torchcap.save and torchcap.load

Each captured module is run on the sample's tensors and on fresh tensors of
the same shapes (Note [Fresh inputs]) and compared with eager on the same
tensors: results, and the inputs' values after the call (only shapes and
dtypes for operators that draw random numbers). Each (operator,
sample, mode) ends in one class:

    ok        the module computes what eager computes
    refused   a torchcap.Error whose message is a documented refusal (REFUSALS)
    error     any other exception: LibTorch's or Python's own, or a torchcap
              error that is not in REFUSALS
    wrong     the module's results (or its writes to the inputs) differ from
              eager's, or its graph records shapes other than those it computes
    crash     the worker process died or hung (Note [Workers])
    skipped   nothing to check (eager fails on the sample, or the mode needs
              one that did not succeed)

    /usr/bin/python3 op_sweep.py [--all | --samples N] [--ops NAME,...]
                                 [--jobs J] [--json FILE] [--timeout S]

Prints the counts per mode and class, the failures grouped by cause, and
every result that is not ok; exits 1 if anything is an error, wrong or a
crash (2 if the sweep itself could not run). torchcap is imported from
PYTHONPATH (e.g. PYTHONPATH=build/python).
"""

import argparse
import collections
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

MODES = ("trace", "trace+save+load", "dispatch_trace", "dispatch_trace+save+load")
# The order a worker goes through for one sample (Note [Workers]).
STAGES = ("eager", "make_fx") + MODES
CLASSES = ("ok", "refused", "error", "wrong", "crash", "skipped")
FAILING = ("error", "wrong", "crash")
SEED = 0
DEFAULT_SAMPLES = 2

# Why torchcap refuses a program on purpose: the name of the reason, the
# regular expression that identifies its message, and why it is a limit of
# capturing a run as a graph rather than a defect. Only a torchcap.Error whose
# message matches counts as refused; any other exception is an error.
REFUSALS = [
    ("value-read", r"reads a tensor's value into C\+\+",
     "a value read from a tensor into the program (.item(), allclose, a tensor as a condition) "
     "and any branch taken on it would be baked into the graph"),
    ("input-write", r"Immutable tensor `\w+` is potentially getting modified by",
     "trace without allow_input_mutation=True may not let the graph modify the caller's "
     "tensors (dispatch_trace makes such writes outputs)"),
    ("unexpressible-write", r"writes to argument '\w+' without returning it",
     "the operator writes an argument it does not return (or list elements); a graph "
     "cannot express that mutation"),
    ("mixed-results", r"returns tensors and other values together",
     "the graph format cannot express an operator whose results mix tensors and other values"),
    ("optional-tensor-list", r"returns a list of optional tensors",
     "the graph format cannot express lists of optional tensors yet"),
    ("non-tensor-output", r"among its outputs; outputs must be tensors or None",
     "the program returns numbers or strings; a graph's outputs are tensors"),
    ("data-dependent-shape",
     r"shape depends on tensor values|shape of its result depends on tensor values",
     "the size of the result depends on tensor values (nonzero, masked_select, unique); "
     "the graph would carry the trace-time size"),
    ("raw-memory", r"reads the memory of traced tensor %\w+ directly",
     "the program or a LibTorch function implemented above the dispatcher reads a traced "
     "tensor's memory directly (data_ptr, numpy, tolist); what it computes from the bytes "
     "is not recorded and would be baked in"),
    ("not-strided", r"(is|returns) a \w+ tensor; torchcap (traces|records) strided \(dense\) tensors only",
     "sparse and other non-strided tensors have no strides to record; graphs hold dense tensors"),
    ("export-metadata-write", r"export: %\w+ \([\w:.]+\) (changes the shape or strides of|replaces "
     r"the memory of|resizes %\w+ in place)",
     "an exported graph gives its inputs and buffers new values, not a new shape, strides or "
     "memory; trace with allow_input_mutation records the operator itself"),
]

# Operators whose results have no defined values (uninitialised memory):
# only their structure, shapes and dtypes are compared.
UNDEFINED_VALUES = {"empty", "empty_like", "new_empty", "new_empty_strided"}


# --- The operators and their samples ----------------------------------------

def import_op_db():
    """op_db, importable with Debian's python3-torch."""
    import types
    import unittest
    # Note [expecttest stand-in]
    # torch.testing._internal.common_utils imports `expecttest`, a pip-only
    # package Debian's python3-torch does not depend on. The sample inputs need
    # nothing of it: common_utils only subclasses expecttest.TestCase and reads
    # expecttest.ACCEPT at import. A stand-in with those two names lets op_db
    # import; the real package, when installed, is used instead.
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("expecttest")
        stand_in.TestCase = unittest.TestCase
        stand_in.ACCEPT = False
        sys.modules["expecttest"] = stand_in
    # Note [random.sample of a set]
    # cross_entropy's sample inputs call random.sample(set, 1), which Python
    # 3.11 refuses ("Population must be a sequence"); torch 1.13 predates
    # that. The same draw from the set in sorted order keeps its samples.
    import random
    sample = random.sample

    def sample_sets_sorted(population, k, **kwargs):
        if isinstance(population, (set, frozenset)):
            population = sorted(population)
        return sample(population, k, **kwargs)
    random.sample = sample_sets_sorted
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def op_key(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def operators(extra_ops=None):
    """{key: OpInfo} of the operators with float32 CPU samples, in op_db's order.

    extra_ops: a Python file whose OPS list adds OpInfo-like objects (name,
    variant_test_name, op, sample_inputs(device, dtype, requires_grad)); the
    tests of this script use it for operators that misbehave on purpose."""
    import torch
    found = {}
    for op in import_op_db():
        if torch.float32 in op.supported_dtypes("cpu"):
            found[op_key(op)] = op
    if extra_ops:
        import importlib.util
        spec = importlib.util.spec_from_file_location("op_sweep_extra_ops", extra_ops)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for op in module.OPS:
            found[op_key(op)] = op
    return found


def make_samples(op):
    """The op's float32 CPU samples, the same list in every process."""
    import random
    import torch
    torch.manual_seed(SEED)
    random.seed(SEED)
    return list(op.sample_inputs("cpu", torch.float32, requires_grad=False))


def chosen(count, how):
    """Indices of the samples to run: all, or `how` spread evenly over them."""
    if how == "all" or count <= how:
        return list(range(count))
    if how == 1:
        return [0]
    return sorted({round(i * (count - 1) / (how - 1)) for i in range(how)})


# --- Programs, inputs and comparisons ----------------------------------------

def program(op, sample):
    """(f, tensors): f(*tensors) calls op on the sample; tensors are the
    sample's distinct tensors (one argument for a tensor given twice)."""
    import torch
    tensors = []
    index = {}

    def template(v):
        if isinstance(v, torch.Tensor):
            if id(v) not in index:
                index[id(v)] = len(tensors)
                tensors.append(v)
            return ("tensor", index[id(v)])
        if type(v) in (list, tuple):
            return (type(v), [template(x) for x in v])
        if type(v) is dict:
            return (dict, {k: template(x) for k, x in v.items()})
        return ("constant", v)

    def build(t, ts):
        kind, v = t
        if kind == "tensor":
            return ts[v]
        if kind == "constant":
            return v
        if kind is dict:
            return {k: build(x, ts) for k, x in v.items()}
        return kind(build(x, ts) for x in v)

    shape = template((sample.input, tuple(sample.args), dict(sample.kwargs)))
    fn = op.op

    def f(*ts):
        first, args, kwargs = build(shape, ts)
        return fn(first, *args, **kwargs)

    return f, tensors


def describe(sample, limit=160):
    """A short description of a sample: shapes and dtypes of tensors, constants."""
    import torch

    def short(v):
        if isinstance(v, torch.Tensor):
            dtype = str(v.dtype).replace("torch.", "")
            dtype = {"float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32",
                     "bool": "b8", "complex64": "c64"}.get(dtype, dtype)
            layout = "" if v.layout == torch.strided else f" {v.layout}".replace("torch.", "")
            return f"{dtype}{list(v.shape)}{layout}"
        if type(v) in (list, tuple):
            inner = ", ".join(short(x) for x in v)
            return f"[{inner}]" if type(v) is list else f"({inner})"
        return repr(v)

    parts = [short(sample.input)] + [short(a) for a in sample.args]
    parts += [f"{k}={short(v)}" for k, v in sample.kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def copy_of(t):
    """A copy of t with its own memory, and t's sizes, strides and offset
    (expanded and overlapping views included): the whole storage is copied."""
    import torch
    if t.layout != torch.strided or t.is_quantized:
        return t.clone()
    storage = t.storage().clone()
    return torch.tensor([], dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())


def storage_of(t):
    """All of t's storage as a 1-D tensor that shares it."""
    import torch
    return torch.tensor([], dtype=t.dtype).set_(t.storage())


# Note [Fresh inputs]
# A graph that baked a trace-time value (a number read from a tensor, a size
# that depends on values, work done on a thread the tracer does not follow)
# still gives the right answer on the inputs it was traced with. So each
# module also runs on fresh tensors of the same shapes, dtypes and strides,
# compared with eager on the same tensors. Many operators accept only some
# values (a positive-definite matrix, probabilities in [0, 1], indices in
# range, sorted offsets), and the only sign of a value out of an operator's
# domain is that eager fails on it, so there are two sets of fresh tensors,
# each the first of its variants on which eager succeeds:
#
# - close: floating-point values shrink by up to 5% (which keeps signs,
#   zeros and ranges such as [0, 1] and [-1, 1]), integer and bool values are
#   permuted within their storage (which keeps indices in range);
# - resampled: every value is drawn again, with replacement, from the
#   sample's own values in the same storage, and a quarter of floating-point
#   values become zero. Counts change (of true mask entries, of nonzeros,
#   of distinct values), so sizes that depend on values differ from the
#   trace's.
#
# If eager fails on every variant of a set, that set is left out.
FRESH_VARIANTS = (
    ("close", [("floats shrunk, integers permuted", "shrink", True),
               ("floats shrunk", "shrink", False),
               ("floats grown", "grow", False)]),
    ("resampled", [("values resampled, some floats zero", "resample-zero", True),
                   ("values resampled", "resample", True)]),
)


def fresh(tensors, how, integers):
    """Copies of tensors with new values (Note [Fresh inputs]); integer and
    bool tensors change only if `integers`."""
    import torch
    g = torch.Generator().manual_seed(SEED + 1)
    out = []
    for t in tensors:
        c = copy_of(t)
        if c.layout == torch.strided and not c.is_quantized and c.numel() > 0:
            flat = storage_of(c)
            floating = flat.is_floating_point() or flat.is_complex()
            n = flat.numel()
            if how in ("shrink", "grow") and floating:
                u = torch.rand(n, generator=g, dtype=torch.float64)
                factor = 1 - 0.05 * u if how == "shrink" else 1 + 0.05 * u
                flat.mul_(factor.to(flat.real.dtype if flat.is_complex() else flat.dtype))
            elif how in ("shrink", "grow") and integers and n > 1:
                flat.copy_(flat[torch.randperm(n, generator=g)])
            elif how.startswith("resample") and (floating or integers):
                flat.copy_(flat[torch.randint(n, (n,), generator=g)])
                if how == "resample-zero" and floating:
                    flat[torch.rand(n, generator=g) < 0.25] = 0
        out.append(c)
    return out


def recorded_shapes(gm, inputs):
    """None if every node of gm's graph whose metadata records a tensor
    (meta["val"]) produces a tensor of that dtype and shape when the graph
    runs on inputs, or the first that does not. Sizes recorded as other than
    ints (symbols) match any size."""
    import torch
    import torch.fx

    def mismatch(node, recorded, value):
        if isinstance(recorded, (list, tuple)) and isinstance(value, (list, tuple)):
            for i, (r, v) in enumerate(zip(recorded, value)):
                problem = mismatch(f"{node}[{i}]", r, v)
                if problem:
                    return problem
            return None
        shape = getattr(recorded, "shape", None)
        if shape is None or not isinstance(value, torch.Tensor):
            return None
        fixed = all(isinstance(d, int) for d in shape)
        same = len(shape) == value.dim() and all(
            not isinstance(d, int) or d == v for d, v in zip(shape, value.shape))
        if recorded.dtype != value.dtype or not same:
            return (f"%{node} is recorded as {recorded.dtype} {list(shape)} but is "
                    f"{value.dtype} {list(value.shape)}" +
                    (" (a size the graph holds as fixed)" if fixed else ""))
        return None

    class Checked(torch.fx.Interpreter):
        problem = None

        def run_node(self, n):
            value = super().run_node(n)
            if self.problem is None and "val" in n.meta and n.op != "placeholder":
                self.problem = mismatch(n.name, n.meta["val"], value)
            return value

    interpreter = Checked(gm)
    interpreter.run(*[copy_of(t) for t in inputs])
    return interpreter.problem


def run(fn, tensors):
    """fn on copies of tensors, after seeding the generator: (result, the copies after)."""
    import torch
    copies = [copy_of(t) for t in tensors]
    torch.manual_seed(SEED)
    return fn(*copies), copies


TOLERANCES = {  # (rtol, atol), torch.testing.assert_close's defaults
    "torch.float16": (1e-3, 1e-5), "torch.bfloat16": (1.6e-2, 1e-5),
    "torch.float32": (1.3e-6, 1e-5), "torch.float64": (1e-7, 1e-7),
    "torch.complex64": (1.3e-6, 1e-5), "torch.complex128": (1e-7, 1e-7),
}


def compare(expected, actual, values=True, path="result"):
    """None if actual is expected (tensors by dtype, shape and, if values,
    value: NaN equal to NaN, floats within tolerance, the rest exactly), or
    what differs. Tuples, lists and torch.return_types count as one kind."""
    import math
    import torch
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{path}: expected a tensor, got {type(actual).__name__}"
        if expected.dtype != actual.dtype or expected.shape != actual.shape:
            return (f"{path}: expected {expected.dtype} {list(expected.shape)}, got "
                    f"{actual.dtype} {list(actual.shape)}")
        if not values or expected.numel() == 0:
            return None
        e, a = expected, actual
        if e.layout != torch.strided:
            e = e.to_dense()
        if a.layout != torch.strided:
            a = a.to_dense()
        if e.is_quantized:
            e, a = e.dequantize(), a.dequantize()
        e, a = e.resolve_conj().resolve_neg(), a.resolve_conj().resolve_neg()
        if e.is_floating_point() or e.is_complex():
            rtol, atol = TOLERANCES.get(str(e.dtype), (1e-5, 1e-5))
            close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = a == e
        if bool(close.all()):
            return None
        bad = int((~close).sum())
        text = f"{path}: {bad} of {close.numel()} values differ"
        if e.is_floating_point() or e.is_complex():
            finite = torch.isfinite(e) & torch.isfinite(a)
            if bool(finite.any()):
                text += f" (largest difference {float((a - e)[finite].abs().max()):.3g})"
        return text
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: expected a sequence of {len(expected)}, got {short_repr(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            problem = compare(e, a, values, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return f"{path}: expected a dict with keys {sorted(expected)}, got {short_repr(actual)}"
        for k in expected:
            problem = compare(expected[k], actual[k], values, f"{path}[{k!r}]")
            if problem:
                return problem
        return None
    if isinstance(actual, torch.Tensor) or type(actual) is not type(expected):
        return f"{path}: expected {short_repr(expected)}, got {short_repr(actual)}"
    if not values:
        return None
    if isinstance(expected, float) and math.isnan(expected) and math.isnan(actual):
        return None
    if expected != actual:
        return f"{path}: expected {short_repr(expected)}, got {short_repr(actual)}"
    return None


def short_repr(v, limit=60):
    text = repr(v) if not hasattr(v, "shape") else f"{type(v).__name__} {list(v.shape)}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def first_line(e, limit=300):
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def classify(e):
    """A torchcap refusal, or an error: {"class", "reason", "kind", "message"}."""
    import torchcap
    message = first_line(e)
    if isinstance(e, torchcap.Error):
        for reason, pattern, _ in REFUSALS:
            if re.search(pattern, str(e)):
                return {"class": "refused", "reason": reason, "message": message}
        return {"class": "error", "kind": "torchcap", "message": "torchcap." + message}
    return {"class": "error", "kind": "internal", "message": message}


def draws_random_numbers(f, tensors):
    """Whether f draws random numbers, so that a graph of it cannot repeat
    eager's values: their values are not compared.

    Two signs: an operator LibTorch tags as drawing (nondeterministic_seeded),
    seen at the Python dispatch key, after LibTorch's own decompositions; or
    a call to torch.manual_seed while f runs. op_db makes its random
    operators repeatable that way (wrapper_set_seed seeds with 42 around the
    call), a Python call that runs while tracing and is not in the graph; and
    a kernel that draws inside another operator
    (_scaled_dot_product_attention's dropout) is not seen at the dispatch key."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        found = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if torch.Tag.nondeterministic_seeded in func.tags:
                Seen.found = True
            return func(*args, **(kwargs or {}))

    manual_seed = torch.manual_seed

    def seeding(seed):
        Seen.found = True
        return manual_seed(seed)

    copies = [copy_of(t) for t in tensors]
    torch.manual_seed(SEED)
    torch.manual_seed = seeding
    try:
        with Seen():
            f(*copies)
    except Exception:
        pass
    finally:
        torch.manual_seed = manual_seed
    return Seen.found


# --- One sample ----------------------------------------------------------------

def check_sample(key, op, index, sample, skip, emit, workdir):
    """Runs one sample through every stage not in `skip`, emitting events."""
    import torch
    import torchcap
    import torchcap._load
    from torch.fx.experimental.proxy_tensor import make_fx

    def start(stage):
        emit({"event": "start", "op": key, "sample": index, "stage": stage})

    def result(stage, **r):
        emit({"event": "stage", "op": key, "sample": index, "stage": stage, **r})

    f, tensors = program(op, sample)
    info = {"event": "sample", "op": key, "sample": index, "desc": describe(sample), "notes": []}
    notes = info["notes"]

    start("eager")
    try:
        expected = run(f, tensors)
    except Exception as e:  # the sample is not valid for eager: nothing to compare with
        info["eager"] = first_line(e)
        emit(info)
        for stage in STAGES[1:]:
            result(stage, **{"class": "skipped", "message": "eager fails on the sample"})
        return
    values = op.name not in UNDEFINED_VALUES
    if not values:
        notes.append("values undefined (uninitialised memory): shapes compared")
    elif draws_random_numbers(f, tensors):
        values = False
        notes.append("random: shapes compared")
    elif compare(expected, run(f, tensors)) is not None:
        values = False
        notes.append("eager is not deterministic: shapes compared")
    runs = [("sample", tensors, expected)]
    if not tensors:
        notes.append("no tensor arguments")
    for kind, variants in FRESH_VARIANTS if tensors else ():
        for name, how, integers in variants:
            inputs = fresh(tensors, how, integers)
            try:
                runs.append((f"fresh ({name})", inputs, run(f, inputs)))
                break
            except Exception:
                continue
        else:
            notes.append(f"eager fails on every {kind} fresh input: left out")
    emit(info)

    def check(module, shapes=False):
        """None if module computes what eager computes on every run, or a
        result. shapes: also check the graph's recorded shapes on fresh inputs."""
        for label, inputs, (want, want_after) in runs:
            try:
                got, got_after = run(module, inputs)
            except Exception as e:
                r = classify(e)
                if r["class"] == "refused":  # refusals belong to tracing, not to running
                    r = {"class": "error", "kind": "torchcap",
                         "message": "torchcap." + first_line(e)}
                r["message"] = f"running the module on {label} inputs: {r['message']}"
                return r
            problem = compare(want, got, values)
            for i, (w, g) in enumerate(zip(want_after, got_after)):
                problem = problem or compare(w, g, values, f"input {i} after the call")
            if problem:
                return {"class": "wrong", "message": f"on {label} inputs: {problem}"}
            if shapes and label != "sample":
                try:
                    problem = recorded_shapes(module, inputs)
                except Exception as e:  # running node by node is this script's doing
                    problem = None
                    notes.append(f"recorded shapes not checked: {first_line(e)}")
                if problem:
                    return {"class": "wrong", "message": f"graph metadata on {label} inputs: "
                                                         f"{problem}"}
        return None

    def stage(name, make):
        if name in skip:
            return None
        start(name)
        try:
            module = make()
        except Exception as e:
            result(name, **classify(e))
            return None
        r = check(module, shapes="+" not in name) or {"class": "ok"}
        result(name, **r)
        return module if r["class"] == "ok" else None

    def saved_and_loaded(name, module):
        if name in skip:
            return
        if module is None:
            result(name, **{"class": "skipped", "message": f"{name.split('+')[0]} did not succeed"})
            return
        path = os.path.join(workdir, "module.tcg")

        def make():
            torchcap.save(module, path)
            loaded = torchcap.load(path)
            # The reader without the compiled part checks a file as the C++
            # loader does, shapes too: it accepts what that accepted.
            torchcap._load.load_in_python(path)
            return loaded
        stage(name, make)

    if "make_fx" not in skip:
        start("make_fx")
        try:
            gm = make_fx(f)(*[copy_of(t) for t in tensors])
            r = check(gm) or {"class": "ok"}
        except Exception as e:
            r = {"class": "error", "message": first_line(e)}
        result("make_fx", **r)
    traced = stage("trace", lambda: torchcap.trace(f, tuple(copy_of(t) for t in tensors)))
    saved_and_loaded("trace+save+load", traced)
    exported = stage("dispatch_trace",
                     lambda: torchcap.dispatch_trace(f, tuple(copy_of(t) for t in tensors)))
    saved_and_loaded("dispatch_trace+save+load", exported)
    emit(info)  # again, with the notes the checks added


def worker(args):
    """Reads tasks (one operator each) from stdin; writes events to stdout."""
    import warnings
    # Events go to the original stdout; anything the operators print goes to
    # stderr, so it cannot break the protocol.
    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(1)
    import torchcap  # noqa: F401 -- a worker that cannot import it fails before any task

    def emit(event):
        events.write(json.dumps(event) + "\n")

    ops = operators(args.extra_ops)
    workdir = tempfile.mkdtemp(prefix="op_sweep_")
    emit({"event": "ready"})
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        task = json.loads(line)
        key = task["op"]
        try:
            samples = make_samples(ops[key])
        except Exception as e:
            emit({"event": "no_samples", "op": key, "message": first_line(e)})
            samples = []
        for i in chosen(len(samples), task["samples"]):
            if i < task.get("first", 0):
                continue
            skip = set(task.get("skip", [])) if i == task.get("first") else set()
            try:
                check_sample(key, ops[key], i, samples[i], skip, emit, workdir)
            except Exception as e:  # a defect of this script, not of torchcap
                import traceback
                where = traceback.extract_tb(e.__traceback__)[-1]
                emit({"event": "sweep_error", "op": key, "sample": i,
                      "message": f"{first_line(e)} (op_sweep.py line {where.lineno})"})
        emit({"event": "done", "op": key})


# --- The sweep -----------------------------------------------------------------

# Note [Workers]
# An operator that crashes the process (a signal, an abort in LibTorch) must
# not end the sweep, and must be named. Operators run in worker processes,
# one operator per task; before each stage of each sample a worker says which
# it starts. When a worker dies, or says nothing for --timeout seconds (it is
# then killed), the stage it last started is a crash, and a new worker
# resumes the same sample, skipping the stages that crashed (so a stage that
# crashes every time is tried once per sample), then goes on. Stages that
# need a module from a crashed stage are skipped.

class Worker:
    def __init__(self, args, slot):
        self.stderr_path = os.path.join(args.tmp, f"worker{slot}.stderr")
        self.stderr = open(self.stderr_path, "w+b")
        command = [sys.executable, os.path.abspath(__file__), "--worker"]
        if args.extra_ops:
            command += ["--extra-ops", args.extra_ops]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        self.buffer = b""
        self.task = None
        self.current = None  # (op, sample, stage) last started
        self.ready = False
        self.last = time.monotonic()

    def send(self, task):
        self.task = task
        self.current = None
        self.last = time.monotonic()
        self.proc.stdin.write((json.dumps(task) + "\n").encode())
        self.proc.stdin.flush()

    def read(self):
        """The events available, or None at end of file."""
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            return None
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        self.last = time.monotonic()
        return [json.loads(line) for line in lines if line.strip()]

    def stderr_tail(self, lines=3):
        self.stderr.flush()
        with open(self.stderr_path, "rb") as f:
            text = f.read()[-4000:].decode(errors="replace")
        kept = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(kept[-lines:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


def death(returncode):
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def sweep(args, keys):
    """{(op, sample): record} for the operators `keys`."""
    records = {}
    no_samples = {}
    queue = collections.deque({"op": k, "samples": args.samples} for k in keys)
    workers = [None] * args.jobs
    crashes = collections.Counter()

    def record(op, sample):
        return records.setdefault((op, sample), {"op": op, "sample": sample, "stages": {}})

    def handle(event):
        kind = event.pop("event")
        if kind == "sample":
            r = record(event["op"], event["sample"])
            r.update({k: v for k, v in event.items() if k not in ("op", "sample")})
        elif kind == "stage":
            op, sample, stage = event.pop("op"), event.pop("sample"), event.pop("stage")
            record(op, sample)["stages"][stage] = event
        elif kind == "no_samples":
            no_samples[event["op"]] = event["message"]
        elif kind == "sweep_error":
            record(event["op"], event["sample"])["sweep_error"] = event["message"]

    def crashed(w, why):
        op, sample, stage = w.current
        tail = w.stderr_tail()
        message = why + (f": {tail}" if tail else "")
        r = record(op, sample)
        r["stages"][stage] = {"class": "crash", "message": message}
        crashes[(op, sample)] += 1
        if stage == "eager":
            r["eager"] = "crashed: " + message
            for s in STAGES[1:]:
                r["stages"][s] = {"class": "skipped", "message": "eager crashed on the sample"}
            resume = {"op": op, "samples": w.task["samples"], "first": sample + 1}
        else:
            skip = sorted(s for s, v in r["stages"].items() if v["class"] == "crash")
            resume = {"op": op, "samples": w.task["samples"], "first": sample, "skip": skip}
            for mode in MODES:  # stages after the crash run again on resume
                if STAGES.index(mode) > STAGES.index(stage):
                    r["stages"].pop(mode, None)
        if crashes[(op, sample)] <= len(STAGES):
            queue.appendleft(resume)

    try:
        while queue or any(w is not None and w.task is not None for w in workers):
            for slot in range(args.jobs):
                w = workers[slot]
                if queue and (w is None or w.task is None):
                    if w is None:
                        w = workers[slot] = Worker(args, slot)
                    w.send(queue.popleft())
            busy = [w for w in workers if w is not None and w.task is not None]
            readable, _, _ = select.select([w.proc.stdout for w in busy], [], [], 1.0)
            for w in busy:
                slot = workers.index(w)
                if w.proc.stdout in readable:
                    events = w.read()
                    if events is None:  # the worker died
                        returncode = w.proc.wait()
                        if not w.ready:
                            raise SystemExit(f"op_sweep: a worker could not start "
                                             f"({death(returncode)}): {w.stderr_tail(10)}")
                        if w.current is None:
                            raise SystemExit(f"op_sweep: a worker died between stages "
                                             f"({death(returncode)}): {w.stderr_tail(10)}")
                        crashed(w, death(returncode))
                        w.stop()
                        workers[slot] = None
                        continue
                    for event in events:
                        if event["event"] == "ready":
                            w.ready = True
                        elif event["event"] == "start":
                            w.current = (event["op"], event["sample"], event["stage"])
                        elif event["event"] == "done":
                            w.task = None
                        else:
                            handle(event)
                elif time.monotonic() - w.last > args.timeout and w.current is not None:
                    w.proc.kill()
                    w.proc.wait()
                    crashed(w, f"hung: no progress for {args.timeout} s, killed")
                    w.stop()
                    workers[slot] = None
    finally:
        for w in workers:
            if w is not None:
                w.stop()
    return records, no_samples


# --- Report ------------------------------------------------------------------

def stage_of(r, stage):
    return r["stages"].get(stage, {"class": "skipped", "message": "not run"})


def signature(message):
    """A failure's message without what varies between operators, to group them."""
    text = re.sub(r"^running the module on .*? inputs: ", "running: ", message)
    text = re.sub(r"^on .*? inputs: ", "", text)
    text = re.sub(r"\bSchema: .*", "", text)
    text = re.sub(r"aten::[\w.]+", "aten::OP", text)
    text = re.sub(r"%\w+", "%NODE", text)
    text = re.sub(r"\[[^\]]*\]", "[...]", text)
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)
    text = re.sub(r"File \".*", "", text)
    return text.strip()[:160]


def report(records, no_samples, args, elapsed, out):
    rows = sorted(records.values(), key=lambda r: (r["op"], r["sample"]))
    ops = sorted({r["op"] for r in rows} | set(no_samples))
    import resource
    used = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(u.ru_utime + u.ru_stime for u in used)
    print(f"op sweep: {len(ops)} operators, {len(rows)} samples "
          f"({'all samples' if args.samples == 'all' else f'up to {args.samples} per operator'}), "
          f"{args.jobs} worker(s), {elapsed:.1f} s ({cpu:.1f} s of CPU)", file=out)
    if no_samples:
        print(f"{len(no_samples)} operator(s) without samples (their sample inputs fail to build): "
              f"{', '.join(sorted(no_samples))}", file=out)

    width = max(len(m) for m in STAGES) + 2
    print("\nsamples", " " * (width - 7) + "".join(f"{c:>9}" for c in CLASSES), file=out)
    for stage in STAGES[1:]:
        counts = collections.Counter(stage_of(r, stage)["class"] for r in rows)
        label = stage if stage != "make_fx" else "make_fx (ref)"
        print(f"{label:<{width}}" + "".join(f"{counts[c]:>9}" for c in CLASSES), file=out)
    # An operator counts in its worst class over its samples.
    rank = ("skipped", "ok", "refused", "error", "wrong", "crash")
    print("\noperators", " " * (width - 9) + "".join(f"{c:>9}" for c in CLASSES), file=out)
    for stage in STAGES[1:]:
        worst = {}
        for r in rows:
            c = stage_of(r, stage)["class"]
            if rank.index(c) >= rank.index(worst.get(r["op"], "skipped")):
                worst[r["op"]] = c
        counts = collections.Counter(worst.values())
        label = stage if stage != "make_fx" else "make_fx (ref)"
        print(f"{label:<{width}}" + "".join(f"{counts[c]:>9}" for c in CLASSES), file=out)

    def make_fx_note(r):
        c = stage_of(r, "make_fx")["class"]
        return "" if c == "ok" else f"  [make_fx: {c}]"

    groups = collections.defaultdict(lambda: collections.defaultdict(set))
    for r in rows:
        for mode in MODES:
            s = stage_of(r, mode)
            if s["class"] in FAILING:
                kind = s.get("kind", "")
                cause = (s["class"] + (f" ({kind})" if kind else ""), signature(s["message"]))
                groups[cause][r["op"]].add(mode)
    if groups:
        print("\nfailures by cause (operators, with the modes that fail):", file=out)
        for (cls, text), by_op in sorted(groups.items(), key=lambda g: (g[0][0], -len(g[1]))):
            print(f"  {cls}: {text}", file=out)
            names = [f"{op} [{', '.join(m for m in MODES if m in modes)}]"
                     for op, modes in sorted(by_op.items())]
            print("      " + "\n      ".join(names), file=out)

    refusals = collections.defaultdict(set)
    for r in rows:
        for mode in MODES:
            s = stage_of(r, mode)
            if s["class"] == "refused":
                refusals[s["reason"]].add(r["op"])
    if refusals:
        print("\nrefusals by reason:", file=out)
        for reason, _, why in REFUSALS:
            if reason in refusals:
                print(f"  {reason} ({why}): {', '.join(sorted(refusals[reason]))}", file=out)

    eager = collections.defaultdict(list)
    for r in rows:
        if "eager" in r:
            eager[r["eager"]].append(f"{r['op']} #{r['sample']}")
    if eager:
        print("\nsamples skipped because eager fails on them:", file=out)
        for message, where in sorted(eager.items()):
            print(f"  {message}: {', '.join(where)}", file=out)

    lines = []
    for r in rows:
        for mode in MODES:
            s = stage_of(r, mode)
            if s["class"] not in ("ok", "skipped"):
                reason = f" {s['reason']}:" if s.get("reason") else ""
                note = make_fx_note(r) if s["class"] in FAILING else ""
                message = s.get("message", "")  # whole in --json
                if len(message) > 160:
                    message = message[:157] + "..."
                lines.append(f"  {r['op']} #{r['sample']} {mode}: {s['class']}{reason} "
                             f"{message}{note}")
    if lines:
        print("\nevery result that is not ok (skipped ones aside):", file=out)
        print("\n".join(lines), file=out)
    own = [f"  {r['op']} #{r['sample']}: {r['sweep_error']}" for r in rows if "sweep_error" in r]
    if own:
        print("\nop_sweep's own errors (fix the script):", file=out)
        print("\n".join(own), file=out)
    failing = sum(stage_of(r, m)["class"] in FAILING for r in rows for m in MODES) + len(own)
    print(f"\n{'FAILED' if failing else 'PASSED'}: {failing} failing result(s) "
          f"(error, wrong or crash) over {len(MODES)} modes", file=out)
    return failing


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every sample of every operator")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help="samples per operator, spread evenly over its list "
                             f"(default {DEFAULT_SAMPLES})")
    parser.add_argument("--ops", help="comma-separated operators (op_db names, or name.variant)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--json", help="write every result to this file")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a stage may run before it counts as hung (default 120)")
    parser.add_argument("--extra-ops", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.extra_ops:
        args.extra_ops = os.path.abspath(args.extra_ops)
    args.samples = "all" if args.all else args.samples
    started = time.monotonic()
    ops = operators(args.extra_ops)
    keys = list(ops)
    if args.ops:
        # A name selects all its variants; name.variant one of them.
        wanted = {w.strip() for w in args.ops.split(",") if w.strip()}
        unknown = wanted - set(keys) - {op.name for op in ops.values()}
        if unknown:
            print(f"op_sweep: no operator with float32 CPU samples is named "
                  f"{', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        keys = [k for k in keys if k in wanted or ops[k].name in wanted]
    with tempfile.TemporaryDirectory(prefix="op_sweep_") as tmp:
        args.tmp = tmp
        try:
            records, no_samples = sweep(args, keys)
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
    elapsed = time.monotonic() - started
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": args.samples, "elapsed_seconds": round(elapsed, 1),
                       "refusals": [{"reason": r, "pattern": p, "why": w} for r, p, w in REFUSALS],
                       "no_samples": no_samples,
                       "results": sorted(records.values(), key=lambda r: (r["op"], r["sample"]))},
                      f, indent=1)
    failing = report(records, no_samples, args, elapsed, sys.stdout)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
