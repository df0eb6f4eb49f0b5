"""A captured module is called as the program was, after a trip through a
file too (argument names, keyword arguments), and says what it takes and
returns: torchcap.signature, the output node's meta["val"], `show`'s call."""

import json

import pytest
import torch
import torchvision

import torchcap
from torchcap._load import load_in_python
from cli_helpers import error_of, run



class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x, pair, scale=1.0, *, bias=None):
        y = self.bn(x) * scale + bias
        return {"y": y, "rest": [pair[0] + pair[1]]}


def example():
    torch.manual_seed(0)
    m = Scaled().eval()
    x, p0, p1 = torch.randn(4, 3), torch.randn(2), torch.randn(2)
    s, b = torch.tensor(2.0), torch.randn(3)
    return m, (x, (p0, p1)), {"scale": s, "bias": b}


def assert_close_tree(a, b):
    flat_a, spec_a = torch.utils._pytree.tree_flatten(a)
    flat_b, spec_b = torch.utils._pytree.tree_flatten(b)
    assert spec_a == spec_b
    for u, v in zip(flat_a, flat_b):
        torch.testing.assert_close(u, v)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    m, args, kwargs = example()
    gm = torchcap.trace(m, args, kwargs)
    path = str(tmp_path_factory.mktemp("signature") / "scaled.tcg")
    torchcap.save(gm, path)
    return m, args, kwargs, gm, path


def test_placeholders_and_forward_are_named_after_the_arguments(saved):
    _, _, _, gm, _ = saved
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert names == ["x", "pair_0", "pair_1", "scale", "bias"]
    assert gm.code.lstrip().startswith("def forward(self, x, pair, *, scale, bias):")


@pytest.mark.parametrize("loader", ["load", "load_in_python"])
def test_a_loaded_module_is_called_as_the_traced_one(saved, loader):
    m, args, kwargs, gm, path = saved
    loaded = torchcap.load(path) if loader == "load" else load_in_python(path)
    assert loaded.code.lstrip().startswith("def forward(self, x, pair, *, scale, bias):")
    expected = m(*args, **kwargs)
    assert_close_tree(gm(*args, **kwargs), expected)
    assert_close_tree(loaded(*args, **kwargs), expected)
    # Keywords in another order, and a positional argument by name.
    assert_close_tree(loaded(args[0], pair=args[1], bias=kwargs["bias"], scale=kwargs["scale"]),
                      expected)


@pytest.mark.parametrize("loader", ["load", "load_in_python"])
def test_a_wrong_call_of_a_loaded_module_names_the_argument(saved, loader):
    _, args, kwargs, _, path = saved
    loaded = torchcap.load(path) if loader == "load" else load_in_python(path)
    with pytest.raises(TypeError, match="scale"):
        loaded(*args, bias=kwargs["bias"])  # scale missing
    # torchcap.load checks the call as a trace's module does (InputError);
    # the Python-only reader leaves it to forward's signature (TypeError).
    expected = "scale=Tensor, bias=Tensor" if loader == "load" else "positional"
    with pytest.raises(TypeError, match=expected):
        loaded(*args, kwargs["scale"], kwargs["bias"])  # keywords passed by position
    with pytest.raises(TypeError, match="scal"):
        loaded(*args, scal=kwargs["scale"], bias=kwargs["bias"])


def test_a_traced_function_with_star_args_names_them():
    def f(*inputs):
        return inputs[0] + inputs[1]
    gm = torchcap.trace(f, (torch.ones(2), torch.ones(2)))
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["inputs_0", "inputs_1"]


def test_signature_of_a_traced_module(saved):
    _, _, _, gm, _ = saved
    sig = torchcap.signature(gm)
    assert sig.call == "(x, pair, *, scale, bias)"
    assert sig.user_inputs == ["x", "pair_0", "pair_1", "scale", "bias"]
    first = sig.input_specs[0]
    assert (first.kind, first.argument, first.dtype, first.shape) == \
        ("user_input", "x", torch.float32, (4, 3))
    assert [s.argument for s in sig.input_specs[:5]] == \
        ["x", "pair[0]", "pair[1]", "scale", "bias"]
    assert sig.parameters == ["bn.weight", "bn.bias"]
    assert sig.buffers == ["bn.running_mean", "bn.running_var"]
    assert [(s.kind, s.target) for s in sig.output_specs] == \
        [("user_output", "['y']"), ("user_output", "['rest'][0]")]
    text = str(sig)
    assert "forward(x, pair, *, scale, bias)" in text and "parameter" in text


def test_signature_of_an_exported_training_module_lists_buffer_writes():
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)).train()
    ep = torchcap.export(m, (torch.randn(4, 3),))
    sig = torchcap.signature(ep)
    assert sig.user_inputs == ["input"] or sig.user_inputs == ["input_1"]
    written = sorted(sig.buffers_to_mutate.values())
    assert written == ["1.num_batches_tracked", "1.running_mean", "1.running_var"]
    assert [s.kind for s in sig.output_specs].count("user_output") == 1


def test_signature_of_a_loaded_and_an_optimized_module(saved, tmp_path):
    _, args, kwargs, gm, path = saved
    for module in (torchcap.load(path), load_in_python(path)):
        sig = torchcap.signature(module)
        assert sig.call == "(x, pair, *, scale, bias)"
        assert sig.parameters == ["bn.weight", "bn.bias"]
    resnet = torchvision.models.resnet18().eval()
    fast = torchcap.optimize_for_inference(torchcap.trace(resnet, (torch.randn(1, 3, 64, 64),)))
    sig = torchcap.signature(fast)
    assert sig.call == "(x)" and sig.user_inputs == ["x"]
    assert sig.input_specs[0].shape == (1, 3, 64, 64)


def test_signature_of_a_training_step():
    m = torch.nn.Linear(3, 2).train()
    step = torchcap.export_training(m, torch.nn.functional.mse_loss,
                                    (torch.randn(4, 3),), (torch.randn(4, 2),),
                                    optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    sig = torchcap.signature(step)
    assert [(s.kind, s.target) for s in sig.output_specs] == [
        ("loss_output", "['loss']"), ("parameter_mutation", "weight"),
        ("parameter_mutation", "bias")]
    assert sig.parameters == ["weight", "bias"]
    grads = torchcap.export_training(m, torch.nn.functional.mse_loss,
                                     (torch.randn(4, 3),), (torch.randn(4, 2),))
    assert [(s.kind, s.target) for s in torchcap.signature(grads).output_specs][1:] == [
        ("gradient_to_parameter", "weight"), ("gradient_to_parameter", "bias")]


def test_signature_refuses_a_plain_torch_fx_module():
    with pytest.raises(TypeError, match="not made by torchcap"):
        torchcap.signature(torch.fx.symbolic_trace(torch.nn.ReLU()))


@pytest.mark.parametrize("how", ["trace", "load", "load_in_python"])
def test_the_output_node_carries_meta_val(saved, how):
    _, _, _, gm, path = saved
    module = {"trace": lambda: gm, "load": lambda: torchcap.load(path),
              "load_in_python": lambda: load_in_python(path)}[how]()
    output = list(module.graph.nodes)[-1]
    assert output.op == "output"
    vals = output.meta["val"]
    assert [tuple(v.shape) for v in vals] == [(4, 3), (2,)]
    results = output.args[0]
    assert vals[0] is results[0].meta["val"] or vals[0] == results[0].meta["val"]


# --- The command --------------------------------------------------------------

def test_run_takes_inputs_by_name(saved, tmp_path):
    m, args, kwargs, _, path = saved
    files = {}
    for name, value in (("x", args[0]), ("scale", kwargs["scale"]), ("bias", kwargs["bias"]),
                        ("pair", args[1])):
        files[name] = str(tmp_path / f"{name}.pt")
        torch.save(value, files[name])
    out = str(tmp_path / "out.pt")
    run("run", path, "--input", f"bias={files['bias']}", "--input", f"x={files['x']}",
        "--input", f"pair={files['pair']}", "--input", f"scale={files['scale']}", "-o", out)
    expected = m(*args, **kwargs)
    got = torch.load(out)
    torch.testing.assert_close(got[0], expected["y"])
    torch.testing.assert_close(got[1], expected["rest"][0])
    # Placeholders by their own names, and in order, mix.
    run("run", path, "--input", files["x"], "--input", "pair_0=2", "--input", "pair_1=2",
        "--input", f"scale={files['scale']}", "--input", "bias=3")
    summary = json.loads(run("show", path, "--json").stdout)
    assert summary["call"] == "forward(x, pair, *, scale, bias)"
    assert "call: forward(x, pair, *, scale, bias)" in run("show", path).stdout


def test_run_names_a_wrong_input(saved, tmp_path):
    _, _, _, _, path = saved
    message = error_of("run", path, "--input", "scal=3", "--input", "4x3")
    assert "no input or argument 'scal'" in message and "scale" in message
    message = error_of("run", path, "--input", "x=4x3", "--input", "x=4x3")
    assert "given twice" in message
    message = error_of("run", path, "--input", "x=4x3")
    assert "no --input gives pair_0, pair_1, scale, bias" in message
