"""A training step captured in C++ (torchcap::export_training), opened with
torchcap.load, trains in Python exactly as it trains in C++."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import torchcap  # noqa: E402


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    out = tmp_path_factory.mktemp("training_fixture")
    subprocess.run([os.environ["TORCHCAP_TRAINING_FIXTURE"], str(out)], check=True)
    return out


def unpickle(path):
    with open(path, "rb") as f:
        return torch.load(f)


def test_steps_in_python_equal_steps_in_cpp(fixture):
    step = torchcap.load(fixture / "step.tcg")
    data = unpickle(fixture / "data.pt")
    expected_losses, expected_state = unpickle(fixture / "expected.pt")
    losses = [step(x, y)["loss"] for x, y in data]
    assert len(losses) == len(expected_losses) == 6
    for i, (actual, expected) in enumerate(zip(losses, expected_losses)):
        assert torch.equal(actual, expected), f"step {i}: {actual} vs {expected}"
    assert losses[-1] < losses[0]
    # Parameters, Adam's moments and step count, BatchNorm's statistics.
    state = dict(step.named_parameters())
    state.update(step.named_buffers())
    assert set(state) == set(expected_state)
    assert state["optimizer.step"].item() == 6.0
    for name, value in expected_state.items():
        assert torch.equal(state[name].detach(), value), name


def test_a_saved_step_continues(fixture, tmp_path):
    data = unpickle(fixture / "data.pt")
    expected_losses, _ = unpickle(fixture / "expected.pt")
    step = torchcap.load(fixture / "step.tcg")
    for x, y in data[:3]:
        step(x, y)
    # The Python module's state (parameters, optimizer state) is the step's:
    # copied into a fresh load, training goes on where it stopped.
    again = torchcap.load(fixture / "step.tcg")
    again.load_state_dict(step.state_dict())
    for i, (x, y) in enumerate(data[3:], start=3):
        assert torch.equal(again(x, y)["loss"], expected_losses[i]), f"step {i}"
