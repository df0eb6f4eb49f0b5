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
from thread_helpers import run_in_threads  # noqa: E402


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


def test_steps_from_several_threads(fixture):
    # Note [Concurrent runs that write buffers back] in _codegen.py: a step of
    # a file loaded in Python, taken from 8 threads at once, is each time a
    # whole step, as the C++ Interpreter's runs are; after them the state is
    # that of as many steps one after another (the same batch each time).
    x, y = unpickle(fixture / "data.pt")[0]
    step, straight = torchcap.load(fixture / "step.tcg"), torchcap.load(fixture / "step.tcg")
    assert run_in_threads(lambda: step(x, y), threads=8, calls=25) == []
    for _ in range(200):
        straight(x, y)
    state, expected = step.state_dict(), straight.state_dict()
    assert state["optimizer.step"].item() == 200.0
    for name, value in expected.items():
        torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-6, msg=name)
