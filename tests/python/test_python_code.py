"""The Python code torchcap prints becomes a torch.fx.GraphModule that computes
what the same ops compute eagerly in C++."""

import os
import subprocess

import torch
import torch.fx


def load(path):
    with open(path, "rb") as f:
        return torch.load(f)


def module_with_attributes(attributes, forward):
    """A module holding `attributes` (dotted paths) as buffers, with `forward`."""

    class Root(torch.nn.Module):
        pass

    Root.forward = forward
    root = Root()
    for path, tensor in attributes.items():
        *parents, leaf = path.split(".")
        owner = root
        for name in parents:
            if not hasattr(owner, name):
                owner.add_module(name, torch.nn.Module())
            owner = getattr(owner, name)
        owner.register_buffer(leaf, tensor)
    return root


def assert_same_structure_and_values(actual, expected):
    assert type(actual) is type(expected) or (
        isinstance(actual, (tuple, list)) and isinstance(expected, (tuple, list))
    ), (type(actual), type(expected))
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    elif isinstance(expected, dict):
        assert list(actual.keys()) == list(expected.keys())
        for key in expected:
            assert_same_structure_and_values(actual[key], expected[key])
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same_structure_and_values(a, e)
    else:
        assert actual == expected


def test_generated_code_runs_as_graph_module(tmp_path):
    fixture = os.environ["TORCHCAP_PYTHON_CODE_FIXTURE"]
    subprocess.run([fixture, str(tmp_path)], check=True)

    code = (tmp_path / "code.py").read_text()
    namespace = {}
    exec(compile(code, "torchcap_generated.py", "exec"), namespace)
    root = module_with_attributes(load(tmp_path / "attributes.pt"), namespace["forward"])

    gm = torch.fx.symbolic_trace(root)
    assert isinstance(gm, torch.fx.GraphModule)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.addmm.default" in targets
    assert "aten.topk.default" in targets

    inputs = load(tmp_path / "inputs.pt")
    expected = load(tmp_path / "expected.pt")
    assert_same_structure_and_values(gm(*inputs), expected)
    # The code itself, called directly, agrees too.
    assert_same_structure_and_values(root(*inputs), expected)


def run_case(tmp_path, name, trace=True):
    """Runs the fixture's code for `name` (and, with `trace`, its torch.fx trace):
    the results must be the interpreter's. Returns the code and the trace."""
    code = (tmp_path / f"{name}.py").read_text()
    namespace = {}
    exec(compile(code, f"{name}.py", "exec"), namespace)
    root = module_with_attributes(load(tmp_path / f"{name}.attributes.pt"), namespace["forward"])
    inputs = load(tmp_path / f"{name}.inputs.pt")
    expected = load(tmp_path / f"{name}.expected.pt")
    assert_same_structure_and_values(root(*inputs)[0], expected)
    if not trace:
        return code, None
    gm = torch.fx.symbolic_trace(root)
    assert_same_structure_and_values(gm(*inputs)[0], expected)
    return code, gm


def test_attribute_names_that_are_not_identifiers(tmp_path):
    subprocess.run([os.environ["TORCHCAP_PYTHON_CODE_FIXTURE"], str(tmp_path)], check=True)
    # Not traced: torch.fx's own code for a get_attr of 'say "hi"\\' does not
    # compile (torchcap.load rewrites it; see test_load.py).
    code, _ = run_case(tmp_path, "odd_names", trace=False)
    assert "getattr(self, 'class')" in code
    assert "getattr(self.trunk_output.block1, 'block1-0')" in code


def test_custom_operators_are_named_through_torch_ops(tmp_path):
    subprocess.run([os.environ["TORCHCAP_PYTHON_CODE_FIXTURE"], str(tmp_path)], check=True)
    lib = torch.library.Library("torchcap_fixture", "DEF")
    lib.define("scale(Tensor x, float s) -> Tensor")
    lib.impl("scale", lambda x, s: x * s, "CPU")
    code, gm = run_case(tmp_path, "custom_op")
    assert "torch.ops.torchcap_fixture.scale.default(x, 2.5)" in code
    assert any(n.target is torch.ops.torchcap_fixture.scale.default for n in gm.graph.nodes)
