"""The operator sweep (op_sweep.py) finds what it is there to find.

Operators that misbehave on purpose under torchcap's tracer (a wrong graph,
a baked value, an internal error, an undocumented torchcap error, a crash, a
hang) go through the sweep's workers as op_db's operators do, and each must
land in its class; the pieces that decide (comparison, fresh inputs, recorded
shapes, the refusal table) are checked on their own.

Needs torchcap's compiled part on PYTHONPATH (e.g. build/python).
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch

SWEEP = pathlib.Path(__file__).resolve().parent / "op_sweep.py"
_spec = importlib.util.spec_from_file_location("op_sweep", SWEEP)
op_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op_sweep)

# The operators misbehave only while torchcap traces them: eager and make_fx
# see plain tensors, torchcap's traced tensors carry its dispatch key (Fake).
FAKE_OPS = r'''
import os
import time

import torch
import torchcap


def traced(x):
    return "Fake" in str(torch._C._dispatch_keys(x))


class Sample:
    def __init__(self, input, *args, **kwargs):
        self.input, self.args, self.kwargs = input, args, kwargs


class Op:
    def __init__(self, name, op, make=lambda: [Sample(torch.randn(3, 4))]):
        self.name, self.variant_test_name, self.op, self.make = name, "", op, make

    def sample_inputs(self, device, dtype, requires_grad=False):
        return self.make()


def crash(x):
    if traced(x):
        os.abort()
    return x + 1


def hang(x):
    # Once: the worker that resumes after it is killed goes on.
    marker = os.path.join(os.path.dirname(__file__), "hung")
    if traced(x) and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(600)
    return x + 1


def wrong(x):
    return x * 3 if traced(x) else x * 2


SAMPLE = torch.randn(3, 4)


def baked(x):
    # Right on the traced inputs, a constant for any other.
    return SAMPLE * 2 + x * 0 if traced(x) else x * 2


def internal(x):
    if traced(x):
        raise RuntimeError("an internal message")
    return x + 1


def undocumented(x):
    if traced(x):
        raise torchcap.TraceError("a refusal nobody documented")
    return x + 1


OPS = [
    Op("fake.crash", crash),
    Op("fake.ok", lambda x, y: torch.sin(x) * y, lambda: [Sample(torch.randn(3), torch.randn(3))]),
    Op("fake.refused", lambda x: x * x.sum().item()),
    Op("fake.wrong", wrong),
    Op("fake.baked", baked, lambda: [Sample(SAMPLE.clone())]),
    Op("fake.internal", internal),
    Op("fake.undocumented", undocumented),
    Op("fake.hang", hang),
    Op("fake.random", lambda x: torch.nn.functional.dropout(x, 0.5)),
    Op("fake.eager_fails", lambda x: x.view(5)),
]
'''


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "fake_ops.py").write_text(FAKE_OPS)
    out = tmp / "out.json"
    names = ("crash,ok,refused,wrong,baked,internal,undocumented,hang,random,eager_fails")
    proc = subprocess.run(
        [sys.executable, str(SWEEP), "--extra-ops", str(tmp / "fake_ops.py"), "--timeout", "3",
         "--ops", ",".join("fake." + n for n in names.split(",")), "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert out.exists(), proc.stderr
    results = {r["op"]: r for r in json.loads(out.read_text())["results"]}
    return proc, results


def classes(results, op):
    return {stage: v["class"] for stage, v in results[op]["stages"].items()}


def test_the_sweep_fails_and_says_why(swept):
    proc, _ = swept
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failures by cause" in proc.stdout
    assert "FAILED" in proc.stdout.splitlines()[-1]


def test_a_correct_graph_is_ok(swept):
    _, results = swept
    assert classes(results, "fake.ok") == dict.fromkeys(op_sweep.STAGES[1:], "ok")


def test_a_documented_refusal_is_refused(swept):
    _, results = swept
    stages = results["fake.refused"]["stages"]
    assert stages["trace"]["class"] == "refused"
    assert stages["trace"]["reason"] == "value-read"
    assert stages["dispatch_trace"]["reason"] == "value-read"
    assert stages["trace+save+load"]["class"] == "skipped"


def test_a_wrong_graph_is_wrong(swept):
    _, results = swept
    stages = results["fake.wrong"]["stages"]
    assert stages["trace"]["class"] == "wrong"
    assert stages["trace"]["message"].startswith("on sample inputs")
    assert stages["dispatch_trace"]["class"] == "wrong"


def test_a_baked_value_is_wrong_on_fresh_inputs(swept):
    _, results = swept
    stages = results["fake.baked"]["stages"]
    assert stages["trace"]["class"] == "wrong"
    assert stages["trace"]["message"].startswith("on fresh")
    assert stages["make_fx"]["class"] == "ok"


def test_other_exceptions_are_errors(swept):
    _, results = swept
    internal = results["fake.internal"]["stages"]["trace"]
    assert (internal["class"], internal["kind"]) == ("error", "internal")
    assert "an internal message" in internal["message"]
    undocumented = results["fake.undocumented"]["stages"]["trace"]
    assert (undocumented["class"], undocumented["kind"]) == ("error", "torchcap")


def test_a_crash_is_named_and_the_sweep_goes_on(swept):
    _, results = swept
    stages = results["fake.crash"]["stages"]
    assert stages["trace"]["class"] == "crash"
    assert "SIGABRT" in stages["trace"]["message"]
    assert stages["trace+save+load"]["class"] == "skipped"
    assert stages["dispatch_trace"]["class"] == "crash"
    assert stages["make_fx"]["class"] == "ok"
    # The operators after it ran in a new worker.
    assert classes(results, "fake.ok")["trace"] == "ok"


def test_a_hang_is_a_crash(swept):
    _, results = swept
    stages = results["fake.hang"]["stages"]
    assert stages["trace"]["class"] == "crash"
    assert "hung" in stages["trace"]["message"]
    assert stages["dispatch_trace"]["class"] == "ok"


def test_random_values_are_not_compared(swept):
    _, results = swept
    assert classes(results, "fake.random")["trace"] == "ok"
    assert "random: shapes compared" in results["fake.random"]["notes"]


def test_a_sample_eager_fails_on_is_skipped(swept):
    _, results = swept
    assert set(classes(results, "fake.eager_fails").values()) == {"skipped"}
    assert "RuntimeError" in results["fake.eager_fails"]["eager"]


def test_compare():
    nan = float("nan")
    assert op_sweep.compare(torch.tensor([1.0, nan]), torch.tensor([1.0, nan])) is None
    assert op_sweep.compare(torch.tensor([1.0]), torch.tensor([1.0 + 1e-7])) is None
    assert "1 of 2 values differ" in op_sweep.compare(torch.tensor([1.0, 2.0]),
                                                      torch.tensor([1.0, 2.1]))
    assert op_sweep.compare(torch.tensor([3]), torch.tensor([4])) is not None
    assert "expected torch.float32 [2]" in op_sweep.compare(torch.zeros(2), torch.zeros(3))
    assert op_sweep.compare(torch.zeros(2), torch.zeros(2, dtype=torch.float64)) is not None
    # torch.return_types and lists compare as the tuples they are.
    assert op_sweep.compare(torch.zeros(2, 3).max(0),
                            [torch.zeros(3), torch.zeros(3).long()]) is None
    assert op_sweep.compare(torch.ones(2), torch.zeros(2), values=False) is None


def test_fresh_inputs_keep_shapes_strides_and_index_values():
    x = torch.randn(4, 6)[:, ::2]
    i = torch.tensor([3, 0, 2, 1])
    e = torch.randn(3).expand(2, 3)
    (fx, fi, fe), = [op_sweep.fresh([x, i, e], "shrink", True)]
    assert fx.stride() == x.stride() and fe.stride() == e.stride()
    assert ((fx.abs() <= x.abs()) & (fx.sign() == x.sign())).all() and not torch.equal(fx, x)
    assert sorted(fi.tolist()) == sorted(i.tolist()) and not torch.equal(fi, i)
    r, = op_sweep.fresh([torch.arange(1.0, 101.0)], "resample-zero", True)
    assert (r == 0).any() and set(r[r != 0].tolist()) <= set(range(1, 101))


def test_recorded_shapes_catch_a_size_that_depends_on_values():
    gm = torch.fx.symbolic_trace(lambda x: torch.nonzero(x))
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.meta["val"] = types.SimpleNamespace(shape=torch.Size([2, 1]), dtype=torch.int64)
    assert op_sweep.recorded_shapes(gm, [torch.tensor([1.0, 0.0, 2.0])]) is None
    problem = op_sweep.recorded_shapes(gm, [torch.tensor([1.0, 1.0, 2.0])])
    assert "recorded as torch.int64 [2, 1] but is torch.int64 [3, 1]" in problem
    # A size recorded as a symbol matches any size.
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.meta["val"] = types.SimpleNamespace(shape=("s0", 1), dtype=torch.int64)
    assert op_sweep.recorded_shapes(gm, [torch.tensor([1.0, 1.0, 2.0])]) is None


def test_refusal_patterns_match_torchcap_messages():
    import torchcap
    for message, reason in [
        ("aten::_local_scalar_dense reads a tensor's value into C++ (for example .item())",
         "value-read"),
        ("Immutable tensor `self` is potentially getting modified by aten::add_", "input-write"),
        ("aten::nonzero returns a tensor whose shape depends on tensor values",
         "data-dependent-shape"),
    ]:
        assert op_sweep.classify(torchcap.TraceError(message))["reason"] == reason
    # The same text from outside torchcap's error classes is an error.
    r = op_sweep.classify(RuntimeError("aten::nonzero returns a tensor whose shape depends on "
                                       "tensor values"))
    assert (r["class"], r["kind"]) == ("error", "internal")
