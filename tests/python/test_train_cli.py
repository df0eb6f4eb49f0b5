"""The command's training: `trace --train` captures a TorchScript model's
training step, `run --steps` trains with it; both against eager training with
torch.optim, and their errors."""

import json
import os
import pty
import subprocess
import sys

import pytest
import torch
from cli_helpers import TORCHCAP, run, error_of


# Models scripted by python3 at test time: (name, class source, train mode).
MODELS = {
    "classifier": ("""
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
""", True),
    "cnn_bn": ("""
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 6 * 6, 2)
    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))
""", True),
    "eval_mode": ("""
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, x):
        return self.fc(x)
""", False),
    "unused_head": ("""
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 4)
        self.head = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.body(x)
""", True),
    # igamma has no derivative for its first argument in LibTorch 1.13.
    "igamma": ("""
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, x):
        return torch.igamma(torch.sigmoid(self.fc(x)) + 0.5, torch.ones(4))
""", True),
    "own_loss": ("""
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.fc(x), y)
""", True),
    "per_element_loss": ("""
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, x, y):
        return (self.fc(x) - y) ** 2
""", True),
    "pair": ("""
from typing import Tuple
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return y, y
""", True),
}


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_models")
    lines = ["import torch"]
    for name, (source, train) in MODELS.items():
        lines += [source.replace("class M(", f"class {name}_M("),
                  "torch.manual_seed(0)",
                  f"m = {name}_M()",
                  "m.train()" if train else "m.eval()",
                  f"torch.jit.script(m).save({str(out / (name + '.pt'))!r})"]
    (out / "make.py").write_text("\n".join(lines))
    subprocess.run([sys.executable, str(out / "make.py")], check=True)
    return out


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """x (8 x 8) and class indices y (8) in files, for the classifier."""
    out = tmp_path_factory.mktemp("train_data")
    torch.manual_seed(1)
    torch.save(torch.randn(8, 8), out / "x.pt")
    torch.save(torch.randint(0, 4, (8,)), out / "y.pt")
    torch.save(torch.randn(8, 4), out / "y_regression.pt")
    torch.save(torch.tensor([0, 1, 2, 3, 4, 0, 1, 2]), out / "y_out_of_range.pt")
    return out


def eager_steps(model_file, x, y, loss_fn, make_optimizer, steps):
    """Losses of `steps` steps of eager training with torch.optim, and the final state."""
    m = torch.jit.load(str(model_file))
    m.train()
    opt = make_optimizer([p for p in m.parameters()])
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, m


# --- trace --train -------------------------------------------------------------

def test_trace_train_text(models, data, tmp_path):
    out = run("trace", models / "classifier.pt", "--train", "--loss", "cross-entropy",
              "--input", data / "x.pt", "--target", data / "y.pt", "--optimizer", "sgd",
              "--lr", "0.1", "--momentum", "0.9", "-o", tmp_path / "step.tcg").stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"captured a training step of {models / 'classifier.pt'} "
                               "(cross-entropy loss, SGD lr=0.1 momentum=0.9): "), lines[0]
    assert lines[1] == "outputs: loss, 4 parameter updates, 4 optimizer state updates"
    assert lines[2].startswith("one step against eager LibTorch and torch::optim: loss ")
    assert lines[2].endswith("max |step - eager| = 0"), lines[2]
    assert lines[3] == f"saved {tmp_path / 'step.tcg'}"


@pytest.mark.parametrize("optimizer", [
    ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "0.01"],
    ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--nesterov"],
    ["--optimizer", "adam", "--lr", "0.01"],
    ["--optimizer", "adamw", "--lr", "0.01", "--betas", "0.8,0.99", "--amsgrad"],
    ["--optimizer", "none"],
])
def test_trace_train_equals_eager_step(models, optimizer):
    j = json.loads(run("trace", models / "cnn_bn.pt", "--train", "--loss", "mse", "--input",
                       "3x3x6x6", "--target", "3x2", *optimizer, "--json").stdout)
    assert j["max_abs_diff"] <= 1e-6, j
    assert j["roles"]["loss"] == 1
    # The operator histogram `trace --json` prints for any graph.
    assert sum(j["ops"].values()) == j["call_function"] and j["ops"]["aten::convolution"] == 1
    if optimizer[1] == "none":
        assert j["roles"]["gradient"] == 6 and j["roles"]["parameter update"] == 0
    else:
        assert j["roles"]["parameter update"] == 6
        # BatchNorm's running mean, variance and batch count.
        assert j["roles"]["buffer update"] == 3


def test_cross_entropy_random_targets_are_classes_of_the_model(models):
    # 10 random classes drawn for 4 outputs would fail in the loss.
    j = json.loads(run("trace", models / "classifier.pt", "--train", "--loss", "cross-entropy",
                       "--input", "64x8", "--target", "64", "--json").stdout)
    assert j["max_abs_diff"] == 0


def test_loss_computed_by_the_model(models, tmp_path):
    j = json.loads(run("trace", models / "own_loss.pt", "--train", "--loss", "model", "--input",
                       "5x8", "--input", "5x4", "--optimizer", "adam", "--json").stdout)
    assert j["max_abs_diff"] == 0 and j["loss"] == "model"


# --- run --steps ----------------------------------------------------------------

@pytest.fixture(scope="session")
def classifier_step(models, data, tmp_path_factory):
    path = tmp_path_factory.mktemp("step") / "step.tcg"
    run("trace", models / "classifier.pt", "--train", "--loss", "cross-entropy", "--input",
        data / "x.pt", "--target", data / "y.pt", "--lr", "0.1", "--momentum", "0.9", "-o", path)
    return path


def test_run_steps_equals_torch_optim(models, data, classifier_step):
    j = json.loads(run("run", classifier_step, "--steps", "20", "--input", data / "x.pt",
                       "--input", data / "y.pt", "--json").stdout)
    assert j["steps"] == 20 and len(j["losses"]) == 20 and j["time_ms"] > 0
    x, y = torch.load(data / "x.pt"), torch.load(data / "y.pt")
    expected, _ = eager_steps(models / "classifier.pt", x, y, torch.nn.functional.cross_entropy,
                              lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 20)
    assert j["losses"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert j["losses"][-1] < j["losses"][0] / 2


def test_run_steps_lines_and_saved_training(models, data, classifier_step, tmp_path):
    out = run("run", classifier_step, "--steps", "3", "--input", data / "x.pt", "--input",
              data / "y.pt", "-o", tmp_path / "trained.tcg").stdout.splitlines()
    assert [line.split(":")[0] for line in out[:3]] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(line.split(": loss ")[1] for line in out[:3])
    assert out[3].startswith("3 steps in ") and " -> " in out[3]
    assert out[4] == f"saved the trained step to {tmp_path / 'trained.tcg'}"
    # The saved step goes on where it stopped: 3 + 2 steps are 5 steps.
    five = json.loads(run("run", classifier_step, "--steps", "5", "--input", data / "x.pt",
                          "--input", data / "y.pt", "--json").stdout)["losses"]
    more = json.loads(run("run", tmp_path / "trained.tcg", "--steps", "2", "--input",
                          data / "x.pt", "--input", data / "y.pt", "--json").stdout)["losses"]
    assert more == five[3:]
    # ... and the trained parameters are the eager ones after 3 steps.
    x, y = torch.load(data / "x.pt"), torch.load(data / "y.pt")
    _, eager = eager_steps(models / "classifier.pt", x, y, torch.nn.functional.cross_entropy,
                           lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 3)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import torchcap
    trained = dict(torchcap.load(tmp_path / "trained.tcg").named_parameters())
    for name, p in eager.named_parameters():
        assert torch.allclose(trained[name], p, rtol=1e-5, atol=1e-6), name


def test_run_steps_progress_bar_on_a_terminal(data, classifier_step):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(TORCHCAP, [TORCHCAP, "run", str(classifier_step), "--steps", "4", "--input",
                            str(data / "x.pt"), "--input", str(data / "y.pt")])
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    text = b"".join(chunks).decode()
    assert "\r\x1b[K[" in text and "step 4/4" in text
    assert "step 1/4: loss" not in text  # no plain lines on a terminal


def classifier_eager_losses(models, batches, steps):
    """Eager SGD (lr 0.1, momentum 0.9) on the classifier, batch i % len for step i."""
    m = torch.jit.load(str(models / "classifier.pt"))
    m.train()
    opt = torch.optim.SGD(list(m.parameters()), lr=0.1, momentum=0.9)
    losses = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="session")
def batches(tmp_path_factory):
    """Three batches for the classifier: a --data file and the same as stacked --input files."""
    out = tmp_path_factory.mktemp("batches")
    torch.manual_seed(2)
    data = [(torch.randn(8, 8), torch.randint(0, 4, (8,))) for _ in range(3)]
    torch.save(data, out / "batches.pt")
    torch.save(torch.stack([x for x, _ in data]), out / "xs.pt")
    torch.save(torch.stack([y for _, y in data]), out / "ys.pt")
    return out, data


def test_run_steps_cycles_the_batches_of_data(models, classifier_step, batches):
    out, data = batches
    j = json.loads(run("run", classifier_step, "--steps", "7", "--data", out / "batches.pt",
                       "--json").stdout)
    assert j["batches"] == 3 and len(j["losses"]) == 7
    assert j["losses"] == pytest.approx(classifier_eager_losses(models, data, 7), rel=1e-5, abs=1e-6)
    # Different batches give different losses: not one batch seven times.
    assert len(set(j["losses"][:3])) == 3
    text = run("run", classifier_step, "--steps", "2", "--data", out / "batches.pt").stdout
    assert text.splitlines()[2].endswith(f"(3 batches from {out / 'batches.pt'})"), text


def test_run_steps_on_stacked_inputs(models, classifier_step, batches):
    out, data = batches
    stacked = json.loads(run("run", classifier_step, "--steps", "7", "--input", out / "xs.pt",
                             "--input", out / "ys.pt", "--json").stdout)
    listed = json.loads(run("run", classifier_step, "--steps", "7", "--data", out / "batches.pt",
                            "--json").stdout)
    assert stacked["batches"] == 3 and stacked["losses"] == listed["losses"]
    # A stack beside a single tensor: the stack's batch each step, the same targets.
    y = data[0][1]
    torch.save(y, out / "y0.pt")
    mixed = json.loads(run("run", classifier_step, "--steps", "4", "--input", out / "xs.pt",
                           "--input", out / "y0.pt", "--json").stdout)
    assert mixed["losses"] == pytest.approx(
        classifier_eager_losses(models, [(x, y) for x, _ in data], 4), rel=1e-5, abs=1e-6)
    # One batch, given as before: every step on it.
    one = json.loads(run("run", classifier_step, "--steps", "2", "--input", "8x8", "--input",
                         out / "y0.pt", "--json").stdout)
    assert one["batches"] == 1


def test_run_steps_batch_mistakes(classifier_step, batches, tmp_path):
    out, data = batches
    assert error_of("run", classifier_step, "--steps", "2", "--data", out / "batches.pt",
                    "--input", "8x8") == "give the batches with --data or with --input, not both"
    assert error_of("run", classifier_step, "--data", out / "batches.pt") == (
        "--data needs --steps: it holds batches for training steps")
    # (LibTorch 1.13 cannot read a one-element list back: two batches.)
    torch.save([(data[0][0],), (data[1][0],)], tmp_path / "short.pt")
    assert error_of("run", classifier_step, "--steps", "2", "--data", tmp_path / "short.pt") == (
        f"--data {tmp_path / 'short.pt'}: batch 0 is a tuple of 1; the step takes 2 tensor(s) "
        "per batch (the model's inputs, then its targets)")
    torch.save({"x": data[0][0], "y": data[0][1]}, tmp_path / "dict.pt")
    assert error_of("run", classifier_step, "--steps", "2", "--data", tmp_path / "dict.pt") == (
        f"--data {tmp_path / 'dict.pt'}: expected a list of batches (torch.save([(x, y), ...])), "
        "got a dict")
    torch.save([], tmp_path / "empty.pt")
    assert error_of("run", classifier_step, "--steps", "2", "--data", tmp_path / "empty.pt") == (
        f"--data {tmp_path / 'empty.pt'}: the list of batches is empty")
    torch.save(torch.stack([y for _, y in data][:2]), tmp_path / "ys2.pt")
    assert error_of("run", classifier_step, "--steps", "2", "--input", out / "xs.pt", "--input",
                    tmp_path / "ys2.pt") == (
        f"--input '{tmp_path / 'ys2.pt'}' holds a stack of 2 batches and --input "
        f"'{out / 'xs.pt'}' one of 3; stacked inputs must hold as many batches")
    # A batch of the wrong shape is named, after the steps before it ran.
    torch.save([data[0], (torch.randn(5, 8), data[1][1])], tmp_path / "odd.pt")
    message = error_of("run", classifier_step, "--steps", "3", "--data", tmp_path / "odd.pt")
    assert message.startswith(f"batch 1 (2 batches from {tmp_path / 'odd.pt'}): inputs do not "
                              "match the graph"), message
    assert "[5, 8]" in message and "[8, 8]" in message, message


# --- show -----------------------------------------------------------------------

def roles_of(step):
    """`show`'s role lines, without their output indices, which must count up from 0."""
    out = run("show", step).stdout
    head, marker, table = out.partition("training step, outputs by role:\n")
    assert head.startswith("nodes: ") and marker, out
    lines = table.splitlines()
    assert [line.split()[0] for line in lines] == [str(i) for i in range(len(lines))], lines
    return [line.strip().split("  ", 1)[1] for line in lines]


def test_show_names_the_roles_of_a_training_step(models, classifier_step, tmp_path):
    params = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    roles = roles_of(classifier_step)
    assert roles[0] == "loss"
    assert sorted(roles[1:]) == sorted([f"parameter update  {p}" for p in params] +
                                       [f"optimizer state  momentum_buffer of {p}" for p in params])
    # Adam's step count, BatchNorm's statistics; gradients of a step without optimizer.
    run("trace", models / "cnn_bn.pt", "--train", "--loss", "mse", "--input", "3x3x6x6",
        "--target", "3x2", "--optimizer", "adam", "-o", tmp_path / "adam.tcg")
    roles = roles_of(tmp_path / "adam.tcg")
    assert "optimizer state  step" in roles and "optimizer state  exp_avg_sq of conv.weight" in roles
    assert {"buffer update  bn.running_mean", "buffer update  bn.running_var",
            "buffer update  bn.num_batches_tracked"} <= set(roles)
    assert roles.count("loss") == 1 and len(roles) == 1 + 6 + 13 + 3
    run("trace", models / "cnn_bn.pt", "--train", "--loss", "mse", "--input", "3x3x6x6",
        "--target", "3x2", "--optimizer", "none", "-o", tmp_path / "grads.tcg")
    roles = roles_of(tmp_path / "grads.tcg")
    assert roles[0] == "loss" and "gradient  conv.weight" in roles and "gradient  fc.bias" in roles
    assert not any(r.startswith("parameter update") for r in roles)


def test_show_json_lists_the_roles(classifier_step, tmp_path):
    j = json.loads(run("show", classifier_step, "--json").stdout)
    roles = j["training_step"]
    assert roles[0] == {"output": 0, "role": "loss"}
    assert [r["output"] for r in roles] == list(range(len(roles))) and len(roles) == 9
    assert any(r == {"output": r["output"], "role": "parameter update", "target": "fc1.weight",
                     "parameter": "fc1.weight"} for r in roles), roles
    assert any(r == {"output": r["output"], "role": "optimizer state",
                     "target": "optimizer.momentum_buffer.fc2.bias", "parameter": "fc2.bias",
                     "state": "momentum_buffer"} for r in roles), roles
    # Other graphs have no roles.
    run("trace", "--example", "mlp", "-o", tmp_path / "mlp.tcg")
    assert "training_step" not in json.loads(run("show", tmp_path / "mlp.tcg", "--json").stdout)
    assert "training step" not in run("show", tmp_path / "mlp.tcg").stdout


# --- errors --------------------------------------------------------------------

def test_model_in_eval_mode(models):
    message = error_of("trace", models / "eval_mode.pt", "--train", "--loss", "mse", "--input",
                       "2x8", "--target", "2x4")
    assert message.startswith(f"{models / 'eval_mode.pt'} is in eval mode"), message
    assert "call .train() on the model before torch.jit.save" in message


def test_loss_not_a_scalar(models):
    message = error_of("trace", models / "per_element_loss.pt", "--train", "--loss", "model",
                       "--input", "3x8", "--input", "3x4")
    assert message == ("export_training: the loss must be a tensor with one element; it has "
                       "shape [3, 4]"), message


def test_parameters_without_gradient_are_named(models):
    message = error_of("trace", models / "unused_head.pt", "--train", "--loss", "mse", "--input",
                       "2x8", "--target", "2x4")
    assert "no gradient reaches parameter(s) head.weight, head.bias" in message, message


def test_operator_without_derivative(models):
    message = error_of("trace", models / "igamma.pt", "--train", "--loss", "mse", "--input",
                       "2x8", "--target", "2x4")
    assert message.startswith("export_training: the operator aten::igamma has no derivative in "
                              "LibTorch (the derivative for 'igamma: input' is not implemented)"), \
        message
    assert "compute it on detached tensors" in message


def test_wrong_target_shapes(models, data):
    message = error_of("trace", models / "classifier.pt", "--train", "--loss", "mse", "--input",
                       "2x8", "--target", "2x5")
    assert message == ("--target '2x5': MSE compares the model's output, of shape [2, 4], with a "
                       "target of the same shape; the target has shape [2, 5]")
    message = error_of("trace", models / "classifier.pt", "--train", "--loss", "cross-entropy",
                       "--input", "2x8", "--target", "3")
    assert message == ("--target '3': cross-entropy takes class indices of shape [2] (the output's "
                       "shape [2, 4] without its class dimension) with values in [0, 4), or class "
                       "probabilities of shape [2, 4]; the target has shape [3]")
    message = error_of("trace", models / "classifier.pt", "--train", "--loss", "cross-entropy",
                       "--input", data / "x.pt", "--target", data / "y_out_of_range.pt")
    assert message == (f"--target '{data / 'y_out_of_range.pt'}': class index 4 is out of range: "
                       "the model's output has 4 classes")


def test_wrong_target_for_run_steps(data, classifier_step):
    message = error_of("run", classifier_step, "--steps", "2", "--input", data / "x.pt",
                       "--input", "5:int64")
    assert "ph_1" in message or "input 1" in message, message
    assert "[5]" in message and "[8]" in message, message


def test_target_and_loss_mistakes(models):
    assert error_of("trace", models / "classifier.pt", "--train", "--input", "2x8") == (
        "trace --train: choose the loss with --loss cross-entropy, --loss mse or --loss model")
    assert error_of("trace", models / "classifier.pt", "--train", "--loss", "mse", "--input",
                    "2x8") == "--loss mse takes one --target, got 0"
    assert error_of("trace", models / "classifier.pt", "--loss", "mse", "--input", "2x8") == (
        "--loss, --target and the optimizer's options need --train")
    assert error_of("trace", models / "pair.pt", "--train", "--loss", "mse", "--input", "2x8",
                    "--target", "2x4").startswith("--loss mse needs a model that returns one tensor")
    assert error_of("trace", models / "own_loss.pt", "--train", "--loss", "model", "--input", "2x8",
                    "--input", "2x4", "--target", "2x4").startswith("--loss model takes no --target")


def test_optimizer_option_mistakes(models):
    base = ["trace", models / "classifier.pt", "--train", "--loss", "mse", "--input", "2x8",
            "--target", "2x4"]
    assert error_of(*base, "--optimizer", "adam", "--momentum", "0.9") == (
        "--momentum is not an option of --optimizer adam (it takes --lr, --betas, --eps, "
        "--weight-decay, --amsgrad)")
    assert error_of(*base, "--lr", "-1") == "--lr must be a positive number, got -1"
    assert error_of(*base, "--optimizer", "adam", "--betas", "0.9") == (
        "--betas takes two numbers, e.g. --betas 0.9,0.999")
    assert error_of(*base, "--nesterov") == (
        "--nesterov needs a --momentum above 0 and no --dampening (as torch::optim::SGD)")
    assert "--optimizer" in error_of(*base, "--optimizer", "rmsprop", code=2)


def test_steps_on_a_graph_that_is_not_a_step(tmp_path):
    run("trace", "--example", "mlp", "-o", tmp_path / "mlp.tcg")
    message = error_of("run", tmp_path / "mlp.tcg", "--steps", "3", "--input", "4x16")
    assert message.startswith(f"'{tmp_path / 'mlp.tcg'}' is not a training step"), message
    assert error_of("run", tmp_path / "mlp.tcg", "--steps", "0") == "--steps must be 1 or more, got 0"
