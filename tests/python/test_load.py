"""torchcap.load opens files saved in C++ as torch.fx.GraphModules that compute
what the C++ programs compute eagerly, and rejects damaged files by name."""

import json
import math
import operator
import os
import pathlib
import struct
import subprocess
import sys
import zlib

import pytest
import torch
import torch.fx

# The package under test: the source tree's (pure Python) unless
# TORCHCAP_PYTHON_PACKAGE names another, such as a build tree's with the
# compiled part (which loads in C++: Note [One bridge to torch.fx] in _load.py).
sys.path.insert(0, os.environ.get("TORCHCAP_PYTHON_PACKAGE",
                                  str(pathlib.Path(__file__).resolve().parents[2] / "python")))
import torchcap  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("load_fixture")
    subprocess.run([os.environ["TORCHCAP_LOAD_FIXTURE"], str(out)], check=True)
    return out


def unpickle(path):
    with open(path, "rb") as f:
        return torch.load(f)


def assert_same(actual, expected, where="result"):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual)}"
        assert actual.dtype == expected.dtype, f"{where}: {actual.dtype} vs {expected.dtype}"
        assert actual.shape == expected.shape, f"{where}: {actual.shape} vs {expected.shape}"
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=where)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {type(actual)}"
        assert list(actual) == list(expected), f"{where}: keys {list(actual)} vs {list(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], f"{where}[{k!r}]")
    elif isinstance(expected, (tuple, list)):
        # LibTorch pickles C++ tuples as tuples and lists as lists.
        assert type(actual) is type(expected), f"{where}: {type(actual)} vs {type(expected)}"
        assert len(actual) == len(expected), f"{where}: length"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} vs {expected!r}"


def test_every_zoo_example_runs_like_the_cpp_program(files):
    names = (files / "examples.txt").read_text().split()
    assert "resnet18" in names and "nested_io" in names
    for name in names:
        gm = torchcap.load(files / f"{name}.tcg")
        assert isinstance(gm, torch.fx.GraphModule), name
        for node in gm.graph.nodes:
            if node.op == "call_function":
                assert node.target is operator.getitem or isinstance(
                    node.target, torch._ops.OpOverload), f"{name}: {node.target}"
        inputs = unpickle(files / f"{name}.inputs.pt")
        expected = unpickle(files / f"{name}.expected.pt")
        assert_same(gm(*inputs), expected, name)


def assert_same_fx_graph(a, b, where):
    """Node for node, as torch.fx holds them: names, targets, arguments and
    their containers, metadata, users and inputs in order, attributes."""
    assert a.graph._len == b.graph._len, where
    for x, y in zip(a.graph.nodes, b.graph.nodes):
        at = f"{where}: %{x.name}"
        assert (x.name, x.op, x.target, x.type) == (y.name, y.op, y.target, y.type), at
        assert repr(x.args) == repr(y.args) and repr(x.kwargs) == repr(y.kwargs), at
        assert type(x.kwargs) is type(y.kwargs), at
        assert [type(v) for v in x.args] == [type(v) for v in y.args], at
        assert x.meta == y.meta and list(x.meta) == list(y.meta), at
        assert [u.name for u in x.users] == [u.name for u in y.users], at
        assert [n.name for n in x.all_input_nodes] == [n.name for n in y.all_input_nodes], at
        assert list(vars(x)) == list(vars(y)), at
    namespaces = a.graph._graph_namespace, b.graph._graph_namespace
    assert namespaces[0]._used_names == namespaces[1]._used_names, where
    assert sorted(namespaces[0]._obj_to_name.values()) == sorted(
        namespaces[1]._obj_to_name.values()), where
    assert [(k, type(v)) for k, v in a.named_buffers()] == [
        (k, type(v)) for k, v in b.named_buffers()], where
    assert [k for k, _ in a.named_parameters()] == [k for k, _ in b.named_parameters()], where


def test_the_module_loaded_in_cpp_is_the_module_read_in_python(files, tmp_path):
    # Note [One bridge to torch.fx] in _load.py: with the compiled part, a
    # file is read in C++ and its module made as a trace's; the reader in
    # Python, the fallback and the reference, makes the same, node for node.
    if torchcap._load._C is None:
        pytest.skip("the package under test has no compiled part")
    # Names torch.fx renames: a builtin's, and numbers with a leading zero.
    doc, data = sections((files / "small.tcg").read_bytes())
    text = json.dumps(doc, separators=(",", ":"))
    assert doc["nodes"][3]["name"] == "add"
    (tmp_path / "renamed.tcg").write_bytes(rebuild_text(
        text.replace('"add"', '"ValueError"').encode(), data))
    (tmp_path / "zero.tcg").write_bytes(rebuild_text(
        text.replace('"add"', '"add_01"').encode(), data))
    # (custom_op.tcg needs its library loaded first: test_custom_operators_...)
    paths = sorted(p for p in files.glob("*.tcg") if p.name != "custom_op.tcg") + [
        tmp_path / "renamed.tcg", tmp_path / "zero.tcg"]
    for path in paths:
        compiled = torchcap.load(path)
        assert "_torchcap_graph" in vars(compiled), path.name  # not read in Python
        python = torchcap._load.load_in_python(path)
        assert_same_fx_graph(compiled, python, path.name)
        assert compiled.code == python.code, path.name
        if path.name == "renamed.tcg":
            assert [n.name for n in compiled.graph.nodes][3] == "ValueError_1"
        if path.name == "zero.tcg":
            assert [n.name for n in compiled.graph.nodes][3] == "add_1"


def test_code_is_generated_on_first_use(files):
    # Note [Code generated on first use] in _runtime.py.
    gm = torchcap.load(files / "nested_io.tcg")
    assert "_code" not in gm.__dict__
    inputs = unpickle(files / "nested_io.inputs.pt")
    assert_same(gm(*inputs), unpickle(files / "nested_io.expected.pt"))
    # With the compiled part the call ran the C++ graph (Note [Calls run from
    # the C++ graph] in src/python/runner.cpp); the code is made when asked.
    assert ("_code" in gm.__dict__) == (torchcap._load._C is None)
    gm.code  # noqa: B018
    assert "_code" in gm.__dict__
    # The code is what torch.fx generates from the graph, also when asked first.
    looked = torchcap.load(files / "nested_io.tcg")
    assert looked.code == gm.code == looked.graph.python_code("self").src
    assert looked.code in str(looked)
    # Editing the graph and recompiling works as for any GraphModule.
    edited = torchcap.load(files / "mlp.tcg")
    for node in edited.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.relu.default:
            node.target = torch.ops.aten.neg.default
    edited.recompile()
    assert "aten.relu" not in edited.code and "aten.neg" in edited.code


def test_attributes_are_the_files_tensors(files):
    gm = torchcap.load(files / "attributes.tcg")
    expected = unpickle(files / "attributes.pt")
    for name, value in expected.items():
        actual = gm.get_parameter(name) if name.startswith(("param.", "layout.transposed",
                                                            "layout.channels_last", "tied."))\
            else gm.get_buffer(name)
        assert actual.dtype == value.dtype and actual.shape == value.shape, name
        assert torch.equal(actual, value), name
    # Kinds: parameters are Parameters; buffers and constants are buffers.
    assert isinstance(gm.get_parameter("param.w"), torch.nn.Parameter)
    assert not gm.get_parameter("param.w").requires_grad
    assert "buffer.running_mean" in dict(gm.named_buffers())
    assert "_tensor_constant0" in dict(gm.named_buffers())
    assert gm.get_buffer("undefined") is None
    # complex32 has no pickle; compare it with its complex64 sibling.
    c32 = gm.get_buffer("dtypes.complex32")
    assert c32.dtype == torch.complex32
    torch.testing.assert_close(c32.to(torch.complex64), expected["dtypes.complex64"].to(
        torch.complex32).to(torch.complex64))
    # Strides as stored (Note [Which strides are stored] in the writer).
    assert gm.get_parameter("layout.transposed").stride() == (1, 4)
    assert gm.get_parameter("layout.channels_last").is_contiguous(
        memory_format=torch.channels_last)
    assert gm.get_buffer("layout.expanded").stride() == (1, 0)
    # Tied weights share their bytes; all tensors are views of one mapping.
    assert gm.get_parameter("tied.a").data_ptr() == gm.get_parameter("tied.b").data_ptr()
    assert gm.get_buffer("dtypes.float32").data_ptr() % 64 == 0


def test_writing_to_a_loaded_tensor_leaves_the_file_alone(files):
    gm = torchcap.load(files / "attributes.tcg")
    gm.get_buffer("dtypes.float32").fill_(7)
    again = torchcap.load(files / "attributes.tcg")
    assert not torch.equal(again.get_buffer("dtypes.float32"),
                           torch.full_like(again.get_buffer("dtypes.float32"), 7))


def test_every_argument_kind_converts(files):
    gm = torchcap.load(files / "arguments.tcg")
    kwargs = [n.kwargs for n in gm.graph.nodes if n.op == "call_function"]
    seen = {type(v) for kw in kwargs for v in kw.values()}
    assert {torch.dtype, torch.layout, torch.device, torch.memory_format} <= seen
    values = [v for kw in kwargs for v in kw.values()]
    assert torch.qint8 in values and torch.quint2x4 in values and torch.complex32 in values
    assert torch.sparse_bsc in values and torch._mkldnn in values
    assert torch.device("cuda", 1) in values and torch.device("meta") in values
    assert torch.channels_last_3d in values and torch.preserve_format in values
    assert "quote \" backslash \\ newline \n tab \t bell \x07 \u00fc \U0001F600" in values
    scalars = [n.args[1] for n in gm.graph.nodes if n.target is torch.ops.aten.add.Scalar]
    assert -(1 << 63) in scalars and (1 << 63) - 1 in scalars
    assert any(isinstance(s, bool) and s for s in scalars)
    floats = [s for s in scalars if isinstance(s, float)]
    assert any(math.isnan(f) for f in floats) and math.inf in floats
    assert any(f == 0 and math.copysign(1, f) < 0 for f in floats)
    index = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.index.Tensor)
    assert index.args[1][0] is None and isinstance(index.args[1][1], torch.fx.Node)
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    assert relu.stack_trace.splitlines()[-1] == \
        '  File "src/m\u00f6del.cpp", line 42, in torchcap::Model::forward(at::Tensor)'
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert x.meta["tensor_meta"].shape == torch.Size([2, 3])
    assert x.meta["tensor_meta"].stride == (1, 2)


def test_nested_specs_shape_the_signature(files):
    gm = torchcap.load(files / "nested.tcg")
    a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
    out = gm(a, (b, {"k": c, "n": None}), [3, 2.5, True, "s\u00e9", math.inf],
             {1: False, -2: None}, (), None)
    expected = ({"sum": a + b, "pair": ((a + b) * c, None), "n": 7}, [c])
    assert_same(out, expected)
    assert "def forward(self, a, arg1, arg2, arg3, arg4, arg5)" in gm.code


def test_values_that_are_not_tensors_are_refused(files):
    # Note [Inputs of the traced shapes] in _runtime.py: None, a number or a
    # NumPy array where the graph takes a tensor is an InputError naming the
    # input, also in a file that records no dtypes or shapes of its inputs.
    gm = torchcap.load(files / "nested.tcg")
    b = torch.randn(3)
    rest = ([3, 2.5, True, "s\u00e9", math.inf], {1: False, -2: None}, (), None)
    with pytest.raises(torchcap.InputError) as e:
        gm(None, (b, {"k": 2.0, "n": None}), *rest)
    assert str(e.value).startswith("inputs do not match the graph:\n"
                                   "  input 0 (a, args[0]): expected a tensor, got None\n"
                                   "  input 2 (c, args[1][1]['k']): expected a tensor, got a float (2.0)\n")
    assert isinstance(e.value, TypeError)
    gm = torchcap.load(files / "small.tcg")
    with pytest.raises(torchcap.InputError, match=r"input 0 \(x, args\[0\]\): expected a tensor f32\[2, 3\], "
                                                  r"got a numpy\.ndarray"):
        gm(torch.randn(2, 3).numpy())


def test_exported_writes_reach_buffers_and_inputs(files):
    # BatchNorm in train mode: the running stats are outputs of the exported
    # graph, written back into the buffers before forward returns.
    gm = torchcap.load(files / "exported_bn.tcg")
    inputs = unpickle(files / "exported_bn.inputs.pt")
    assert_same(gm(*inputs), unpickle(files / "exported_bn.expected.pt"))
    for name, value in unpickle(files / "exported_bn.buffers.pt").items():
        assert_same(gm.get_buffer(name), value, name)
    assert "self.bn1.running_mean.copy_(" in gm.code

    # A program that writes into its input: so does the loaded module.
    gm = torchcap.load(files / "exported_input.tcg")
    (x,) = unpickle(files / "exported_input.inputs.pt")
    assert_same(gm(x), unpickle(files / "exported_input.expected.pt"))
    assert_same(x, unpickle(files / "exported_input.input_after.pt"), "the input")


def test_source_lines_and_module_stacks_reach_node_meta(files):
    gm = torchcap.load(files / "arguments.tcg")
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    # torch.fx's text: outermost frame first, each source line under its frame.
    assert relu.meta["stack_trace"] == (
        '  File "main.py", line 2147483647, in main\n'
        "    return run(model, x)\n"
        '  File "", line 0, in ?\n'  # a frame without a function: "?", as C++ prints it
        '  File "src/m\u00f6del.cpp", line 42, in torchcap::Model::forward(at::Tensor)\n')
    # nn_module_stack: outermost module first, path -> (path, type).
    assert relu.meta["nn_module_stack"] == {
        "layer1": ("layer1", "torch.nn.modules.container.Sequential"),
        "layer1.0": ("layer1.0", "torchvision.models.resnet.BasicBlock")}
    assert list(relu.meta["nn_module_stack"]) == ["layer1", "layer1.0"]
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert x.meta["nn_module_stack"] == {
        "block1-0.class": ("block1-0.class", "m\u00f6dule.Odd")}
    clone = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default)
    assert "nn_module_stack" not in clone.meta and "stack_trace" not in clone.meta


def test_any_attribute_name_torch_nn_accepts(files):
    gm = torchcap.load(files / "odd_names.tcg")
    (x,) = unpickle(files / "odd_names.inputs.pt")
    assert_same(gm(x)[0], unpickle(files / "odd_names.expected.pt"))
    names = ["trunk_output.block1.block1-0.proj.0.weight", "import.None",
             'say "hi"\\.0', "with space.m\u00f6dule", "lambda.def.return"]
    for name in names:
        assert isinstance(gm.get_parameter(name), torch.nn.Parameter), name
    assert gm.get_buffer("class.if").shape == (3,)
    assert isinstance(gm.get_submodule("trunk_output.block1.block1-0"), torch.nn.Module)
    # The code names them the way torch.nn's getattr finds them, and the
    # module survives what torch.fx does to modules: copying and recompiling.
    assert "getattr(self, 'class')" in gm.code
    assert "getattr(self.trunk_output.block1, 'block1-0').proj" in gm.code
    copy = __import__("copy").deepcopy(gm)
    assert_same(copy(x)[0], unpickle(files / "odd_names.expected.pt"))
    gm.recompile()
    assert_same(gm(x)[0], unpickle(files / "odd_names.expected.pt"))


def test_custom_operators_resolve_through_torch_ops(files, tmp_path):
    path = files / "custom_op.tcg"
    # Not registered in this process yet (a fresh interpreter, to be sure).
    out = subprocess.run(
        [sys.executable, "-c", "import sys, torchcap; torchcap.load(sys.argv[1])", str(path)],
        capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=str(pathlib.Path(torchcap.__file__).parents[1])))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("torchcap.FormatError: ") and "torchcap_fixture::scale" in last, last
    assert "torch.ops.load_library(path)" in last, last

    # Registered (here by Python; a C++ library would be torch.ops.load_library'd).
    lib = torch.library.Library("torchcap_fixture", "DEF")
    lib.define("scale(Tensor x, float s) -> Tensor")
    lib.impl("scale", lambda x, s: x * s, "CPU")
    gm = torchcap.load(path)
    assert any(n.target is torch.ops.torchcap_fixture.scale.default for n in gm.graph.nodes)
    (x,) = unpickle(files / "custom_op.inputs.pt")
    assert_same(gm(x)[0], unpickle(files / "custom_op.expected.pt"))

    # torchvision's operators, once torchvision is imported: the same graph
    # with nms(boxes, scores, 0.5) in place of scale(x, 2.5).
    doc, data = sections(path.read_bytes())
    node = next(n for n in doc["nodes"] if n["target"] == "torchcap_fixture::scale")
    node["target"] = "torchvision::nms"
    node["args"] = [{"node": "boxes"}, {"node": "scores"}, 0.5]
    doc["nodes"][0]["name"] = doc["nodes"][0]["target"] = "boxes"
    doc["nodes"].insert(1, {"name": "scores", "op": "placeholder", "target": "scores"})
    doc["in_spec"]["children"].append({"kind": "leaf"})
    (tmp_path / "nms.tcg").write_bytes(rebuild(doc, data))
    import torchvision  # registers torch.ops.torchvision
    gm = torchcap.load(tmp_path / "nms.tcg")
    assert any(n.target is torch.ops.torchvision.nms.default for n in gm.graph.nodes)
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert torch.equal(gm(boxes, scores)[0], torchvision.ops.nms(boxes, scores, 0.5) + 1)


# --- Damaged files -------------------------------------------------------------

HEADER = struct.Struct("<8sHHIQQQQQII")
JSON_AT = 72  # where versions 1.1 to 1.3 put the JSON section, after a 72-byte header


def sections(data):
    fields = HEADER.unpack_from(data, 0)
    json_offset, json_size, data_offset, data_size = fields[5], fields[6], fields[7], fields[8]
    return (json.loads(data[json_offset:json_offset + json_size]),
            data[data_offset:data_offset + data_size])


def rebuild(doc, data):
    """A version 1.2 file of `doc` and `data` with every checksum recomputed:
    what a test changed before is then a hostile file, not a damaged one."""
    for t in doc.get("tensors", []):
        if isinstance(t, dict) and "crc32" in t:
            t["crc32"] = zlib.crc32(data[t["offset"]:t["offset"] + t["length"]])
    return rebuild_text(json.dumps(doc, separators=(",", ":")).encode(), data)


def rebuild_text(text, data, minor=2):
    json_at = JSON_AT if minor >= 1 else 64
    data_offset = (json_at + len(text) + 63) // 64 * 64
    header = HEADER.pack(b"\x89TCG\r\n\x1a\n", 1, minor, json_at, data_offset + len(data),
                         json_at, len(text), data_offset, len(data), 64, 0)
    if minor >= 1:
        header += struct.pack("<I", zlib.crc32(text))
        header += struct.pack("<I", zlib.crc32(header))  # of the 68 bytes before it
    return header + text + b"\0" * (data_offset - json_at - len(text)) + data


def in_json(data, needle):
    """The byte where `needle` first occurs in a version 1.2 file's JSON."""
    return JSON_AT + data[JSON_AT:].index(needle)


def error(tmp_path, data, **options):
    """torchcap.load's message for a file of `data`, which it must refuse with
    a FormatError: a torchcap.Error that is also a ValueError (what the loader
    raised before FormatError existed)."""
    path = tmp_path / "f.tcg"
    path.write_bytes(data)
    with pytest.raises(torchcap.FormatError) as e:
        torchcap.load(path, **options)
    assert isinstance(e.value, torchcap.Error) and isinstance(e.value, ValueError)
    return str(e.value).replace(str(path), "f.tcg")


def test_damaged_files_raise_format_error_naming_the_problem(files, tmp_path):
    good = (files / "small.tcg").read_bytes()
    assert isinstance(torchcap.load(files / "small.tcg"), torch.fx.GraphModule)

    assert error(tmp_path, b"PK\x03\x04" + good[4:]) == (
        "f.tcg: byte 0: not a torchcap graph file (the first 8 bytes are not the .tcg magic)")
    assert error(tmp_path, good[:20]) == (
        "f.tcg: byte 20: the file ends after 20 bytes, inside the 64-byte header")
    assert error(tmp_path, good[:8] + b"\x02" + good[9:]) == (
        "f.tcg: byte 8: format version 2.2 is not supported; this torchcap reads version 1.x")
    assert error(tmp_path, good[:-1]) == (
        f"f.tcg: byte 16: the header gives the file size as {len(good)} bytes but the file "
        f"has {len(good) - 1} (truncated)")

    doc, data = sections(good)
    assert rebuild(doc, data) == good  # the same layout as the C++ writer's

    doc["nodes"][3]["target"] = "aten::frobnicate"
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"add"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %add (nodes[3]): call_function: no operator "
        "aten::frobnicate is registered")

    doc, data = sections(good)
    doc["tensors"][0]["sizes"] = [2, 4]
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"w","dtype"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: tensor 'w' (tensors[0]): length: byte length 24 does not "
        "match dtype float32, sizes [2, 4] and strides [3, 1], which span 28 bytes")

    doc, data = sections(good)
    data = data[:65] + b"\x07" + data[66:]
    bad = rebuild(doc, data)
    at = HEADER.unpack_from(bad, 0)[7] + 65
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {at}: tensor 'mask' (tensors[1]): bool byte 7 is neither 0 nor 1")

    doc, data = sections(good)
    doc["nodes"][3]["args"][0] = {"node": "where"}
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"add"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %add (nodes[3]): args[0].node: %where is not a node "
        "defined before this one")

    doc, data = sections(good)
    text = json.dumps(doc, separators=(",", ":")).encode()
    bad = rebuild_text(text.replace(b'"nodes":[', b'"nodes":{', 1), data)
    first_node = in_json(bad, b'{"name":"x"')
    assert error(tmp_path, bad).startswith(
        f"f.tcg: byte {first_node}: the JSON section is not valid JSON: ")

    # Found by the fuzzer in the C++ loader: a number too large for a double.
    doc, data = sections(good)
    text = json.dumps(doc, separators=(",", ":")).encode()
    bad = rebuild_text(text.replace(b'"alpha",0.5', b'"alpha",1e999'), data)
    assert error(tmp_path, bad) == (
        "f.tcg: byte 72: the JSON section is not valid JSON: number overflow parsing '1e999'")

    # Integers beyond int64 (the C++ parser would read them as other kinds).
    for literal in (b"9223372036854775808", b"-9223372036854775809", b"100000000000000000000"):
        bad = rebuild_text(text.replace(b'{"node":"add"},2]', b'{"node":"add"},' + literal + b"]"),
                           data)
        at = in_json(bad, b'{"node":"add"},' + literal) + len(b'{"node":"add"},')
        assert error(tmp_path, bad) == (
            f"f.tcg: byte {at}: integer {literal.decode()} does not fit in 64 signed bits")

    # JSON followed by NUL bytes and data (the C++ loader's parser stopped at
    # the NUL and ignored the rest): both loaders refuse it.
    bad = rebuild_text(text + b"\0\0\x80?garbage", data)
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {JSON_AT + len(text)}: the JSON section contains a NUL byte")

    # A stack frame's line beyond what C++ holds (found by compare_loaders.py).
    doc, data = sections(good)
    doc["nodes"][3]["meta"] = {"stack_trace": [{"file": "a.cpp", "line": 2**31, "function": "f"}]}
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"add"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %add (nodes[3]): meta.stack_trace[0].line: line number "
        "too large")

    # Node names the C++ graph refuses (found by compare_loaders.py: torch.fx
    # would have renamed them silently).
    for bad_name in ("outp=t", "self", "lambda", "9a"):
        doc, data = sections(good)
        doc["nodes"][7]["name"] = bad_name
        bad = rebuild(doc, data)
        offset = in_json(bad, b'{"name":' + json.dumps(bad_name).encode())
        assert error(tmp_path, bad) == (
            f"f.tcg: byte {offset}: node %{bad_name} (nodes[7]): name: duplicate or invalid "
            f"node name '{bad_name}'")

    # The output node's target is "output".
    doc, data = sections(good)
    doc["nodes"][7]["target"] = "out"
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"output"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %output (nodes[7]): target: the output's target is "
        "'output'")

    # Keyword names must be the operator's (they are written into Python code).
    doc, data = sections(good)
    doc["nodes"][3]["kwargs"] = [["alpha=1, other", 2]]
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"add"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %add (nodes[3]): aten::add.Tensor has no argument named "
        "'alpha=1, other'")

    # Attribute names torch.fx would write into code unescaped load all the same.
    doc, data = sections(good)
    doc["attributes"][0]["name"] = doc["nodes"][1]["target"] = 'w")'
    path = tmp_path / "quote.tcg"
    path.write_bytes(rebuild(doc, data))
    assert """getattr(self, 'w")')""" in torchcap.load(path).code

    # An attribute whose name torch.nn.Module uses for a method.
    doc, data = sections(good)
    doc["attributes"][0]["name"] = doc["nodes"][1]["target"] = "cuda"
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"cuda","kind"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: attribute 'cuda' (attributes[0]): 'cuda' is already taken by "
        "torch.nn.Module; Python cannot hold this attribute")

    directory = tmp_path / "dir"
    directory.mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        torchcap.load(directory)


def test_damage_the_structure_cannot_show_is_caught_by_checksums(files, tmp_path):
    good = (files / "small.tcg").read_bytes()
    doc, data = sections(good)
    header_crc, = struct.unpack_from("<I", good, 68)
    json_crc, = struct.unpack_from("<I", good, 64)

    # A flipped bit in the header's flags.
    bad = bytearray(good)
    bad[60] ^= 1
    assert error(tmp_path, bytes(bad)) == (
        f"f.tcg: byte 68: the header is damaged: its CRC-32 is 0x{zlib.crc32(bad[:68]):08x}, "
        f"the header records 0x{header_crc:08x}")

    # The add's alpha 0.5 becomes 0.7: still valid JSON and a valid graph.
    at = good.index(b'["alpha",0.5]') + 11
    bad = good[:at] + b"7" + good[at + 1:]
    text = bad[JSON_AT:JSON_AT + HEADER.unpack_from(good, 0)[6]]  # the JSON size
    assert error(tmp_path, bad) == (
        f"f.tcg: byte 72: the JSON section is damaged: its CRC-32 is 0x{zlib.crc32(text):08x}, "
        f"the header records 0x{json_crc:08x}")

    # A flipped bit in w's bytes; with the checksums off it loads, damage and all.
    data_at = HEADER.unpack_from(good, 0)[7]
    w = doc["tensors"][0]
    start = data_at + w["offset"]
    bad = bytearray(good)
    bad[start + 5] ^= 0x10
    assert error(tmp_path, bytes(bad)) == (
        f"f.tcg: byte {start}: tensor 'w' (tensors[0]): its bytes are damaged: their CRC-32 is "
        f"0x{zlib.crc32(bad[start:start + w['length']]):08x}, the tensor table records "
        f"0x{w['crc32']:08x}")
    path = tmp_path / "damaged.tcg"
    path.write_bytes(bytes(bad))
    gm = torchcap.load(path, verify_checksums=False)
    assert gm.w[0, 1].item() != 1.0


def test_version_10_files_still_load(files, tmp_path):
    good = (files / "small.tcg").read_bytes()
    doc, data = sections(good)
    for t in doc["tensors"]:
        del t["crc32"]
    path = tmp_path / "v10.tcg"
    path.write_bytes(rebuild_text(json.dumps(doc, separators=(",", ":")).encode(), data, minor=0))
    old, new = torchcap.load(path), torchcap.load(files / "small.tcg")
    assert old.code == new.code
    for name, value in new.state_dict().items():
        assert torch.equal(old.state_dict()[name], value), name

    # A 1.0 file has no checksums to hold.
    doc["tensors"][0]["crc32"] = 0
    bad = rebuild_text(json.dumps(doc, separators=(",", ":")).encode(), data, minor=0)
    offset = 64 + bad[64:].index(b'{"name":"w","dtype"')
    assert error(tmp_path, bad) == (f"f.tcg: byte {offset}: tensors[0]: unknown key 'crc32' in a "
                                    f"file of version 1.0 (version 1.1 added it)")


def test_version_11_files_still_load(files, tmp_path):
    good = (files / "small.tcg").read_bytes()
    doc, data = sections(good)
    path = tmp_path / "v11.tcg"
    path.write_bytes(rebuild_text(json.dumps(doc, separators=(",", ":")).encode(), data, minor=1))
    assert torchcap.load(path).code == torchcap.load(files / "small.tcg").code

    # What version 1.2 added is unknown in a 1.1 file.
    doc["module_stacks"] = []
    bad = rebuild_text(json.dumps(doc, separators=(",", ":")).encode(), data, minor=1)
    assert error(tmp_path, bad) == ("f.tcg: byte 72: unknown key 'module_stacks' in a file of "
                                    "version 1.1 (version 1.2 added it)")
    del doc["module_stacks"]
    doc["nodes"][3]["meta"] = {"stack_trace": [{"file": "a.py", "line": 1, "function": "f",
                                                "code": "x"}]}
    bad = rebuild_text(json.dumps(doc, separators=(",", ":")).encode(), data, minor=1)
    offset = in_json(bad, b'{"name":"add"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %add (nodes[3]): meta.stack_trace[0]: unknown key 'code' in "
        f"a file of version 1.1 (version 1.2 added it)")


# --- Arguments kernels trust (issue 42) ---------------------------------------------

def tensor_meta(dtype, sizes):
    strides, stride = [], 1
    for size in reversed(sizes):
        strides.insert(0, stride)
        stride *= max(size, 1)
    return {"dtype": dtype, "sizes": sizes, "strides": strides, "device": "cpu"}


def one_call(target, inputs, args):
    """A version 1.2 file calling `target` once, as %call, on placeholders %x0,
    %x1, ... of the given (dtype, sizes), each recorded; returns its first
    tensor. `args` name the placeholders by index as ("x", i). The shape of the
    C++ tests' one_call (tests/serialize_test.cpp)."""
    def arg(a):
        if isinstance(a, tuple):
            return {"node": f"x{a[1]}"}
        return [arg(e) for e in a] if isinstance(a, list) else a
    nodes = [{"name": f"x{i}", "op": "placeholder", "target": f"x{i}",
              "meta": {"val": {"kind": "tensor", "tensors": [tensor_meta(*m)]}}}
             for i, m in enumerate(inputs)]
    nodes.append({"name": "call", "op": "call_function", "target": target,
                  "args": [arg(a) for a in args]})
    result = "call"
    ns, name = target.split("::")
    returns = getattr(getattr(torch.ops, ns), name.split(".")[0])
    returns = getattr(returns, name.split(".")[1] if "." in name else "default")._schema.returns
    if len(returns) > 1 or str(returns[0].type).startswith("List"):
        nodes.append({"name": "first", "op": "call_function", "target": "getitem",
                      "args": [{"node": "call"}, 0]})
        result = "first"
    nodes.append({"name": "output", "op": "output", "target": "output",
                  "args": [[{"node": result}]]})
    return rebuild({"nodes": nodes, "attributes": [], "tensors": [],
                    "in_spec": {"kind": "tuple", "children": [{"kind": "leaf"}] * len(inputs)},
                    "out_spec": {"kind": "leaf"}}, b"")


def with_argument(data, index, value):
    doc, tensors = sections(data)
    call = next(n for n in doc["nodes"] if n["name"] == "call")
    call["args"][index] = value
    return rebuild(doc, tensors)


def random_inputs(gm):
    return [torch.randn(n.meta["tensor_meta"].shape).to(n.meta["tensor_meta"].dtype)
            for n in gm.graph.nodes if n.op == "placeholder"]


F32, I64 = "float32", "int64"
X = ("x", 0), ("x", 1), ("x", 2)

# Each: (target, placeholders, a valid call's arguments, the argument changed,
# its new value, the message), as in the C++ loader's tests.
HOSTILE_ARGUMENTS = [
    ("aten::convolution_backward", [(F32, [2, 6, 6, 6]), (F32, [2, 3, 8, 8]), (F32, [6, 3, 3, 3])],
     [X[0], X[1], X[2], [6], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True]], 9, 0,
     "argument 'groups' of aten::convolution_backward is 0; it must be between 1 and 2147483647"),
    ("aten::convolution", [(F32, [2, 3, 8, 8]), (F32, [6, 3, 3, 3])],
     [X[0], X[1], None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1], 8, 1 << 62,
     "argument 'groups' of aten::convolution is 4611686018427387904; it must be between 1 and "
     "2147483647"),
    ("aten::pixel_shuffle", [(F32, [1, 4, 2, 2])], [X[0], 2], 1, 1 << 32,
     "argument 'upscale_factor' of aten::pixel_shuffle is 4294967296; it must be between 1 and "
     "2147483647"),
    ("aten::native_channel_shuffle", [(F32, [1, 4, 2, 2])], [X[0], 2], 1, 0,
     "argument 'groups' of aten::native_channel_shuffle is 0; it must be between 1 and "
     "2147483647"),
    ("aten::unfold_backward", [(F32, [2, 3, 8, 4, 2])], [X[0], [2, 3, 8, 8], 3, 2, 2], 4, 0,
     "argument 'step' of aten::unfold_backward is 0; it must be between 1 and 2147483647"),
    ("aten::max_pool2d", [(F32, [1, 3, 8, 8])], [X[0], [2, 2], [2, 2]], 2, [0, 0],
     "argument 'stride' of aten::max_pool2d is [0, 0]; each value must be between 1 and "
     "2147483647"),
    ("aten::max_pool2d", [(F32, [1, 3, 8, 8])], [X[0], [2, 2]], 1, [2, 2, 2],
     "argument 'kernel_size' of aten::max_pool2d has 3 values; aten::max_pool2d takes 1 or 2"),
    ("aten::_slow_conv2d_forward", [(F32, [1, 3, 8, 8]), (F32, [6, 3, 3, 3])],
     [X[0], X[1], [3, 3], None, [1, 1], [0, 0]], 2, [],
     "argument 'kernel_size' of aten::_slow_conv2d_forward has 0 values; "
     "aten::_slow_conv2d_forward takes exactly 2"),
    ("aten::embedding_bag", [(F32, [10, 3]), (I64, [2]), (I64, [1])], [X[0], X[1], X[2], False, 0],
     4, 7, "argument 'mode' of aten::embedding_bag is 7; it must be 0 (sum), 1 (mean) or 2 (max)"),
    ("aten::_reshape_alias", [(F32, [2, 3])], [X[0], [6], [1]], 1, [1 << 40],
     "aten::_reshape_alias views %x0 (sizes [2, 3], strides [3, 1]) with sizes [1099511627776] "
     "and strides [1], which reach past its elements"),
    ("aten::mkldnn_convolution", [(F32, [1, 3, 8, 8]), (F32, [6, 3, 3, 3])],
     [X[0], X[1], None, [0, 0], [1, 1], [1, 1], 1], 4, [1],
     "argument 'stride' of aten::mkldnn_convolution has 1 value; its weight %x1 (sizes [6, 3, 3, "
     "3]) has 2 spatial dimensions"),
    # Found by the structure-aware fuzzer (fuzz/harness.h).
    ("aten::native_channel_shuffle", [(F32, [1, 4, 2, 2])], [X[0], 2], 1, 16384,
     "argument 'groups' of aten::native_channel_shuffle is 16384; its kernel needs %x0 (sizes [1, "
     "4, 2, 2]) to have a batch and a positive multiple of it as channels"),
    ("aten::unfold_backward", [(F32, [2, 3, 8, 4, 2])], [X[0], [2, 3, 8, 8], 3, 2, 2], 4, 1 << 20,
     "argument 'grad_in' of aten::unfold_backward is %x0 (sizes [2, 3, 8, 4, 2]), which is not the "
     "gradient of unfold(dimension 3, size 2, step 1048576) of sizes [2, 3, 8, 8]; its kernel "
     "writes where that unfold would have read"),
    ("aten::convolution", [(F32, [2, 3, 8, 8]), (F32, [6, 3, 3, 3])],
     [X[0], X[1], None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1], 3, [],
     "argument 'stride' of aten::convolution has 0 values; aten::convolution takes at least 1"),
]


@pytest.mark.parametrize("target, inputs, args, index, value, message", HOSTILE_ARGUMENTS,
                         ids=["convolution_backward_groups_zero",
                              "convolution_groups_that_overflow",
                              "pixel_shuffle_factor_whose_square_overflows",
                              "native_channel_shuffle_groups_zero", "unfold_backward_step_zero",
                              "max_pool2d_stride_zero", "max_pool2d_kernel_of_three_dimensions",
                              "slow_conv2d_without_a_kernel_size", "embedding_bag_mode_seven",
                              "reshape_alias_past_its_input",
                              "mkldnn_convolution_window_shorter_than_its_weight",
                              "native_channel_shuffle_groups_beyond_the_channels",
                              "unfold_backward_of_another_unfold", "convolution_without_a_stride"])
def test_arguments_kernels_trust_are_refused_naming_the_node(tmp_path, target, inputs, args,
                                                              index, value, message):
    # Note [Integers kernels divide by], Note [Kernels that trust their
    # arguments]: each of these killed the process (SIGFPE, SIGSEGV) when run.
    good = one_call(target, inputs, args)
    path = tmp_path / "good.tcg"
    path.write_bytes(good)
    gm = torchcap.load(path)
    if target == "aten::convolution_backward":
        assert gm(*random_inputs(gm)).shape == (2, 3, 8, 8)
    bad = with_argument(good, index, value)
    offset = in_json(bad, b'{"name":"call"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %call (nodes[{len(inputs)}]): {message}")


def test_trusting_kernel_whose_input_has_no_recorded_shape(tmp_path):
    doc, data = sections(one_call("aten::_reshape_alias", [(F32, [2, 3])], [X[0], [3, 2], [2, 1]]))
    del doc["nodes"][0]["meta"]
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"call"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %call (nodes[1]): argument 'self' of aten::_reshape_alias is "
        "%x0, whose shape the file does not record; the loader checks this operator's arguments "
        "against it, as its kernel does not")


def test_trusting_kernels_on_shapes_they_do_not_survive(tmp_path):
    # Found by the structure-aware fuzzer: a batch of 0 (SIGFPE, SIGSEGV), and
    # embedding_bag in mode max without a bag (SIGSEGV).
    def empty_batch(data, node=0):
        doc, tensors = sections(data)
        doc["nodes"][node]["meta"]["val"]["tensors"][0]["sizes"][0] = 0
        return rebuild(doc, tensors)
    call = b'{"name":"call"'
    bad = empty_batch(one_call("aten::native_channel_shuffle", [(F32, [1, 4, 2, 2])], [X[0], 2]))
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {in_json(bad, call)}: node %call (nodes[1]): argument 'groups' of "
        "aten::native_channel_shuffle is 2; its kernel needs %x0 (sizes [0, 4, 2, 2]) to have a "
        "batch and a positive multiple of it as channels")
    bad = empty_batch(one_call("aten::_transform_bias_rescale_qkv",
                               [(F32, [1, 3, 12]), (F32, [12])], [X[0], X[1], 2]))
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {in_json(bad, call)}: node %call (nodes[2]): arguments 'qkv' and 'qkv_bias' "
        "of aten::_transform_bias_rescale_qkv are %x0 (sizes [0, 3, 12]) and %x1 (sizes [12]); "
        "its kernel takes [batch of at least 1, tokens, 3 * embedding] and [3 * embedding]")
    bad = empty_batch(one_call("aten::embedding_bag", [(F32, [10, 3]), (I64, [4]), (I64, [1])],
                               [X[0], X[1], X[2], False, 2]), node=2)
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {in_json(bad, call)}: node %call (nodes[3]): arguments 'indices' and "
        "'offsets' of aten::embedding_bag are %x1 (sizes [4]) and %x2 (sizes [0]); its kernel "
        "takes 1-D indices and offsets, and in mode 2 (max) at least one bag")


def test_operators_on_plain_numbers_are_refused(tmp_path):
    # remainder.int(1, 0) divides by zero unchecked (SIGFPE). LibTorch alone
    # does not register it (torchcap::load says so); torch's Python does.
    doc, data = sections(one_call("aten::add.Tensor", [(F32, [2])], [X[0], X[0]]))
    doc["nodes"].insert(1, {"name": "r", "op": "call_function", "target": "aten::remainder.int",
                            "args": [1, 0]})
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"r"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %r (nodes[1]): aten::remainder.int computes on plain "
        "numbers, not tensors; graphs do not record such operators")


def test_a_result_of_several_outputs_is_refused_as_the_cpp_loader_does(files, tmp_path):
    # The C++ loader's lint refuses it; this loader made a module that returned
    # topk's pair (found by compare_loaders.py on the structure-aware corpus).
    doc, data = sections((files / "small.tcg").read_bytes())
    doc["nodes"][7]["args"][0][0] = {"node": "topk"}
    bad = rebuild(doc, data)
    nodes = in_json(bad, b'[{"name":"x"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {nodes}: lint: output %output returns node %topk; results must be Tensor "
        "nodes or none")


def test_an_output_node_named_otherwise_is_refused_as_the_cpp_loader_does(files, tmp_path):
    # The C++ graph names its output node itself (found by `make fuzz`).
    doc, data = sections((files / "small.tcg").read_bytes())
    doc["nodes"][7]["name"] = "outpup"
    bad = rebuild(doc, data)
    offset = in_json(bad, b'{"name":"outpup"')
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {offset}: node %outpup (nodes[7]): name: duplicate or invalid node name "
        "'outpup'")


def test_negative_padding_of_a_pad_is_no_window(tmp_path):
    path = tmp_path / "pad.tcg"
    path.write_bytes(one_call("aten::reflection_pad2d", [(F32, [1, 2, 5, 5])], [X[0], [-1] * 4]))
    gm = torchcap.load(path)
    assert gm(*random_inputs(gm)).shape == (1, 2, 3, 3)


# --- Shapes (issue 58) ---------------------------------------------------------

CALL = b'{"name":"call"'


def with_recorded(data, node, dtype, sizes):
    """`data` with node `node` recording one tensor of `dtype` and `sizes`."""
    doc, tensors = sections(data)
    entry = next(n for n in doc["nodes"] if n["name"] == node)
    entry["meta"] = {"val": {"kind": "tensor", "tensors": [tensor_meta(dtype, sizes)]}}
    return rebuild(doc, tensors)


def test_files_whose_shapes_disagree_are_refused_at_load(tmp_path):
    """Note [Checking a file's shapes]: each operator runs on meta tensors of
    its inputs' recorded shapes when the file is loaded, in every loader, so
    that a file whose integers no longer fit its shapes (one hostile integer,
    checksums recomputed) is refused with the node and the byte offset the
    command prints, not loaded to fail inside LibTorch at the first call."""
    good = with_recorded(one_call("aten::view", [(F32, [3, 4])], [X[0], [12]]), "call", F32, [12])
    path = tmp_path / "good.tcg"
    path.write_bytes(good)
    gm = torchcap.load(path)
    x = torch.randn(3, 4)
    assert torch.equal(gm(x), x.view(12))

    bad = with_argument(good, 1, [1000003])
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {in_json(bad, CALL)}: node %call (nodes[1]): aten::view fails on the recorded shapes: "
        "shape '[1000003]' is invalid for input of size 12")
    # The policy switch: loaded unchecked, the call fails inside the operator.
    path.write_bytes(bad)
    unchecked = torchcap.load(path, check_shapes=False)
    with pytest.raises(RuntimeError, match=r"shape '\[1000003\]' is invalid"):
        unchecked(x)

    # A factory of 2^31 elements where the file records 4: refused, not run
    # (it ran for minutes, allocating 16 GiB).
    arange = with_recorded(one_call("aten::arange", [], [4]), "call", I64, [4])
    path.write_bytes(arange)
    assert torch.equal(torchcap.load(path)(), torch.arange(4))
    bad = with_argument(arange, 0, 1 << 31)
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {in_json(bad, CALL)}: node %call (nodes[0]): aten::arange "
        "gives i64[2147483648] on the recorded shapes, but the file records i64[4]")

    # A recorded result that its operator does not give.
    bad = with_recorded(one_call("aten::mm", [(F32, [2, 3]), (F32, [3, 4])], [X[0], X[1]]), "call",
                        F32, [2, 5])
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {in_json(bad, CALL)}: node %call (nodes[2]): aten::mm "
        "gives f32[2, 4] on the recorded shapes, but the file records f32[2, 5]")


def number_for_tensor(minor):
    """A file of version 1.`minor` computing x + 0.5 on an int64 x, the number
    given for add.Tensor's Tensor parameter (Note [Python numbers as
    tensors])."""
    doc, data = sections(with_recorded(one_call("aten::add.Tensor", [(I64, [4])], [X[0], 0.5]),
                                       "call", F32, [4]))
    return rebuild_text(json.dumps(doc, separators=(",", ":")).encode(), data, minor=minor)


def test_a_python_number_given_for_a_tensor_keeps_its_type_promotion(tmp_path):
    """int64 + 0.5 is float32 in eager (0.5 is a wrapped number): the file
    keeps the number as a number (version 1.6) and the loaded module computes
    float32, as the traced one does."""
    path = tmp_path / "n.tcg"
    path.write_bytes(number_for_tensor(6))
    gm = torchcap.load(path)
    x = torch.arange(4)
    assert gm(x).dtype == torch.float32 and torch.equal(gm(x), x + 0.5)
    assert "torch.ops.aten.add.Tensor(x0, 0.5)" in gm.code
    # No writer made such a file before version 1.6.
    bad = number_for_tensor(2)
    assert error(tmp_path, bad) == (
        f"f.tcg: byte {in_json(bad, CALL)}: node %call (nodes[1]): numbers "
        "given for Tensor parameters came in version 1.6; this file is version 1.2")


# --- Weightless files (version 1.3) ---------------------------------------------

def test_weightless_files_bind_weights_and_run_like_the_cpp_program(files):
    data = (files / "weightless.tcg").read_bytes()
    assert struct.unpack_from("<H", data, 10)[0] == 3
    assert struct.unpack_from("<H", (files / "small.tcg").read_bytes(), 10)[0] == 2
    weights = unpickle(files / "weightless.weights.pt")
    gm = torchcap.load(files / "weightless.tcg", weights=weights)
    assert gm.w.data_ptr() == weights["w"].data_ptr()  # bound as given
    assert isinstance(gm.w, torch.nn.Parameter) and not gm.w.requires_grad
    (x,) = unpickle(files / "weightless.inputs.pt")
    assert_same(gm(x)[0], unpickle(files / "weightless.expected.pt"))  # a flat graph: a tuple


def test_weightless_files_load_without_weights_and_refuse_to_run(files):
    gm = torchcap.load(files / "weightless.tcg")
    assert gm.w.is_meta and gm.w.shape == (2, 3) and gm.w.stride() == (3, 1)
    assert not gm.b.is_meta
    with pytest.raises(torchcap.WeightError) as e:
        gm(torch.randn(2, 3))
    assert str(e.value) == (
        "the module's weights are not bound: 1 attribute(s) hold no values (the module was "
        "traced on the meta device or loaded from a weightless file): parameter 'w' "
        "(f32[2, 3]). Bind them first: torchcap.load(path, weights=state_dict)")
    # Weights for stored attributes replace them; a tensor of the wrong layout
    # is copied into the recorded strides.
    w = torch.arange(6.0).reshape(3, 2).t()
    gm = torchcap.load(files / "weightless.tcg", weights={"w": w, "b": torch.ones(3)})
    assert gm.w.stride() == (3, 1) and torch.equal(gm.w, w) and torch.equal(gm.b, torch.ones(3))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_weight_errors_in_the_loader(files):
    def message(weights, strict=True):
        with pytest.raises(torchcap.WeightError) as e:
            torchcap.load(files / "weightless.tcg", weights=weights, strict=strict)
        return str(e.value).replace(str(files / "weightless.tcg"), "f.tcg")

    head = "f.tcg: the weights do not fit the module's attributes:\n  "
    assert message({}) == head + "missing: parameter 'w' (f32[2, 3])"
    assert message({"w": torch.zeros(3, 2)}) == (
        head + "weight 'w' (parameter): expected f32[2, 3], got f32[3, 2]")
    assert message({"w": torch.zeros(2, 3, dtype=torch.int64)}) == (
        head + "weight 'w' (parameter): expected f32[2, 3], got i64[2, 3]")
    assert message({"w": torch.empty(2, 3, device="meta")}) == (
        head + "weight 'w' (parameter): the tensor is on the meta device: it has no values to bind")
    # Sparse weights: named, not an error from inside LibTorch's copy.
    dense = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    for layout, w in (("sparse_coo", dense.to_sparse()), ("sparse_csr", dense.to_sparse_csr())):
        assert message({"w": w}) == (
            head + f"weight 'w' (parameter): expected a dense tensor f32[2, 3], got a {layout} "
                   "tensor; pass the dense one (to_dense())")
    assert message({"w": dense.to_sparse(), "b": torch.ones(3).to_sparse()}).count(
        "expected a dense tensor") == 2
    assert message({"w": torch.zeros(2, 3), "c": torch.zeros(1)}) == (
        head + "extra: weight 'c' is not an attribute of the module (strict=False ignores such "
               "weights)")
    torchcap.load(files / "weightless.tcg", weights={"w": torch.zeros(2, 3), "c": torch.zeros(1)},
                  strict=False)
    both = message({"b": torch.zeros(2), "c": torch.zeros(1)})
    assert both == head + "\n  ".join([
        "missing: parameter 'w' (f32[2, 3])",
        "weight 'b' (buffer): expected f32[3], got f32[2]",
        "extra: weight 'c' is not an attribute of the module (strict=False ignores such weights)"])


def test_damaged_weightless_entries(files, tmp_path):
    good = (files / "weightless.tcg").read_bytes()
    doc, data = sections(good)

    def bad(edit, minor=3):
        d = json.loads(json.dumps(doc))
        edit(d)
        b = rebuild_text(json.dumps(d, separators=(",", ":")).encode(), data, minor=minor)
        return b, in_json(b, b'{"name":"w","dtype"')

    b, at = bad(lambda d: d["tensors"][0].update(weightless=False))
    assert error(tmp_path, b) == (
        f"f.tcg: byte {at}: tensor 'w' (tensors[0]): weightless: expected true, got false")
    b, at = bad(lambda d: d["tensors"][0].update(offset=0))
    assert error(tmp_path, b) == (
        f"f.tcg: byte {at}: tensor 'w' (tensors[0]): offset: a weightless tensor has no bytes "
        f"in the file, so no 'offset'")
    b, at = bad(lambda d: d["tensors"][0].update(dtype="qint8"))
    assert error(tmp_path, b) == (
        f"f.tcg: byte {at}: tensor 'w' (tensors[0]): dtype: tensors of dtype qint8 cannot be "
        f"stored in the data section")
    b, at = bad(lambda d: d["tensors"][0].update(sizes=[1 << 40, 1 << 40],
                                                 strides=[1 << 40, 1]))
    assert error(tmp_path, b) == (
        f"f.tcg: byte {at}: tensor 'w' (tensors[0]): sizes [1099511627776, 1099511627776] with "
        f"strides [1099511627776, 1] span more bytes than 64 bits can count")
    # A file that says it is version 1.2 cannot have them.
    b, at = bad(lambda d: None, minor=2)
    assert error(tmp_path, b) == (
        f"f.tcg: byte {at}: tensors[0]: unknown key 'weightless' in a file of version 1.2 "
        f"(version 1.3 added it)")


def test_format_tables_are_generated_from_the_cpp_ones():
    # Note [Wire tokens]: the loader's tables are printed by the C++ tool.
    tool = os.environ["TORCHCAP_FORMAT_TABLES"]
    printed = subprocess.run([tool], check=True, capture_output=True, text=True).stdout
    in_tree = (pathlib.Path(__file__).resolve().parents[2] / "python" / "torchcap" /
               "_format_tables.py").read_text()
    assert printed == in_tree, (
        "python/torchcap/_format_tables.py differs from the C++ tables; regenerate it with "
        "build/tests/format_tables > python/torchcap/_format_tables.py")

    # Node names: the C++ graph's reserved names live in the graph layer; both
    # loaders must refuse the same ones among every keyword and builtin.
    import builtins
    import keyword

    from torchcap import _load
    candidates = sorted(set(keyword.kwlist) | set(dir(builtins)) | _load._RESERVED_NODE_NAMES
                        | {"x", "add_1", "_tensor_constant0", "output", "getitem"})
    out = subprocess.run([tool, "--valid-names", *candidates], check=True, capture_output=True,
                         text=True).stdout.split()
    cpp = {name: ok == "1" for name, ok in zip(out[::2], out[1::2])}
    python = {name: bool(_load._NODE_NAME.fullmatch(name))
              and name not in _load._RESERVED_NODE_NAMES for name in candidates}
    assert cpp == python, {n for n in candidates if cpp[n] != python[n]}
