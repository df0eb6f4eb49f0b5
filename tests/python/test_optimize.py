"""torchcap.optimize_for_inference and `torchcap optimize` (docs/optimize.md):
the smallest torchvision model of each family (and MobileNetV2, whose ReLU6s
fuse into the convolution), traced in eval mode, optimized, equal
to eager within the documented tolerance, through the C++ interpreter, a
saved file loaded by either loader, and the command; and the refusals."""

import subprocess
import sys

import pytest
import torch
import torchvision

import torchcap
from torchcap._load import load_in_python

from cli_helpers import error_of, run
from zoo import MODELS

torch.manual_seed(0)

# docs/optimize.md: folding and packing change float rounding only.
RTOL, ATOL = 1e-4, 1e-5

CHOSEN = [m for m in MODELS if m[4] and m[0] != "r3d_18"] + [m for m in MODELS if m[0] == "mobilenet_v2"]


def flat(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat(v)]
    return [t for v in value for t in flat(v)]


def assert_close(actual, expected, what):
    for a, e in zip(flat(actual), flat(expected), strict=True):
        scale = max(1.0, e.abs().max().item())
        assert torch.allclose(a, e, rtol=RTOL, atol=ATOL * scale), (what, (a - e).abs().max().item())


def operators(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("name,make_model,make_inputs", [(m[0], m[2], m[3]) for m in CHOSEN],
                         ids=[m[0] for m in CHOSEN])
def test_torchvision_models_optimized_equal_eager(name, make_model, make_inputs, tmp_path):
    model = make_model().eval()
    inputs = tuple(make_inputs())
    with torch.no_grad():
        want = model(*inputs)
        gm = torchcap.trace(model, inputs)
        fast = torchcap.optimize_for_inference(gm)
        assert_close(fast(*inputs), want, "optimized")
        assert_close(gm(*inputs), want, "traced")  # the original is left as it was
        path = tmp_path / "model.tcg"
        torchcap.save(fast, path)
        assert_close(torchcap.load(path)(*inputs), want, "loaded")
        # The Python-only reader runs torch.fx's code: it packs at each call.
        assert_close(load_in_python(path)(*inputs), want, "loaded in Python")
    ops, traced = operators(fast), operators(gm)
    batch_norm = "aten.native_batch_norm.default"
    if batch_norm in traced:  # folded where a convolution comes first: all, or some (MaxViT)
        assert ops.count(batch_norm) < traced.count(batch_norm)
    if any("convolution" in o for o in traced):
        assert "torchcap.conv2d_run.default" in ops, ops


def optimized_and_checked(model, x):
    """model's graph, optimized and equal to eager on x; and its operators."""
    with torch.no_grad():
        fast = torchcap.optimize_for_inference(torchcap.trace(model.eval(), (x,)))
        assert_close(fast(x), model(x), "optimized")
    return fast, operators(fast)


def test_mobilenet_v2s_relu6_runs_inside_the_convolution():
    fast, ops = optimized_and_checked(torchvision.models.mobilenet_v2(), torch.randn(2, 3, 64, 64))
    assert "aten.hardtanh_.default" not in ops and "aten.hardtanh.default" not in ops
    clips = [n for n in fast.graph.nodes
             if n.target == torch.ops.torchcap.conv2d_prepack.default and n.args[7] == "hardtanh"]
    assert len(clips) == 35 and all(n.args[8:] == (0.0, 6.0) for n in clips)  # every conv before a ReLU6
    assert "torchcap.linear_run.default" in ops  # the 1280 x 1000 classifier
    # The projections of the blocks with a shortcut take its add.
    assert "aten.add.Tensor" not in ops and "aten.add_.Tensor" not in ops
    assert sum(1 for n in fast.graph.nodes if n.target == torch.ops.torchcap.conv2d_run.default
               and len(n.args) == 3) == 10


def test_resnet18s_residual_adds_and_relus_run_inside_the_convolutions():
    fast, ops = optimized_and_checked(torchvision.models.resnet18(), torch.randn(1, 3, 64, 64))
    assert ops.count("torchcap.conv2d_run.default") == 20 and ops.count("aten.relu_.default") == 0
    post_ops = [n.args[7] for n in fast.graph.nodes if n.target == torch.ops.torchcap.conv2d_prepack.default]
    assert sorted(set(post_ops)) == ["add_relu", "none", "relu"] and post_ops.count("add_relu") == 8


def test_without_the_compiled_part_an_optimized_file_is_refused_by_name(tmp_path):
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torchcap.save(torchcap.optimize_for_inference(torchcap.trace(model, (x,))), tmp_path / "fast.tcg")
    # A process where torchcap._C cannot be imported: nothing registers
    # torchcap's operators there.
    script = ("import sys; sys.modules['torchcap._C'] = None\n"
              "import torchcap\n"
              "try:\n"
              f"    torchcap.load({str(tmp_path / 'fast.tcg')!r})\n"
              "except ValueError as e:\n"
              "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "torchcap::conv2d_prepack is one of torchcap's own operators" in out, out
    assert "torchcap._C, registers" in out and "byte" in out, out


def test_exported_and_loaded_modules_and_the_optimize_passes_by_name(tmp_path):
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        want = model(x)
        by_name = torchcap.trace(model, (x,), passes="optimize")
        assert_close(by_name(x), want, "passes='optimize'")
        exported = torchcap.optimize_for_inference(torchcap.export(model, (x,)))
        assert_close(exported(x), want, "exported")
        torchcap.save(torchcap.trace(model, (x,)), tmp_path / "plain.tcg")
        loaded = torchcap.optimize_for_inference(torchcap.load(tmp_path / "plain.tcg"))
        assert_close(loaded(x), want, "loaded, then optimized")
        with pytest.raises(torchcap.InputError):
            loaded(torch.randn(1, 3, 32, 32))  # the file's input check still holds


def test_refusals():
    model = torchvision.models.resnet18()
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(torchcap.Error, match="optimize_for_inference: .* eval mode"):
        torchcap.optimize_for_inference(torchcap.trace(model, (x,)))  # train mode
    with pytest.raises(TypeError, match="module made by torchcap"):
        torchcap.optimize_for_inference(model.eval())


def test_the_command(tmp_path):
    model = torchvision.models.mobilenet_v3_small().eval()
    scripted = tmp_path / "m.pt"
    torch.jit.script(model).save(str(scripted))
    plain, fast = tmp_path / "plain.tcg", tmp_path / "fast.tcg"
    run("trace", scripted, "--input", "1x3x64x64", "-o", plain)
    out = run("optimize", plain, "-o", fast).stdout
    assert out.startswith(f"optimized {plain}: ") and f"saved {fast}" in out
    diff = float(out.split("max |optimized - original| = ")[1].split()[0])
    assert diff < 1e-4
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert_close(torchcap.load(fast)(x), model(x), "torchcap optimize")
    traced_fast = tmp_path / "traced_fast.tcg"
    run("trace", scripted, "--input", "1x3x64x64", "--optimize", "-o", traced_fast)
    with torch.no_grad():
        assert_close(torchcap.load(traced_fast)(x), model(x), "trace --optimize")
    assert error_of("optimize", plain, code=2).startswith("--output is required")
    assert error_of("optimze", plain, "-o", fast, code=2).startswith(
        "unknown command 'optimze' (did you mean 'optimize'?)")


def test_the_command_refuses_a_weightless_file(tmp_path):
    model = torch.nn.Linear(4, 2).to("meta")
    weightless = tmp_path / "weightless.tcg"
    torchcap.save(torchcap.trace(model, (torch.randn(3, 4, device="meta"),), meta=True), weightless)
    assert error_of("optimize", weightless, "-o", tmp_path / "out.tcg").startswith(
        f"'{weightless}' is weightless (weight, ... have no values): optimizing folds and packs weights")
    assert not (tmp_path / "out.tcg").exists()


def test_the_command_refuses_a_training_graph(tmp_path):
    train_graph = tmp_path / "train.tcg"
    run("trace", "--example", "cnn_bn_train", "-o", train_graph)
    assert error_of("optimize", train_graph, "-o", tmp_path / "out.tcg").startswith(
        "optimize_for_inference: ")
    assert not (tmp_path / "out.tcg").exists()


def test_a_dynamic_graph_gets_every_pass_but_packed_convolutions():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        gm = torchcap.trace(model, (x,), dynamic_shapes=({0: torchcap.Dim("batch", min=1, max=16)},))
        fast = torchcap.optimize_for_inference(gm)
        for batch in (1, 3, 5):
            y = torch.randn(batch, 3, 64, 64)
            assert_close(fast(y), model(y), f"batch {batch}")
    ops = operators(fast)
    assert "aten.native_batch_norm.default" not in ops  # folded
    # oneDNN's packing takes the input's sizes; XNNPACK's linear layer does not.
    assert not any(o.startswith(("torchcap.conv2d", "prepacked.conv2d")) for o in ops)
    assert "prepacked.linear_clamp_run.default" in ops
