"""The torchcap command: every subcommand, its JSON, and its errors."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

TORCHCAP = os.environ["TORCHCAP_CLI"]
HERE = pathlib.Path(__file__).parent


def run(*args, check=True):
    result = subprocess.run([TORCHCAP, *map(str, args)], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"torchcap {' '.join(map(str, args))} failed:\n{result.stderr}")
    return result


def error_of(*args, code=1):
    """Runs a failing command; returns its single stderr line."""
    result = run(*args, check=False)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("torchcap: error: "), lines[0]
    assert "Exception raised from" not in result.stderr and "frame #" not in result.stderr
    return lines[0][len("torchcap: error: "):]


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
    assert out.strip() == f"rendered {svg}"
    text = svg.read_text()
    assert "<svg" in text and "addmm" in text


# --- run -------------------------------------------------------------------------

def test_run_random_inputs(mlp_file):
    out = run("run", mlp_file).stdout
    assert "output 0: f32[4, 10]" in out and "checksum:" in out and "time:" in out


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


# --- errors: one line, non-zero exit --------------------------------------------------

def test_unknown_flag():
    assert "--bogus" in error_of("trace", "--bogus", code=2)


def test_unknown_subcommand():
    error_of("frobnicate", code=2)


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
    assert "cannot load TorchScript file" in message and "junk.pt" in message


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
    message = error_of("trace", torchvision_models / "resnet18.pt", "--input", "2x3")
    assert message.startswith("the model failed at File ")
    assert message.endswith("RuntimeError: Expected 3D (unbatched) or 4D (batched) input to conv2d, "
                            "but got input of size: [2, 3]")
    assert "conv.py" in message


def test_missing_inputs(torchvision_models):
    assert "give the inputs" in error_of("trace", torchvision_models / "resnet18.pt")


def test_wrong_input_shape_for_run(mlp_file):
    message = error_of("run", mlp_file, "--input", "4x17")
    assert message == ("inputs do not match the graph: input 0 (ph_0): expected f32[4, 16], "
                       "got f32[4, 17]")


def test_model_and_example_together(torchvision_models):
    assert "one of them" in error_of("trace", torchvision_models / "resnet18.pt", "--example", "mlp")


def test_op_the_tracer_rejects(tmp_path):
    code = "\n".join([
        "import torch",
        "class M(torch.nn.Module):",
        "    def forward(self, x):",
        "        x.add_(1)",
        "        return x * 2",
        f"torch.jit.script(M()).save({str(tmp_path / 'writes_input.pt')!r})",
    ])
    script = tmp_path / "make_model.py"  # TorchScript needs the source in a file
    script.write_text(code)
    subprocess.run([sys.executable, str(script)], check=True)
    message = error_of("trace", tmp_path / "writes_input.pt", "--input", "3")
    assert "Immutable tensor `self` is potentially getting modified by aten::add_" in message
    # The same program exports: the write becomes an output.
    j = json.loads(run("trace", tmp_path / "writes_input.pt", "--input", "3", "--export",
                       "--json").stdout)
    assert j["outputs"] == 2
