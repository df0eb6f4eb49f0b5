"""Weightless graphs from Python: a module built with device="meta" traced by
torchcap.trace, saved without its weights, and loaded with weights bound by
torchcap.load(path, weights=state_dict); the errors of binding and of running
without weights; the file through `torchcap show` and `torchcap run --weights`."""

import os
import subprocess

import pytest
import torch
import torch.nn as nn

import torchcap
from gpt_decoder import Decoder


def mlp(device=None):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64, device=device), nn.GELU(),
                         nn.LayerNorm(64, device=device), nn.Linear(64, 8, device=device)).eval()


def meta(*shape):
    return torch.empty(*shape, device="meta")


@pytest.fixture()
def saved(tmp_path):
    """An MLP built on the meta device, traced and saved weightless."""
    gm = torchcap.trace(mlp("meta"), (meta(4, 16),))
    path = tmp_path / "mlp.tcg"
    torchcap.save(gm, path)
    return path


def test_a_meta_module_traces_saves_small_and_runs_like_eager_once_bound(saved):
    assert saved.stat().st_size < 8 << 10
    eager = mlp()
    gm = torchcap.load(saved, weights=eager.state_dict())
    assert not any(p.is_meta for p in gm.parameters())
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), eager(x), rtol=1e-5, atol=1e-6)
    # The weights are used as given, not copied.
    assert gm.get_parameter("0.weight").data_ptr() == eager[0].weight.data_ptr()


def test_meta_mode_traces_a_meta_module_for_cpu_inputs(tmp_path):
    # Meta mode records the devices a real run would use: the bound graph's
    # inputs are CPU tensors, as a real trace's would be.
    gm = torchcap.trace(mlp("meta"), (meta(4, 16),), meta=True)
    torchcap.save(gm, tmp_path / "mlp.tcg")
    eager = mlp()
    loaded = torchcap.load(tmp_path / "mlp.tcg", weights=eager.state_dict())
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), eager(x), rtol=1e-5, atol=1e-6)


def test_a_large_module_on_meta_saves_in_kilobytes(tmp_path):
    # 24 layers of 4096 x 4096: 403 M parameters, 1.6 GB of float32 if real.
    model = nn.Sequential(*[nn.Linear(4096, 4096, device="meta") for _ in range(24)])
    gm = torchcap.trace(model, (meta(1, 4096),))
    path = tmp_path / "wide.tcg"
    torchcap.save(gm, path)
    assert path.stat().st_size < 64 << 10, path.stat().st_size
    loaded = torchcap.load(path)
    assert sum(p.numel() for p in loaded.parameters()) == 24 * (4096 * 4096 + 4096)
    assert all(p.is_meta for p in loaded.parameters())


def test_a_decoder_on_meta_bound_to_a_checkpoint_equals_eager(tmp_path):
    torch.manual_seed(0)
    eager = Decoder(2, 64, 4, 100).eval()
    gm = torchcap.trace(Decoder(2, 64, 4, 100, device="meta").eval(),
                        (torch.zeros(1, 8, dtype=torch.long, device="meta"),))
    torchcap.save(gm, tmp_path / "decoder.tcg")
    loaded = torchcap.load(tmp_path / "decoder.tcg", weights=eager.state_dict())
    idx = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), eager(idx), rtol=0, atol=0)


def test_running_without_weights_is_refused_naming_them(saved):
    for gm in (torchcap.load(saved), torchcap.trace(mlp("meta"), (meta(4, 16),))):
        with pytest.raises(torchcap.WeightError) as e:
            gm(torch.randn(4, 16))
        message = str(e.value)
        assert "the module's weights are not bound: 6 attribute(s) hold no values" in message
        assert "parameter '0.weight' (f32[64, 16])" in message
        # On meta inputs the call only computes shapes.
        out = gm(meta(4, 16))
        assert out.is_meta and out.shape == (4, 8)


def test_weights_given_later_by_to_empty_and_load_state_dict(saved):
    gm = torchcap.load(saved)
    gm.to_empty(device="cpu")
    eager = mlp()
    gm.load_state_dict(eager.state_dict())
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), eager(x), rtol=1e-5, atol=1e-6)


def test_weight_errors_name_every_problem(saved):
    good = mlp().state_dict()

    def message(weights, **kwargs):
        with pytest.raises(torchcap.WeightError) as e:
            torchcap.load(saved, weights=weights, **kwargs)
        return str(e.value).replace(str(saved), "f.tcg")

    missing = dict(good)
    del missing["3.bias"]
    assert message(missing) == ("f.tcg: the weights do not fit the module's attributes:\n"
                                "  missing: parameter '3.bias' (f32[8])")
    assert message({**good, "0.weight": torch.zeros(16, 64)}) == (
        "f.tcg: the weights do not fit the module's attributes:\n"
        "  weight '0.weight' (parameter): expected f32[64, 16], got f32[16, 64]")
    assert message({**good, "2.weight": torch.zeros(64, dtype=torch.float64)}) == (
        "f.tcg: the weights do not fit the module's attributes:\n"
        "  weight '2.weight' (parameter): expected f32[64], got f64[64]")
    assert message({**good, "2.bias": meta(64)}) == (
        "f.tcg: the weights do not fit the module's attributes:\n"
        "  weight '2.bias' (parameter): the tensor is on the meta device: it has no values to "
        "bind")
    assert message({**good, "head.weight": torch.zeros(1)}) == (
        "f.tcg: the weights do not fit the module's attributes:\n"
        "  extra: weight 'head.weight' is not an attribute of the module (strict=False ignores "
        "such weights)")
    torchcap.load(saved, weights={**good, "head.weight": torch.zeros(1)}, strict=False)
    assert "a list" in message([torch.zeros(1)])


def test_the_command_says_a_file_is_weightless_and_runs_it_with_weights(saved, tmp_path):
    cli = os.environ.get("TORCHCAP_CLI")
    if not cli:
        pytest.skip("TORCHCAP_CLI is not set")
    shown = subprocess.run([cli, "show", str(saved)], capture_output=True, text=True, check=True)
    assert "weightless: 6 of the attributes (6.8 KiB) hold no values" in shown.stdout, shown.stdout

    refused = subprocess.run([cli, "run", str(saved)], capture_output=True, text=True)
    assert refused.returncode == 1
    assert "is weightless: 6 of its tensors (0.weight, ...) have no values in the file; give " \
           "them with --weights FILE" in refused.stderr, refused.stderr

    eager = mlp()
    x = torch.randn(4, 16)
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        expected = eager(x)
    # A torch.save'd dict, a TorchScript file, a .tcg file with the weights stored.
    torch.save(dict(eager.state_dict()), tmp_path / "weights.pt")
    torch.jit.script(eager).save(str(tmp_path / "model.pt"))
    torchcap.save(torchcap.trace(eager, (x,)), tmp_path / "full.tcg")
    for weights in ("weights.pt", "model.pt", "full.tcg"):
        out = tmp_path / "out.pt"
        subprocess.run([cli, "run", str(saved), "--weights", str(tmp_path / weights), "--input",
                        str(tmp_path / "x.pt"), "-o", str(out)], capture_output=True, text=True,
                       check=True)
        torch.testing.assert_close(torch.load(out), expected, rtol=1e-5, atol=1e-6, msg=weights)

    torch.save(eager.state_dict(), tmp_path / "ordered.pt")
    refused = subprocess.run([cli, "run", str(saved), "--weights", str(tmp_path / "ordered.pt")],
                             capture_output=True, text=True)
    assert refused.returncode == 1
    assert "holds an OrderedDict (a state dict), which LibTorch cannot read: save a plain dict " \
           "of tensors instead, torch.save(dict(model.state_dict()), path)" in refused.stderr, \
        refused.stderr

    torch.save({"0.weight": torch.zeros(3), "0.bias": torch.zeros(64)}, tmp_path / "wrong.pt")
    refused = subprocess.run([cli, "run", str(saved), "--weights", str(tmp_path / "wrong.pt")],
                             capture_output=True, text=True)
    assert refused.returncode == 1
    assert "weight '0.weight' (parameter): expected f32[64, 16], got f32[3]" in refused.stderr, \
        refused.stderr
