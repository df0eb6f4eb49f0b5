"""torchcap.profile: a module's runs timed per node by the C++ interpreter
(Interpreter::profile), on a torchvision model, traced and loaded."""

import json

import pytest
import torch
import torchvision

import torchcap


def test_profile_of_a_traced_and_a_loaded_module(tmp_path):
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        gm = torchcap.trace(model, (x,))
        p = torchcap.profile(gm, x, runs=3)
    assert isinstance(p, torchcap.Profile) and p.runs == 3
    assert str(p) == p.table() and p.table().startswith("3 runs, ")
    row = next(line.split() for line in p.table().splitlines() if line.startswith("aten::convolution "))
    assert int(row[1]) == 3 * 20  # ResNet-18's 20 convolutions, three runs
    targets = [t for _, t, _, _ in p.nodes]
    assert targets.count("aten::convolution") == 20
    assert all(ms >= 0 for _, _, _, ms in p.nodes)
    assert any(source.startswith("resnet.py:") for _, _, source, _ in p.nodes)
    events = json.loads(p.chrome_trace())["traceEvents"]
    assert [e["name"] for e in events] == [name for name, _, _, _ in p.nodes]
    torchcap.save(gm, tmp_path / "r18.tcg")
    loaded = torchcap.load(tmp_path / "r18.tcg")
    assert torchcap.profile(loaded, x, runs=1).runs == 1


def test_profile_refusals():
    model = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    gm = torchcap.trace(model, (x,))
    with pytest.raises(TypeError, match="module made by torchcap"):
        torchcap.profile(model, x)
    with pytest.raises(ValueError, match="runs must be at least 1"):
        torchcap.profile(gm, x, runs=0)
    with pytest.raises(torchcap.InputError, match="expected f32\\[3, 4\\]"):
        torchcap.profile(gm, torch.randn(5, 4))
