"""torchcap.export_training: a Python nn.Module's training step, captured by
the C++ tracer, trains as torch.optim trains it eagerly."""

import copy
import pickle
import re

import pytest
import torch
import torch.nn.functional as F

import torchcap
from thread_helpers import run_in_threads


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, 5, (4,), generator=g))
            for _ in range(n)]


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.8, 0.99)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_steps_equal_torch_optim(name):
    torch.manual_seed(0)
    model = Classifier().train()
    eager = copy.deepcopy(model)
    data = batches(8)
    make = OPTIMIZERS[name]
    step = torchcap.export_training(model, F.cross_entropy, (data[0][0],), (data[0][1],),
                                    optimizer=make(model.parameters()))
    eager_opt = make(eager.parameters())
    for x, y in data:
        eager_opt.zero_grad()
        loss = F.cross_entropy(eager(x), y)
        loss.backward()
        eager_opt.step()
        got = step(x, y)["loss"]
        # torch.optim's update, with the same operators: bit for bit.
        assert torch.equal(got, loss.detach()), (got, loss)
    state = dict(step.named_parameters())
    state.update(step.named_buffers())
    for n, p in eager.named_parameters():
        assert torch.equal(state[n], p.detach()), n
    # BatchNorm's running statistics (export's functional BatchNorm may round
    # the running variance's update differently, by an ulp).
    for n, b in eager.named_buffers():
        torch.testing.assert_close(state[n], b, rtol=1e-5, atol=1e-6, msg=n)


def test_signature_names_every_output():
    torch.manual_seed(0)
    model = Classifier().train()
    x, y = batches(1)[0]
    step = torchcap.export_training(model, F.cross_entropy, (x,), (y,),
                                    optimizer=torch.optim.Adam(model.parameters()))
    roles = step.training_signature
    assert roles[0] == ("loss", "loss", "", "")
    updates = [r for r in roles if r[0] == "parameter update"]
    assert sorted(r[2] for r in updates) == sorted(n for n, _ in model.named_parameters())
    states = {(r[3], r[2]) for r in roles if r[0] == "optimizer state"}
    assert ("exp_avg", "fc.weight") in states and ("exp_avg_sq", "conv.bias") in states
    assert ("step", "") in states
    assert {r[1] for r in roles if r[0] == "buffer update"} == {
        "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}


def test_gradients_without_optimizer():
    torch.manual_seed(0)
    model = Classifier().train()
    x, y = batches(1)[0]
    step = torchcap.export_training(model, F.cross_entropy, (x,), (y,))
    out = step(x, y)
    eager = copy.deepcopy(model)
    F.cross_entropy(eager(x), y).backward()
    assert set(out["gradients"]) == {n for n, _ in model.named_parameters()}
    for n, p in eager.named_parameters():
        torch.testing.assert_close(out["gradients"][n], p.grad, msg=n)
    assert [r[0] for r in step.training_signature].count("gradient") == 6


def test_saved_step_trains_on(tmp_path):
    torch.manual_seed(0)
    model = Classifier().train()
    data = batches(6)
    step = torchcap.export_training(model, F.cross_entropy, (data[0][0],), (data[0][1],),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.05,
                                                              momentum=0.9))
    straight = copy.deepcopy(step)
    expected = [straight(x, y)["loss"] for x, y in data]
    for x, y in data[:3]:
        step(x, y)
    torchcap.save(step, tmp_path / "step.tcg")
    loaded = torchcap.load(tmp_path / "step.tcg")
    for i, (x, y) in enumerate(data[3:], start=3):
        assert torch.equal(loaded(x, y)["loss"], expected[i]), i


def test_python_numbers_in_a_step_keep_eager_dtypes(tmp_path):
    """Issue 58: a loss that scales integer targets by a Python number
    computes in float32 in eager (0.5 is a wrapped number). The step keeps
    the number as a number, saved and loaded too; as a float64 constant the
    loss would compute in float64 after loading."""
    torch.manual_seed(0)

    def halves(out, y):
        return ((out - y * 0.5) ** 2).mean()

    model = torch.nn.Linear(3, 1).train()
    initial = copy.deepcopy(model)
    x, y = torch.randn(4, 3), torch.randint(0, 4, (4, 1))
    step = torchcap.export_training(model, halves, (x,), (y,),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    torchcap.save(step, tmp_path / "step.tcg")
    loaded = torchcap.load(tmp_path / "step.tcg")
    for module in (step, loaded):
        eager = copy.deepcopy(initial)
        eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
        for _ in range(3):
            eager_loss = halves(eager(x), y)
            assert eager_loss.dtype == torch.float32
            loss = module(x, y)["loss"]
            assert loss.dtype == torch.float32
            torch.testing.assert_close(loss, eager_loss.detach())
            eager_opt.zero_grad()
            eager_loss.backward()
            eager_opt.step()


def test_pickled_step_trains_on():
    # pickle carries a step, its optimizer state and its signature.
    torch.manual_seed(0)
    model = Classifier().train()
    data = batches(4)
    step = torchcap.export_training(model, F.cross_entropy, (data[0][0],), (data[0][1],),
                                    optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    step(*data[0])
    copied = pickle.loads(pickle.dumps(step))
    assert copied.training_signature == step.training_signature
    for x, y in data[1:]:
        assert torch.equal(copied(x, y)["loss"], step(x, y)["loss"])


@pytest.mark.parametrize("loaded", [False, True])
def test_steps_from_several_threads(tmp_path, loaded):
    # Note [Concurrent runs that write buffers back] in _codegen.py: steps
    # taken from 8 threads at once are each a whole step, as if taken one
    # after another (unserialized, about 240 of 800 BatchNorm updates were
    # kept, and the parameters' updates as few).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    eager = copy.deepcopy(model)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    step = torchcap.export_training(model, F.mse_loss, (x,), (y,),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    if loaded:
        torchcap.save(step, tmp_path / "step.tcg")
        step = torchcap.load(tmp_path / "step.tcg")
    assert run_in_threads(lambda: step(x, y), threads=8, calls=100) == []
    # 800 steps on the same batch: the same whatever the order of the threads.
    opt = torch.optim.SGD(eager.parameters(), lr=1e-3)
    for _ in range(800):
        opt.zero_grad()
        F.mse_loss(eager(x), y).backward()
        opt.step()
    state = dict(step.named_parameters())
    state.update(step.named_buffers())
    assert state["1.num_batches_tracked"].item() == 800
    for n, value in list(eager.named_parameters()) + list(eager.named_buffers()):
        torch.testing.assert_close(state[n], value.detach(), rtol=1e-4, atol=1e-5, msg=n)


def test_inputs_that_do_not_fit_are_refused():
    # Note [Inputs of the traced shapes] in _runtime.py: None, a NumPy array or
    # a number where the step takes a tensor, or a tensor of another dtype or
    # shape, is an InputError naming the input, before anything is updated.
    torch.manual_seed(0)
    model = Classifier().train()
    x, y = batches(1)[0]
    step = torchcap.export_training(model, F.cross_entropy, (x,), (y,),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.05))
    before = {n: t.clone() for n, t in step.state_dict().items()}
    calls = {"None": (None, y), "a numpy.ndarray": (x.numpy(), y), "an int (1)": (x, 1)}
    for got, args in calls.items():
        with pytest.raises(torchcap.InputError, match=rf"input \d \(ph_\d\): expected a tensor "
                                                      rf"[fi]\d\d\[[0-9, ]*\], got {re.escape(got)}\n"):
            step(*args)
    with pytest.raises(torchcap.InputError,
                       match=r"input 1 \(ph_1\): expected i64\[4\], got f32\[4\]"):
        step(x, y.float())
    for n, t in step.state_dict().items():
        assert torch.equal(t, before[n]), n
    assert torch.isfinite(step(x, y)["loss"])


def test_errors():
    model = Classifier().train()
    x, y = batches(1)[0]
    with pytest.raises(torchcap.TraceError, match="eval mode"):
        torchcap.export_training(copy.deepcopy(model).eval(), F.cross_entropy, (x,), (y,))
    with pytest.raises(torchcap.TraceError, match=r"one element; it has shape \[4\]"):
        torchcap.export_training(model, lambda out, t: F.cross_entropy(out, t, reduction="none"),
                                 (x,), (y,))
    with pytest.raises(torchcap.Error, match="2 parameter groups"):
        torchcap.export_training(model, F.cross_entropy, (x,), (y,), optimizer=torch.optim.SGD(
            [{"params": model.conv.parameters()}, {"params": list(model.bn.parameters()) +
                                                   list(model.fc.parameters())}], lr=0.1))
    with pytest.raises(torchcap.Error, match="misses fc.weight, fc.bias"):
        torchcap.export_training(model, F.cross_entropy, (x,), (y,), optimizer=torch.optim.SGD(
            list(model.conv.parameters()) + list(model.bn.parameters()), lr=0.1))
    with pytest.raises(torchcap.Error, match="RMSprop is not supported"):
        torchcap.export_training(model, F.cross_entropy, (x,), (y,),
                                 optimizer=torch.optim.RMSprop(model.parameters()))
    with pytest.raises(torchcap.TraceError, match="loss_fn must return a tensor"):
        torchcap.export_training(model, lambda out, t: 1.0, (x,), (y,))
    with pytest.raises(torchcap.TraceError, match="aten::igamma has no derivative"):
        torchcap.export_training(model, lambda out, t: torch.igamma(out.sigmoid() + 0.5,
                                                                    torch.ones(5)).mean(),
                                 (x,), (y,))
