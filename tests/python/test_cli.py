"""The torchcap command: every subcommand, its JSON, and its errors."""

import collections
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from cli_helpers import TORCHCAP, run, error_of, script_model

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="session")
def torchvision_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("torchvision")
    subprocess.run([sys.executable, str(HERE / "make_torchvision_models.py"), str(out)], check=True)
    return out


@pytest.fixture(scope="session")
def mlp_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mlp") / "mlp.tcg"
    run("trace", "--example", "mlp", "-o", path)
    return path


# --- examples and trace ---------------------------------------------------------

def test_examples_lists_the_zoo():
    out = run("examples").stdout
    for name in ["mlp", "resnet18", "transformer_encoder", "nested_io"]:
        assert name in out


def test_trace_example_text(tmp_path):
    out = run("trace", "--example", "mlp", "-o", tmp_path / "m.tcg").stdout
    assert out.startswith("traced mlp: 11 nodes (1 placeholder, 4 get_attr, 5 call_function, 1 output) in ")
    assert "max |graph - eager| = 0" in out
    assert (tmp_path / "m.tcg").exists()


def test_trace_json_schema():
    j = json.loads(run("trace", "--example", "cnn_bn_eval", "--json").stdout)
    assert set(j) == {"nodes", "placeholders", "get_attr", "call_function", "outputs", "ops",
                      "trace_ms", "max_abs_diff"}
    assert j["placeholders"] == 1 and j["outputs"] == 1
    assert j["nodes"] == j["placeholders"] + j["get_attr"] + j["call_function"] + 1
    assert sum(j["ops"].values()) == j["call_function"]
    assert j["ops"]["aten::convolution"] == 2
    assert j["trace_ms"] > 0
    assert j["max_abs_diff"] <= 1e-5


def test_trace_removes_dead_code_unless_asked_to_keep_it():
    # Eval-mode BatchNorm's decomposition makes empty statistics nothing reads.
    trimmed = json.loads(run("trace", "--example", "cnn_bn_eval", "--json").stdout)
    kept = json.loads(run("trace", "--example", "cnn_bn_eval", "--keep-dead", "--json").stdout)
    assert "aten::empty.memory_format" not in trimmed["ops"]
    assert kept["ops"]["aten::empty.memory_format"] == 2
    assert kept["call_function"] == trimmed["call_function"] + 2
    assert trimmed["max_abs_diff"] <= 1e-5 and kept["max_abs_diff"] <= 1e-5


def test_trace_runs_the_passes_named(tmp_path):
    # --passes replaces the default (dce): cse alone leaves the dead statistics.
    cse = json.loads(run("trace", "--example", "cnn_bn_eval", "--passes", "cse", "--json").stdout)
    cleanup = json.loads(run("trace", "--example", "cnn_bn_eval", "--passes", "cleanup",
                             "--json").stdout)
    assert cse["ops"]["aten::empty.memory_format"] == 2
    assert "aten::empty.memory_format" not in cleanup["ops"]
    assert cse["max_abs_diff"] <= 1e-5 and cleanup["max_abs_diff"] <= 1e-5
    bad = run("trace", "--example", "cnn_bn_eval", "--passes", "cse,fold", check=False)
    assert bad.returncode != 0
    assert "unknown pass 'fold'; the passes are: dce, cse, shapes, fold_bn, " in bad.stderr
    both = run("trace", "--example", "cnn_bn_eval", "--passes", "dce", "--keep-dead", check=False)
    assert both.returncode != 0 and "excludes" in both.stderr
    assert "cleanup: cse, then dce" in run("trace", "--help").stdout


def test_trace_export_is_functional(tmp_path):
    j = json.loads(run("trace", "--example", "cnn_bn_train", "--export", "--json",
                       "-o", tmp_path / "e.tcg").stdout)
    assert j["max_abs_diff"] <= 1e-5
    assert not any(op.endswith("_") or op.endswith("_.Scalar") or op.endswith("_.Tensor") for op in j["ops"])
    assert j["outputs"] == 7  # the result and six buffer updates
    graph = run("show", tmp_path / "e.tcg", "--graph").stdout
    assert "buffer mutation -> bn1.running_mean" in graph


def test_trace_inference_preserve(tmp_path):
    j = json.loads(run("trace", "--example", "transformer_encoder", "--inference",
                       "--preserve", "aten::layer_norm", "--json").stdout)
    assert j["ops"].get("aten::layer_norm") == 2
    assert "aten::native_layer_norm" not in j["ops"]


def test_trace_example_with_given_inputs(tmp_path):
    x = tmp_path / "x.pt"
    torch.save(torch.randn(4, 16), x)
    j = json.loads(run("trace", "--example", "mlp", "--input", x, "--json").stdout)
    assert j["max_abs_diff"] <= 1e-5


# --- show ------------------------------------------------------------------------

def test_show_summary_text(mlp_file):
    out = run("show", mlp_file).stdout
    assert "nodes: 11 (placeholder 1, get_attr 4, call_function 5, output 1)" in out
    assert "parameters: 4 (" in out
    assert "inputs: f32[4, 16]" in out
    assert "aten::addmm" in out


def test_show_summary_json(mlp_file):
    j = json.loads(run("show", mlp_file, "--summary", "--json").stdout)
    assert j["nodes"] == 11 and j["call_function"] == 5
    assert j["parameters"] == {"count": 4, "bytes": (32 * 16 + 32 + 10 * 32 + 10) * 4}
    assert j["inputs"] == ["f32[4, 16]"]
    assert j["ops"] == {"aten::addmm": 2, "aten::relu": 1, "aten::t": 2}


def test_show_graph_code_dot(mlp_file):
    graph = run("show", mlp_file, "--graph").stdout
    assert "%addmm : f32[4, 32] [users=1] = aten::addmm(%fc1_bias, %ph_0, %t)" in graph
    code = run("show", mlp_file, "--code").stdout
    assert "def forward(self, ph_0):" in code and "torch.ops.aten.addmm.default(" in code
    dot = run("show", mlp_file, "--dot").stdout
    assert dot.startswith("digraph torchcap {") and '"ph_0" -> "addmm";' in dot


def test_show_svg(mlp_file, tmp_path):
    svg = tmp_path / "g.svg"
    out = run("show", mlp_file, "--svg", svg).stdout
    # One line: the file, Graphviz's time and what was drawn.
    assert re.fullmatch(rf"rendered {re.escape(str(svg))} in [0-9.]+ m?s: all 11 nodes in 2 module clusters, "
                        r"4 attributes inside the box of their reader\n", out), out
    text = svg.read_text()
    assert "<svg" in text and "addmm" in text


# --- pictures (show --svg, --dot; src/graph/dot.cpp) ----------------------------

def test_show_svg_groups_nodes_by_module(torchvision_models, tmp_path):
    tcg, svg = tmp_path / "r18.tcg", tmp_path / "r18.svg"
    run("trace", torchvision_models / "resnet18.pt", "--input", "1x3x224x224", "-o", tcg)
    out = run("show", tcg, "--svg", svg).stdout
    assert re.fullmatch(r"rendered \S+ in [0-9.]+ m?s: all 195 nodes in 75 module clusters, "
                        r"102 attributes inside the box of their reader\n", out), out
    text = svg.read_text()
    # Clusters are labelled by module path and class, nested as the calls were.
    for label in ("layer1 (Sequential)", "layer1.0 (BasicBlock)", "layer1.0.conv1 (Conv2d)", "fc (Linear)"):
        assert f">{label}</text>" in text, label
    dot = run("show", tcg, "--dot").stdout
    layer1 = dot.index('label="layer1 (Sequential)"')
    assert dot.index('label="layer1.0 (BasicBlock)"') > layer1


def test_show_svg_module_level(torchvision_models, tmp_path):
    tcg, svg = tmp_path / "r18.tcg", tmp_path / "r18.svg"
    run("trace", torchvision_models / "resnet18.pt", "--input", "1x3x224x224", "-o", tcg)
    out = run("show", tcg, "--svg", svg, "--depth", "2").stdout
    assert re.fullmatch(r"rendered \S+ in [0-9.]+ m?s: 14 modules and 3 other nodes of 195 nodes at module "
                        r"depth 2; --all-nodes draws every node, --depth N another depth\n", out), out
    text = svg.read_text()
    assert ">layer1.0 (BasicBlock)</text>" in text and ">9 operators</text>" in text
    assert ">layer1.0.conv1 (Conv2d)</text>" not in text  # inside its block's box
    # Above the budget the deepest depth that fits is chosen without asking.
    res = run("show", tcg, "--svg", svg, "--budget", "30")
    assert "at module depth 2" in res.stdout and res.stderr == ""
    res = run("show", tcg, "--svg", svg, "--budget", "30", "--all-nodes")
    assert "all 195 nodes" in res.stdout
    assert "beyond the budget (30 boxes" in res.stderr  # said before Graphviz starts
    # --dot prints the source; what was drawn goes to stderr.
    res = run("show", tcg, "--dot", "--depth", "1")
    assert res.stdout.startswith("digraph torchcap {")
    assert res.stderr.startswith("drew 10 modules and 3 other nodes of 195 nodes at module depth 1")


def test_show_picture_of_a_training_step(tmp_path):
    model, _ = script_model(tmp_path, [
        "import torch",
        "class M(torch.nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.fc1 = torch.nn.Linear(8, 16)",
        "        self.fc2 = torch.nn.Linear(16, 4)",
        "    def forward(self, x):",
        "        return self.fc2(torch.relu(self.fc1(x)))",
    ], "m.pt")
    step = tmp_path / "step.tcg"
    run("trace", model, "--train", "--loss", "mse", "--input", "8x8", "--target", "8x4",
        "--optimizer", "adam", "-o", step)
    dot = run("show", step, "--dot").stdout
    # Three regions, in order, each holding its part of the step.
    regions = [dot.index(f'label="{name}') for name in ("forward", "backward", "optimizer")]
    assert regions == sorted(regions)
    # A step's nodes record no module calls: they go to the module whose
    # parameters they read (Note [Modules of nodes without a module stack]).
    assert 'label="fc1"' in dot[regions[0]:regions[1]]
    assert 'label="fc2"' in dot[regions[1]:regions[2]]  # the gradient back through fc2 reads its weight
    out = run("show", step, "--svg", tmp_path / "step.svg").stdout
    assert "a training step's forward, backward and optimizer as regions" in out
    # Over the budget, backward and optimizer fold into a box each.
    res = run("show", step, "--dot", "--budget", "10")
    assert "the backward pass and the optimizer as one box each" in res.stderr


def test_show_picture_options_are_refused_where_they_do_nothing(mlp_file, tmp_path):
    assert error_of("show", mlp_file, "--depth", "2") == \
        "--all-nodes, --depth and --budget choose what --svg or --dot draws; give one of them"
    assert error_of("show", mlp_file, "--timeout", "5") == "--timeout bounds --svg's rendering; give --svg"
    assert error_of("show", mlp_file, "--memory", "--budget", "5") == \
        "--all-nodes, --depth and --budget draw a graph, not --memory's plan"
    assert error_of("show", mlp_file, "--dot", "--depth", "1", "--all-nodes", code=2) == \
        "--all-nodes excludes --depth (see torchcap --help)"


def test_show_svg_timeout_leaves_no_file(torchvision_models, tmp_path):
    tcg, svg = tmp_path / "r18.tcg", tmp_path / "r18.svg"
    run("trace", torchvision_models / "resnet18.pt", "--input", "1x3x224x224", "-o", tcg)
    message = error_of("show", tcg, "--svg", svg, "--all-nodes", "--timeout", "0.001")
    assert message.startswith(f"Graphviz did not finish drawing '{svg}' in --timeout "), message
    assert "draw fewer (--depth N, --budget N, without --all-nodes) or allow longer" in message
    assert list(tmp_path.iterdir()) == [tcg]


# --- run -------------------------------------------------------------------------

def test_run_random_inputs(mlp_file):
    out = run("run", mlp_file).stdout
    assert "output 0: f32[4, 10]" in out and "checksum:" in out and "time:" in out


def test_run_shapes_take_the_graph_dtype(tmp_path):
    # Token ids: a shape without a dtype makes int64 ids (0 to 9), not floats.
    path = tmp_path / "tied.tcg"
    run("trace", "--example", "tied_weights", "-o", path)
    out = run("run", path, "--input", "2x6").stdout
    assert "output 0: f32[2, 6, " in out
    assert "expected i64[2, 6], got f32[2, 6]" in error_of("run", path, "--input", "2x6:float32")


def test_weights_that_would_be_ignored_are_refused(mlp_file, tmp_path):
    unrelated = tmp_path / "unrelated.pt"
    torch.save({"encoder.weight": torch.zeros(2), "encoder.bias": torch.zeros(2)}, unrelated)
    message = error_of("run", mlp_file, "--weights", unrelated)
    assert message.startswith(f"--weights {unrelated}: none of its 2 tensors ('encoder.bias', ...) "
                              f"names an attribute of '{mlp_file}'"), message
    assert error_of("run", mlp_file, "--weights", unrelated, "--steps", "1").startswith(
        "--weights does not apply to --steps")


def test_output_paths_are_checked_before_any_work(mlp_file, tmp_path):
    missing = tmp_path / "no" / "such" / "g.tcg"
    assert error_of("trace", "--example", "mlp", "-o", missing) == \
        f"-o {missing}: no such directory '{missing.parent}'"
    assert error_of("run", mlp_file, "-o", tmp_path) == f"-o {tmp_path}: is a directory; give a file name"


def test_run_json_and_outputs(mlp_file, tmp_path):
    x = tmp_path / "x.pt"
    torch.save(torch.randn(4, 16), x)
    y = tmp_path / "y.pt"
    j = json.loads(run("run", mlp_file, "--input", x, "-o", y, "--json").stdout)
    assert j["outputs"] == [{"shape": [4, 10], "dtype": "float32"}]
    assert j["time_ms"] >= 0
    result = torch.load(y)
    assert abs(result.double().sum().item() - j["checksum"]) < 1e-6


# --- TorchScript models no one here wrote ------------------------------------------

@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_torchvision_models(torchvision_models, tmp_path, name):
    model = torchvision_models / f"{name}.pt"
    x = torchvision_models / f"{name}_input.pt"
    expected = torch.load(torchvision_models / f"{name}_expected.pt")
    out = tmp_path / f"{name}.tcg"
    j = json.loads(run("trace", model, "--input", x, "-o", out, "--json").stdout)
    assert j["max_abs_diff"] <= 1e-4
    assert j["ops"]["aten::convolution"] >= 20
    y = tmp_path / "y.pt"
    run("run", out, "--input", x, "-o", y)
    torch.testing.assert_close(torch.load(y), expected, rtol=1e-4, atol=1e-4)


def test_torchvision_export(torchvision_models, tmp_path):
    x = torchvision_models / "resnet18_input.pt"
    j = json.loads(run("trace", torchvision_models / "resnet18.pt", "--input", x, "--export",
                       "--json").stdout)
    assert j["max_abs_diff"] <= 1e-4


def test_torchvision_scripted_dynamic_batch(torchvision_models, tmp_path):
    # A scripted model no one here wrote, traced once with a dynamic batch,
    # run by the command at other batches against the scripted model.
    scripted = torch.jit.load(str(torchvision_models / "mobilenet_v2.pt"))
    out = tmp_path / "dynamic.tcg"
    j = json.loads(run("trace", torchvision_models / "mobilenet_v2.pt", "--input", "2x3x64x64",
                       "--dynamic", "0:0=batch[1:8]", "-o", out, "--json").stdout)
    assert j["max_abs_diff"] <= 1e-4
    assert json.loads(run("show", out, "--json").stdout)["symbols"] == ["s0 (batch) in [1, 8]"]
    for batch in (1, 3, 8):
        x, y = tmp_path / "x.pt", tmp_path / "y.pt"
        torch.save(torch.randn(batch, 3, 64, 64), x)
        run("run", out, "--input", x, "-o", y)
        with torch.no_grad():
            torch.testing.assert_close(torch.load(y), scripted(torch.load(x)), rtol=1e-4, atol=1e-4)
    assert "outside the range [1, 8] of s0 (batch)" in error_of("run", out, "--input", "9x3x64x64")


def test_torchvision_meta_mode(torchvision_models, tmp_path):
    # Shapes only, nothing computed, no check; the graph is the real trace's.
    model = torchvision_models / "resnet18.pt"
    out = tmp_path / "meta.tcg"
    text = run("trace", model, "--input", "1x3x224x224", "--meta", "-o", out).stdout
    assert "not checked against the model (--meta: nothing was computed)" in text
    real = tmp_path / "real.tcg"
    run("trace", model, "--input", "1x3x224x224", "-o", real)
    assert run("show", out, "--graph").stdout == run("show", real, "--graph").stdout
    # The graph holds the model's weights: it runs like the model.
    x = torchvision_models / "resnet18_input.pt"
    y = tmp_path / "y.pt"
    run("run", out, "--input", x, "-o", y)
    expected = torch.load(torchvision_models / "resnet18_expected.pt")
    torch.testing.assert_close(torch.load(y), expected, rtol=1e-4, atol=1e-4)
    j = json.loads(run("trace", model, "--input", "1x3x224x224", "--meta", "--export",
                       "--json").stdout)
    assert j["max_abs_diff"] is None and j["ops"]["aten::convolution"] == 20


def test_meta_mode_data_dependent_operator(tmp_path):
    model, _ = script_model(tmp_path, [
        "import torch",
        "class M(torch.nn.Module):",
        "    def forward(self, x):",
        "        return x[x > 0]",
    ], "mask.pt")
    result = run("trace", model, "--input", "4", "--meta", check=False)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert "depends on tensor values, and in meta mode tensors have no values" in lines[0]
    assert lines[-1] == "    return x[x > 0]"


# --- errors: one line, non-zero exit --------------------------------------------------

def test_unknown_flag():
    assert "--bogus" in error_of("trace", "--bogus", code=2)


def test_unknown_subcommand():
    error_of("frobnicate", code=2)


def test_json_with_another_form_is_a_usage_error(mlp_file):
    # --json prints the summary (or the memory plan); with another form it
    # would be ignored without a word.
    for form in ("--graph", "--code", "--dot"):
        assert "excludes" in error_of("show", mlp_file, form, "--json", code=2)


def test_missing_file():
    message = error_of("show", "/nonexistent/model.tcg")
    assert "/nonexistent/model.tcg" in message


def test_damaged_file(mlp_file, tmp_path):
    damaged = tmp_path / "damaged.tcg"
    data = bytearray(mlp_file.read_bytes())
    damaged.write_bytes(bytes(data[: len(data) // 2]))
    message = error_of("run", damaged)
    assert "damaged.tcg" in message and "byte" in message


def test_flipped_bit_in_a_weight(mlp_file, tmp_path):
    data = bytearray(mlp_file.read_bytes())
    data[-5] ^= 0x04  # inside the last tensor's bytes: the file stays well formed
    damaged = tmp_path / "flipped.tcg"
    damaged.write_bytes(bytes(data))
    for command in ("show", "run"):
        message = error_of(command, damaged)
        assert message.startswith(f"{damaged}: byte "), message
        assert "its bytes are damaged: their CRC-32 is 0x" in message, message


def test_not_torchscript(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    message = error_of("trace", junk, "--input", "2x2")
    assert message == f"{junk} is not a TorchScript file (torch.jit.save writes a zip archive)"


def test_bad_shape_string(torchvision_models):
    message = error_of("trace", torchvision_models / "resnet18.pt", "--input", "1x3xfoo")
    assert message == ("--input '1x3xfoo' is neither a shape such as 1x3x224x224[:float32] "
                       "nor a readable file")


def test_bad_dtype():
    message = error_of("trace", "--example", "mlp", "--input", "4x16:float7")
    assert "unknown dtype 'float7'" in message


def test_wrong_input_count(torchvision_models):
    message = error_of("trace", torchvision_models / "resnet18.pt", "--input", "1x3x224x224",
                       "--input", "1x3x224x224")
    assert "takes 1 input(s), got 2 --input" in message


def test_error_inside_the_model(torchvision_models):
    # The summary on one line, then the model's frames as Python prints them.
    result = run("trace", torchvision_models / "resnet18.pt", "--input", "2x3", check=False)
    assert result.returncode == 1
    lines = result.stderr.rstrip("\n").splitlines()
    assert lines[0] == ("torchcap: error: the model failed: Expected 3D (unbatched) or 4D (batched) "
                        "input to conv2d, but got input of size: [2, 3]")
    assert lines[1].startswith('  File "') and "resnet.py" in lines[1] and "in forward" in lines[1]
    assert lines[2] == "    return self._forward_impl(x)"
    assert lines[-2].startswith('  File "') and "conv.py" in lines[-2]
    assert lines[-1].startswith("    return F.conv2d(")
    assert len(result.stderr) < 2000


def test_error_inside_a_module_level_function(tmp_path):
    # The traceback's source lines of a module-level function start at column
    # 0 (window attention models have them): they are not the message.
    model, script = script_model(tmp_path, [
        "import torch",
        "def window(x, k: int):",
        "    b, n = x.shape",
        "    return x.view(b, n // k, k + 1)",
        "class M(torch.nn.Module):",
        "    def forward(self, x):",
        "        return window(x * 2, 3)",
    ], "window.pt")
    result = run("trace", model, "--input", "2x6", check=False)
    lines = result.stderr.rstrip("\n").splitlines()
    assert lines[0] == ("torchcap: error: the model failed: shape '[2, 2, 4]' is invalid for "
                        "input of size 12")
    # TorchScript's original-code traceback has the failing function's frame.
    assert lines[1:] == [f'  File "{script}", line 4, in window',
                         "    return x.view(b, n // k, k + 1)"]


def test_missing_inputs(torchvision_models):
    assert "give the inputs" in error_of("trace", torchvision_models / "resnet18.pt")


def test_wrong_input_shape_for_run(mlp_file):
    message = error_of("run", mlp_file, "--input", "4x17")
    assert message == ("inputs do not match the graph: input 0 (ph_0): expected f32[4, 16], "
                       "got f32[4, 17]")


def test_model_and_example_together(torchvision_models):
    assert "one of them" in error_of("trace", torchvision_models / "resnet18.pt", "--example", "mlp")


def test_op_the_tracer_rejects(tmp_path):
    model, _ = script_model(tmp_path, [
        "import torch",
        "class M(torch.nn.Module):",
        "    def forward(self, x):",
        "        x.add_(1)",
        "        return x * 2",
    ], "writes_input.pt")
    result = run("trace", model, "--input", "3", check=False)
    lines = result.stderr.splitlines()
    assert "Immutable tensor `self` is potentially getting modified by aten::add_" in lines[0]
    assert lines[1].endswith("make_model.py\", line 4, in forward") and lines[2] == "    x.add_(1)"
    # The same program exports: the write becomes an output.
    j = json.loads(run("trace", model, "--input", "3", "--export",
                       "--json").stdout)
    assert j["outputs"] == 2


# --- what users give by mistake: each says what the file or word is ------------------

def test_unknown_command():
    assert error_of("nosuchcmd", code=2).startswith(
        "unknown command 'nosuchcmd' (commands: trace, show, run, optimize, examples)")


def test_misspelled_words_get_a_suggestion():
    assert error_of("tarce", code=2).startswith("unknown command 'tarce' (did you mean 'trace'?)")
    assert error_of("trace", "--exmaple", "mlp", code=2).startswith(
        "The following argument was not expected: --exmaple (did you mean '--example'?)")
    assert error_of("run", "x.tcg", "--jsn", code=2).startswith(
        "The following argument was not expected: --jsn (did you mean '--json'?)")
    assert error_of("trace", "--example", "mpl").startswith(
        "no example named 'mpl' (did you mean 'mlp'?); known examples: ")
    # Nothing close: no guess.
    assert error_of("trace", "--example", "xyzzy").startswith(
        "no example named 'xyzzy'; known examples: ")


def test_empty_output_name():
    assert error_of("trace", "--example", "mlp", "-o", "") == "trace -o: the file name is empty"


def test_missing_model_file(tmp_path):
    missing = tmp_path / "model.pt"
    assert error_of("trace", missing, "--input", "2x2") == f"{missing}: no such file"


def test_directory_as_model(tmp_path):
    assert error_of("trace", tmp_path, "--input", "2x2") == \
        f"{tmp_path} is a directory, not a TorchScript file"


def test_graph_file_given_to_trace(mlp_file):
    assert error_of("trace", mlp_file, "--input", "2x2") == (
        f"{mlp_file} is a torchcap graph, not a TorchScript model: use `torchcap show` or "
        "`torchcap run` on it")


def test_torch_save_file_given_to_trace(tmp_path):
    data = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(2)}, data)
    message = error_of("trace", data, "--input", "2x2")
    assert message.startswith(f"{data} was written by torch.save and holds data"), message
    assert "torch.jit.save" in message


def test_dict_file_as_input(tmp_path):
    state = tmp_path / "state_dict.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), state)
    message = error_of("trace", "--example", "mlp", "--input", state)
    assert message == (f"input file '{state}' holds a dict (an OrderedDict, such as a state "
                       "dict), not a tensor")
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2), "b": torch.ones(1)}, plain)
    assert error_of("trace", "--example", "mlp", "--input", plain) == \
        f"input file '{plain}' holds a dict, not a tensor"


def test_unreadable_input_files_are_not_mistaken_for_state_dicts(tmp_path):
    # Every pickled tensor names collections.OrderedDict (its backward hooks),
    # so only the file's top-level object may decide that it is a state dict.
    one = tmp_path / "one_entry.pt"
    torch.save({"w": torch.ones(2)}, one)  # LibTorch cannot read a one-entry dict
    objects = tmp_path / "objects.pt"
    torch.save([torch.ones(2), collections.Counter()], objects)
    for path in (one, objects):
        assert error_of("trace", "--example", "mlp", "--input", path) == (
            f"input file '{path}' holds Python objects LibTorch cannot read: give a tensor, or a "
            "list, tuple or dict (of two or more entries) of tensors and numbers, saved by torch.save")


def test_missing_input_file(tmp_path):
    missing = tmp_path / "x.pt"
    assert error_of("trace", "--example", "mlp", "--input", missing) == \
        f"--input '{missing}': no such file"


def test_missing_library(tmp_path):
    missing = tmp_path / "libnothing.so"
    assert error_of("trace", "--example", "mlp", "--library", missing) == \
        f"operator library '{missing}': no such file"


def test_not_a_library(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_text("not a shared object")
    message = error_of("run", junk, "--library", junk)
    assert message.startswith(f"cannot load operator library '{junk}': "), message


def test_no_message_asks_for_a_pytorch_bug_report(tmp_path):
    state = tmp_path / "state.pt"
    torch.save({"w": torch.ones(2)}, state)
    for args in (["trace", "--example", "mlp", "--input", state], ["trace", state, "--input", "2"],
                 ["trace", tmp_path], ["nosuchcmd"]):
        result = run(*args, check=False)
        assert result.returncode != 0
        assert "report a bug" not in result.stderr.lower(), result.stderr


def test_no_check(tmp_path):
    out = run("trace", "--example", "mlp", "--no-check").stdout
    assert "not checked against the model (--no-check)" in out
    j = json.loads(run("trace", "--example", "mlp", "--no-check", "--json").stdout)
    assert j["max_abs_diff"] is None


def test_no_progress_when_not_a_terminal():
    # stderr is a pipe here: nothing but errors may go there.
    assert run("trace", "--example", "mlp").stderr == ""


# --- forward parameters: defaults, None, numbers, lists ---------------------------------

@pytest.fixture(scope="session")
def typed_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("typed")
    code = "\n".join([
        "from typing import List, Optional",
        "import torch",
        "class M(torch.nn.Module):",
        "    def forward(self, x, mask: Optional[torch.Tensor] = None, scale: float = 2.0,",
        "                steps: int = 1, shape: Optional[List[int]] = None):",
        "        for _ in range(steps):",
        "            x = x * scale",
        "        if mask is not None:",
        "            x = x + mask",
        "        if shape is not None:",
        "            x = x.reshape(shape)",
        "        return x",
        f"torch.jit.script(M()).save({str(out / 'typed.pt')!r})",
    ])
    (out / "make.py").write_text(code)
    subprocess.run([sys.executable, str(out / "make.py")], check=True)
    return out / "typed.pt"


def test_omitted_arguments_take_their_defaults(typed_model):
    j = json.loads(run("trace", typed_model, "--input", "2x3", "--json").stdout)
    assert j["ops"].get("aten::mul.Scalar") == 1, j  # steps=1
    assert "aten::add.Tensor" not in j["ops"]  # mask=None
    assert j["max_abs_diff"] == 0


def test_none_numbers_and_lists(typed_model):
    j = json.loads(run("trace", typed_model, "--input", "2x3", "--input", "none", "--input", "0.5",
                       "--input", "3", "--input", "3,2", "--json").stdout)
    assert j["ops"].get("aten::mul.Scalar") == 3, j
    assert j["max_abs_diff"] == 0
    j = json.loads(run("trace", typed_model, "--input", "2x3", "--input", "2x3", "--json").stdout)
    assert j["ops"].get("aten::add.Tensor") == 1, j


def test_typed_input_errors(typed_model):
    assert error_of("trace", typed_model, "--input", "2x3", "--input", "none", "--input",
                    "abc") == ("--input 'abc' for parameter 'scale: float = 2.': expected a number "
                               "such as 0.5")
    message = error_of("trace", typed_model, "--input", "none")
    assert message == "--input 'none' for parameter 'x: Tensor': None is not allowed here " \
                      "(the parameter is not Optional)"
    message = error_of("trace", typed_model, *["--input", "2"] * 6)
    assert message.startswith(f"the forward of '{typed_model}' takes 1 to 5 input(s), got 6 "
                              "--input: forward(x: Tensor, mask: Optional[Tensor] = None, "), message


# --- operator libraries and models torchcap cannot capture ----------------------------

@pytest.fixture(scope="session")
def detection_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("detection")
    code = "\n".join([
        "import torch, torchvision",
        "torch.manual_seed(0)",
        "m = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(",
        "    weights=None, weights_backbone=None).eval()",
        f"torch.jit.script(m).save({str(out / 'fasterrcnn.pt')!r})",
        f"torch.save([torch.rand(3, 64, 80), torch.rand(3, 64, 80)], {str(out / 'images.pt')!r})",
    ])
    (out / "make.py").write_text(code)
    subprocess.run([sys.executable, str(out / "make.py")], check=True)
    return out


def test_torchvision_operators_are_found_where_debian_installs_them(detection_model, tmp_path):
    # Note [Operator libraries found by their namespace]: the scripted model's
    # torchvision:: operators load without --library (LibTorch's importer
    # would otherwise refuse the file); the trace then goes on to the first
    # operator whose result's size depends on values.
    result = run("trace", detection_model / "fasterrcnn.pt", "--input", detection_model / "images.pt",
                 check=False)
    assert result.returncode == 1
    lines = result.stderr.rstrip("\n").splitlines()
    assert lines[0].startswith("torchcap: error: the model failed: "), lines[0]
    assert "returns a tensor whose shape depends on tensor values" in lines[0], lines[0]
    # Where in torchvision's detection code, as a Python traceback.
    assert any("torchvision/" in line for line in lines[1:]), result.stderr
    assert lines[-2].startswith('  File "') and lines[-1].startswith("    ")
    # A saved graph that calls torchvision::nms runs in the command as it is.
    script = "\n".join([
        "import sys, torch, torchvision, torchcap",
        "f = lambda b, s: torchvision.ops.nms(b, s, 0.5) + 1",
        "b = torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]])",
        "s = torch.tensor([0.9, 0.8, 0.7])",
        "gm = torchcap.trace(f, (b, s), allow_data_dependent_values=True)",
        "torchcap.save(gm, sys.argv[1])",
        "torch.save(b, sys.argv[2]); torch.save(s, sys.argv[3])",
    ])
    (tmp_path / "make.py").write_text(script)
    files = [tmp_path / "nms.tcg", tmp_path / "b.pt", tmp_path / "s.pt"]
    subprocess.run([sys.executable, str(tmp_path / "make.py"), *map(str, files)], check=True,
                   env=dict(os.environ, PYTHONPATH=str(pathlib.Path(TORCHCAP).parent / "python")))
    out = run("run", files[0], "--input", files[1], "--input", files[2], "--json").stdout
    assert json.loads(out)["outputs"] == [{"shape": [2], "dtype": "int64"}]


# --- colour (Note [Colour on a terminal] in src/cli/colour.h) ---------------------

def on_a_terminal(*args, env=None):
    """(stdout, stderr) of the command with both on a pseudo-terminal: the
    terminal gets both streams; they are told apart here by running twice."""
    import pty
    outputs = []
    for stream in ("stdout", "stderr"):
        leader, follower = pty.openpty()
        try:
            other = "stdout" if stream == "stderr" else "stderr"
            kwargs = {stream: follower, other: subprocess.DEVNULL}
            subprocess.run([TORCHCAP, *map(str, args)], env=env, timeout=120, **kwargs)
            os.close(follower)
            chunks = []
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closed
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            outputs.append(b"".join(chunks).decode())
        finally:
            os.close(leader)
    return outputs


def test_colour_on_a_terminal_and_not_with_no_color_or_piped(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    _, err = on_a_terminal("nosuchcmd", env=env)
    assert err.startswith("torchcap: \x1b[1;31merror:\x1b[0m unknown command"), repr(err)
    _, err = on_a_terminal("nosuchcmd", env={**env, "NO_COLOR": "1"})
    assert err.startswith("torchcap: error: unknown command"), repr(err)
    _, err = on_a_terminal("nosuchcmd", env={**env, "TERM": "dumb"})
    assert "\x1b[" not in err
    graph = tmp_path / "mlp.tcg"
    run("trace", "--example", "mlp", "-o", graph)
    out, _ = on_a_terminal("show", graph, env=env)
    assert "\x1b[1mnodes:\x1b[0m 11 (" in out and "\x1b[1moperators:\x1b[0m" in out, repr(out)
    piped = run("show", graph).stdout  # captured through a pipe: plain
    assert "\x1b[" not in piped and piped.startswith("nodes: 11 (")
    assert "\x1b[" not in error_of("nosuchcmd", code=2)


# --- run --profile ------------------------------------------------------------

def test_run_profile_prints_where_the_time_goes_and_a_chrome_trace(tmp_path):
    graph, trace = tmp_path / "cnn.tcg", tmp_path / "trace.json"
    run("trace", "--example", "cnn_bn_eval", "-o", graph)
    out = run("run", graph, "--profile", "--runs", "4", "--trace-json", trace).stdout
    table = out.split("\n\n", 1)[1]
    assert table.startswith("4 runs, ") and "operator" in table and "slowest nodes (ms/run):" in table
    assert f"saved the last run's trace to {trace}" in out
    events = json.loads(trace.read_text())["traceEvents"]  # one per node of one run
    convolutions = sum(e["cat"] == "aten::convolution" for e in events)
    row = next(line.split() for line in table.splitlines() if line.startswith("aten::convolution "))
    assert convolutions >= 1 and int(row[1]) == 4 * convolutions
    assert events and all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    j = json.loads(run("run", graph, "--profile", "--runs", "2", "--json").stdout)
    assert j["profile"]["runs"] == 2 and {n["target"] for n in j["profile"]["nodes"]} >= {"aten::convolution"}
    # --trace-json alone profiles too (issue 58), as docs/cli.md describes.
    alone = tmp_path / "alone.json"
    out = run("run", graph, "--trace-json", alone, "--runs", "2").stdout
    assert f"saved the last run's trace to {alone}" in out and "\n2 runs, " in out
    assert json.loads(alone.read_text())["traceEvents"]
    assert error_of("run", graph, "--runs", "2") == "--runs needs --profile or --trace-json"
    assert error_of("run", graph, "--trace-json", trace, "--steps", "1") == (
        "--trace-json runs a graph; a training step's runs (--steps) would train it")
    assert error_of("run", graph, "--profile", "--runs", "0", code=2).startswith("--runs: Value 0 not in range")
    assert error_of("run", graph, "--profile", "--steps", "1") == (
        "--profile runs a graph; a training step's runs (--steps) would train it")
