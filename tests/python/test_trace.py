"""torchcap.trace / export / save on Python programs: torchvision eager models
and small modules, compared with eager and with make_fx's operators; errors;
Python -> .tcg -> the C++ interpreter (through `torchcap run`)."""

import collections
import copy
import gc
import os
import pickle
import re
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn as nn
import torchvision
from torch.fx.experimental.proxy_tensor import make_fx

import torchcap
from torchcap import _bridge, _trace
from thread_helpers import run_in_threads

torch.manual_seed(0)
HERE = os.path.abspath(__file__)


# --- Helpers ---------------------------------------------------------------------

# LibTorch's composites choose add_ or add by whether a tensor is a Python
# subclass (make_fx's are); 1.13's make_fx records _reshape_alias where the
# tracer records view, and lift_fresh_copy for lift_fresh.
_SAME_OP = {"_reshape_alias": "view", "lift_fresh_copy": "lift_fresh"}


def op_histogram(gm):
    """aten operator -> count, an op's in-place and out-of-place variants as one."""
    counts = collections.Counter()
    for n in gm.graph.nodes:
        if n.op == "call_function" and str(n.target).startswith("aten."):
            name = str(n.target).split(".")[1].rstrip("_")
            counts[_SAME_OP.get(name, name)] += 1
    return counts


def make_fx_histogram(f, args):
    with torch.no_grad():  # as torchcap's trace
        return op_histogram(make_fx(f)(*args))


def assert_tree_equal(actual, expected):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and list(actual) == list(expected)
        for k in expected:
            assert_tree_equal(actual[k], expected[k])
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_tree_equal(a, e)
    else:
        assert actual == expected


def check_model(model, args, kwargs=None):
    """Traces `model`; the graph's ops are make_fx's and its outputs eager's."""
    kwargs = kwargs or {}
    gm = torchcap.trace(model, args, kwargs)
    assert isinstance(gm, torch.fx.GraphModule)
    with torch.no_grad():
        expected = model(*args, **kwargs)
        assert_tree_equal(gm(*args, **kwargs), expected)
    if not kwargs:
        assert op_histogram(gm) == make_fx_histogram(model, args)
    return gm


# --- torchvision models --------------------------------------------------------------

def test_resnet18():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 64, 64)
    gm = check_model(model, (x,))
    assert op_histogram(gm)["convolution"] == 20


def test_mobilenet_v3_small():
    check_model(torchvision.models.mobilenet_v3_small().eval(), (torch.randn(1, 3, 64, 64),))


def test_vision_transformer():
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                              num_heads=2, hidden_dim=32, mlp_dim=64,
                                              num_classes=10).eval()
    check_model(vit, (torch.randn(2, 3, 32, 32),))


def test_swin():
    check_model(torchvision.models.swin_t().eval(), (torch.randn(1, 3, 64, 64),))


def test_segmentation_dict_output():
    model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights_backbone=None, num_classes=3).eval()
    gm = check_model(model, (torch.randn(1, 3, 64, 64),))
    assert list(gm(torch.randn(1, 3, 64, 64))) == ["out"]


def test_transformer_encoder_layer():
    # Train mode (dropout 0): eval under no_grad takes PyTorch's fused fast path.
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).train()
    check_model(layer, (torch.randn(2, 5, 32),))


def test_passes_named_run_on_the_trace():
    def f(x):
        unused = x.cos()  # noqa: F841
        return x.sin() + x.sin()
    x = torch.randn(3)
    assert op_histogram(torchcap.trace(f, (x,)))["sin"] == 2
    gm = torchcap.trace(f, (x,), passes="cleanup")
    assert op_histogram(gm)["sin"] == 1 and op_histogram(gm)["cos"] == 0
    torch.testing.assert_close(gm(x), f(x))
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    gm = torchcap.export(model, (x,), passes=["cse", "dce", "shapes"])
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x))
    with pytest.raises(torchcap.Error, match="unknown pass 'fold'; the passes are: dce, cse"):
        torchcap.trace(f, (x,), passes=["fold"])


def test_inference_preserves_linear_and_layer_norm():
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).train()
    x = torch.randn(2, 5, 32)
    gm = torchcap.trace(layer, (x,), inference=True)
    ops = op_histogram(gm)
    assert ops["linear"] == 4 and ops["layer_norm"] == 2 and ops["addmm"] == 0
    with torch.no_grad():
        torch.testing.assert_close(gm(x), layer(x))
    gm = torchcap.trace(layer, (x,), inference=True, preserve=["aten::layer_norm"])
    assert op_histogram(gm)["linear"] == 0
    gm = torchcap.trace(layer, (x,), inference=True, preserve=[torch.ops.aten.linear])
    assert op_histogram(gm)["linear"] == 4 and op_histogram(gm)["layer_norm"] == 0
    with pytest.raises(torchcap.TraceError, match="preserve: 'aten::nope' is not a registered"):
        torchcap.trace(layer, (x,), inference=True, preserve=["nope"])
    for one in ("aten::linear", torch.ops.aten.linear, torch.ops.aten.linear.default):
        with pytest.raises(TypeError, match="preserve must be a list of operators"):
            torchcap.trace(layer, (x,), inference=True, preserve=one)


# --- Python modules ---------------------------------------------------------------------

class Nested(nn.Module):
    """Nested inputs and outputs, Python control flow on shapes and flags, an
    in-place op on an intermediate, a constant tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = torch.tensor(2.0)  # not a buffer: lifted as a constant

    def forward(self, pair, extra, *, mask=None, mode="sum"):
        a, b = pair
        h = self.fc(a) + b["bias"]
        h.mul_(self.scale)
        if h.shape[0] > 1:  # Python control flow on a shape
            h = h.relu()
        if mask is not None:
            h = h * mask
        out = h.sum(dim=1) if mode == "sum" else h.mean(dim=1)
        return {"out": out, "parts": [h, extra * 2], "none": None}


def test_nested_pytrees_and_kwargs():
    m = Nested()
    args = ((torch.randn(3, 8), {"bias": torch.randn(8)}), torch.randn(2))
    kwargs = {"mask": torch.ones(3, 8), "mode": "mean"}
    gm = check_model(m, args, kwargs)
    assert "mask" in gm.code and "def forward(self" in gm.code
    assert any(n.target == "_tensor_constant0" for n in gm.graph.nodes if n.op == "get_attr")
    # Other values of the same structure.
    args2 = ((torch.randn(3, 8), {"bias": torch.randn(8)}), torch.randn(2))
    mask2 = torch.rand(3, 8)
    with torch.no_grad():
        assert_tree_equal(gm(*args2, mask=mask2, mode="mean"), m(*args2, mask=mask2, mode="mean"))
    # Upstream-style specs.
    assert gm.in_spec is not None and gm.out_spec is not None
    assert gm.out_spec.num_leaves == 4


Pair = collections.namedtuple("Pair", "first second")


class NamedTuples(nn.Module):
    """A named tuple in, read by field name; named tuples out, one nested."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, pair, *, extra):
        h = self.fc(pair.first) + pair.second
        return Pair(h, {"inner": Pair(h * 2, extra.second), "plain": (h,)})


def test_named_tuples_in_and_out(tmp_path):
    m = NamedTuples()
    pair, extra = Pair(torch.randn(2, 4), torch.randn(4)), Pair(None, torch.randn(3))
    gm = check_model(m, (pair,), {"extra": extra})  # the program reads pair.first
    assert type(gm(pair, extra=extra)) is Pair  # check_model compared types too
    # Other values of the same structure; a plain tuple in its place is refused.
    pair2 = Pair(torch.randn(2, 4), torch.randn(4))
    with torch.no_grad():
        assert_tree_equal(gm(pair2, extra=extra), m(pair2, extra=extra))
    with pytest.raises(torchcap.InputError, match=r"Pair\(Tensor, Tensor\)"):
        gm(tuple(pair2), extra=extra)
    # Kept by pickling and exporting.
    with torch.no_grad():
        assert_tree_equal(pickle.loads(pickle.dumps(gm))(pair2, extra=extra),
                          m(pair2, extra=extra))
        exported = torchcap.export(m, (pair,), {"extra": extra})
        assert_tree_equal(exported(pair2, extra=extra), m(pair2, extra=extra))
    # A .tcg file has no named tuples: loaded, plain tuples in their place,
    # the keywords passed by keyword as when traced.
    torchcap.save(gm, tmp_path / "named.tcg")
    loaded = torchcap.load(tmp_path / "named.tcg")
    result = loaded(tuple(pair2), extra=tuple(extra))
    assert type(result) is tuple and type(result[1]["inner"]) is tuple
    torch.testing.assert_close(result[0], gm(pair2, extra=extra).first, rtol=0, atol=0)


def test_call_with_another_argument_structure_is_a_clear_error():
    m = Nested()
    pair = (torch.randn(3, 8), {"bias": torch.randn(8)})
    extra, mask = torch.randn(2), torch.ones(3, 8)
    gm = torchcap.trace(m, (pair, extra), {"mask": mask, "mode": "mean"})
    expected = "(({'bias': Tensor}"  # not a prefix: the pair is (Tensor, {...})
    traced = "((Tensor, {'bias': Tensor}), Tensor, mask=Tensor, mode=str)"
    calls = {
        "an argument missing": ((pair,), {"mask": mask, "mode": "mean"}),
        "a tensor for the pair": ((torch.randn(2, 3, 8), extra), {"mask": mask, "mode": "mean"}),
        "a list for the pair": ((list(pair), extra), {"mask": mask, "mode": "mean"}),
        "another dict key": (((pair[0], {"b": pair[1]["bias"]}), extra),
                             {"mask": mask, "mode": "mean"}),
        "a keyword missing": ((pair, extra), {"mask": mask}),
        "an unknown keyword": ((pair, extra), {"mask": mask, "mode": "mean", "scale": 2}),
    }
    for what, (a, k) in calls.items():
        with pytest.raises(torchcap.InputError) as e:
            gm(*a, **k)
        message = str(e.value)
        assert f"structured as {traced}" in message, what
        assert expected not in message and "called with (" in message, what
        assert isinstance(e.value, TypeError) and isinstance(e.value, torchcap.Error)
    assert "called with ((Tensor, {'bias': Tensor}), mask=Tensor, mode=str)" in str(
        pytest.raises(torchcap.InputError, gm, pair, mask=mask, mode="mean").value)
    # The traced structure, keywords in any order, positional parameters by name.
    with torch.no_grad():
        want = m(pair, extra, mask=mask, mode="mean")
        assert_tree_equal(gm(pair, extra, mode="mean", mask=mask), want)
        positional = [p for p in inspect_parameters(gm)][:2]
        assert_tree_equal(gm(**{positional[0]: pair, positional[1]: extra}, mask=mask,
                             mode="mean"), want)


def test_keywords_that_are_no_parameter_names(tmp_path):
    # Note [Keywords that are no parameter names] in _codegen.py: a Python
    # keyword, a name the generated code reads (torch, getattr, float), a
    # placeholder's name, or a parameter of torchcap's own call path, each
    # passed by the caller's own keyword.
    def f(a, *, scale, **k):
        return a * scale + k["class"] - k["torch"] * k["getattr"] + k["ph_0"] / k["obj"]

    x = torch.randn(4)
    kwargs = {"scale": torch.randn(4), "class": torch.randn(4), "torch": torch.randn(4),
              "getattr": torch.randn(4), "ph_0": torch.randn(4), "obj": torch.rand(4) + 1}
    others = {k: torch.randn(4) for k in kwargs}
    for gm in (torchcap.trace(f, (x,), kwargs), torchcap.export(f, (x,), kwargs)):
        torch.testing.assert_close(gm(x, **kwargs), f(x, **kwargs), rtol=0, atol=0)
        torch.testing.assert_close(gm(x, **others), f(x, **others), rtol=0, atol=0)
        # The keywords that can be parameters stay parameters.
        import inspect
        assert "scale" in inspect.signature(gm.forward).parameters
        # Which keywords a call passes is still checked.
        missing = {k: v for k, v in kwargs.items() if k != "class"}
        with pytest.raises(torchcap.InputError, match="called with"):
            gm(x, **missing)
        with pytest.raises(torchcap.InputError, match="called with"):
            gm(x, **kwargs, other=x)
        torch.testing.assert_close(pickle.loads(pickle.dumps(gm))(x, **others),
                                   f(x, **others), rtol=0, atol=0)
    # Saved and loaded: called with the same keywords (Note [Calling
    # convention] in src/graph/call_convention.cpp).
    torchcap.save(gm, tmp_path / "k.tcg")
    loaded = torchcap.load(tmp_path / "k.tcg")
    torch.testing.assert_close(loaded(x, **others), f(x, **others), rtol=0, atol=0)
    with pytest.raises(torchcap.InputError, match="called with"):
        loaded(x, **missing)
    # Only such keywords.
    g = torchcap.trace(lambda a, **k: a + k["class"], (x,), {"class": x})
    assert torch.equal(g(x, **{"class": x * 2}), x * 3)


def inspect_parameters(gm):
    import inspect
    return [name for name, p in inspect.signature(gm.forward).parameters.items()
            if p.kind == p.POSITIONAL_OR_KEYWORD]


def test_tied_weights_are_one_attribute():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, idx):
            return self.head(self.emb(idx))

    m = Tied()
    gm = check_model(m, (torch.tensor([[1, 2, 3]]),))
    reads = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert reads == ["emb.weight"]
    assert gm.emb.weight is m.emb.weight  # the module's own parameter


def test_parameters_buffers_and_modules_listed_as_torch_lists_them():
    # _module_contents walks the modules once; it lists what
    # named_parameters(), named_buffers() and named_modules() list.
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)
            self.b.weight = self.a.weight  # tied
            self.again = self.a  # one module at two paths
            self.none = None
            self.register_buffer("buf", torch.zeros(3))
            self.register_buffer("missing", None)
            self.seq = nn.Sequential(self.b, nn.ReLU(), nn.Sequential(nn.BatchNorm1d(3)))
            self.seq[2].register_buffer("alias", self.buf)  # one buffer at two paths

    class OwnListing(nn.Linear):
        def named_parameters(self, *args, **kwargs):
            yield from [("renamed", self.weight)]

    def expected(m):
        return (list(m.named_parameters()), list(m.named_buffers()),
                [(sub, name, f"{type(sub).__module__}.{type(sub).__qualname__}")
                 for name, sub in m.named_modules()])

    class Params(dict):  # a mapping of another type: listed through items()
        pass

    reordered = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 3))
    reordered._modules.move_to_end("0")  # an OrderedDict's order, not its dict's
    reordered[0]._parameters = dict(reversed(list(reordered[0]._parameters.items())))
    reordered[2]._parameters = Params(reordered[2]._parameters)
    for m in (Odd(), torchvision.models.resnet18(), nn.Sequential(Odd(), OwnListing(3, 3)),
              OwnListing(2, 2), reordered):
        assert _trace._module_contents(m, True) == expected(m)
        assert _trace._module_contents(m, False) == expected(m)[:2] + ([],)


def test_traced_module_is_made_as_graph_module_makes_it():
    # The module and the submodules holding its tensors are made without
    # torch.fx's constructor and nn.Module(), as they would make them.
    m = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    gm = torchcap.trace(m, (x,))
    fresh = vars(nn.Module())
    for name, sub in gm.named_modules():
        if name:
            assert type(sub) is nn.Module
            own = {k: v for k, v in vars(sub).items() if k not in ("_parameters", "_buffers", "_modules")}
            assert own == {k: v for k, v in fresh.items() if k not in ("_parameters", "_buffers", "_modules")}
            assert [(k, type(v)) for k, v in vars(sub).items()] == [(k, type(v)) for k, v in fresh.items()]
            assert all(vars(sub)[k] is not vars(other)[k]
                       for _, other in gm.named_modules() if other is not sub
                       for k, v in fresh.items() if isinstance(v, (dict, set)))
    made = torch.fx.GraphModule(nn.Module(), torch.fx.Graph(), class_name="TorchcapGraphModule")
    ours = [k for k in vars(gm) if not k.startswith("_torchcap") and k not in ("in_spec", "out_spec")]
    assert ours == [k for k in vars(made) if k not in ("_graph", "_code")]
    assert type(gm).__name__ == type(made).__name__ and type(gm).__mro__[1:] == type(made).__mro__[1:]
    assert type(gm).__qualname__ == type(made).__qualname__
    # Its class, made by one type() call on this torch, has what the slow way
    # (torch.fx's constructor, then the class's attributes set one by one) gives.
    assert _bridge._new_traced_module.__name__ == "fast"
    slow = _bridge._new_graph_module(True)
    _bridge._set_graph_built_later(slow, None)
    other = torchcap.trace(m, (x,))  # as made: attributes not attached yet
    assert vars(type(other)).keys() == vars(type(slow)).keys()
    assert vars(gm).keys() - vars(slow).keys() == {"_torchcap_graph", "_torchcap_keywords",
                                                    "_torchcap_attributes", "in_spec", "out_spec",
                                                    "_torchcap_call_structure", "_torchcap_inputs",
                                                    "_torchcap_dynamic"}
    assert type(other) is not type(gm) and type(other)._wrapped_call is not type(gm)._wrapped_call
    assert dict(gm.named_parameters()).keys() == dict(m.named_parameters()).keys()
    assert all(gm.get_parameter(k) is p for k, p in m.named_parameters())
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    buffers = {k: b for k, b in m.named_buffers() if k in read}
    assert len(buffers) == 40 and all(gm.get_buffer(k) is b for k, b in buffers.items())
    assert {k for k, _ in gm.named_buffers()} == buffers.keys()
    assert [name for name, _ in gm._torchcap_attributes] == \
        [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert_tree_equal(gm(x), m(x))
    gm.recompile()  # as torch.fx's own: its call wrapper (with the argument check) stays
    assert_tree_equal(gm(x), m(x))
    with pytest.raises(torchcap.InputError):
        gm((x,))


def test_plain_function_and_bound_method():
    def f(x, y):
        return torch.sin(x) @ y.t(), x.shape[0]

    with pytest.raises(torchcap.TraceError, match="output"):
        torchcap.trace(f, (torch.randn(2, 3), torch.randn(4, 3)))

    gm = torchcap.trace(lambda x, y: (torch.sin(x) @ y.t(),), (torch.randn(2, 3), torch.randn(4, 3)))
    x, y = torch.randn(2, 3), torch.randn(4, 3)
    assert_tree_equal(gm(x, y), (torch.sin(x) @ y.t(),))

    m = nn.Linear(3, 2)
    gm = torchcap.trace(m.forward, (x,))
    assert {n.target for n in gm.graph.nodes if n.op == "get_attr"} == {"weight", "bias"}


# --- Metadata ------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return torch.tanh(y)  # the stack trace names this line


def test_stack_traces_and_module_stacks():
    m = nn.Sequential(Block(), nn.ReLU())
    gm = torchcap.trace(m, (torch.randn(1, 3, 8, 8),))
    tanh = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.tanh.default)
    trace = tanh.meta["stack_trace"]
    assert f'File "{HERE}"' in trace and "in forward" in trace
    assert "return torch.tanh(y)  # the stack trace names this line" in trace
    assert "torch/nn" not in trace and "torchcap/" not in trace
    # Outermost first, the root module included (path ""), as torch.export records it.
    assert tanh.meta["nn_module_stack"] == {"": ("", "torch.nn.modules.container.Sequential"),
                                            "0": ("0", f"{__name__}.Block")}
    conv = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.convolution.default)
    assert list(conv.meta["nn_module_stack"]) == ["", "0", "0.conv"]
    assert conv.meta["nn_module_stack"]["0.conv"][1] == "torch.nn.modules.conv.Conv2d"
    assert conv.meta["val"].shape == (1, 4, 6, 6) and conv.meta["val"].dtype == torch.float32

    gm = torchcap.trace(m, (torch.randn(1, 3, 8, 8),), record_stack_traces=False)
    assert all("stack_trace" not in n.meta and "nn_module_stack" not in n.meta
               for n in gm.graph.nodes)


class LinesAndLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])

    def forward(self, x):
        y = torch.sin(x)  # line one
        y = torch.cos(y)  # line two
        for layer in self.layers:
            y = torch.relu(layer(y))  # one line, another module each time
        return y


def test_consecutive_nodes_of_other_lines_and_modules():
    # Consecutive nodes of one module on other lines, and of other modules
    # called from one line, each get their own stack trace and module stack.
    gm = torchcap.trace(LinesAndLoop(), (torch.randn(2, 3),))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target.__name__ for n in nodes] == ["sin.default", "cos.default", "t.default",
                                                  "addmm.default", "relu.default", "t.default",
                                                  "addmm.default", "relu.default"]
    last_line = [n.meta["stack_trace"].strip().splitlines()[-1].strip() for n in nodes]
    assert last_line[:2] == ["y = torch.sin(x)  # line one", "y = torch.cos(y)  # line two"]
    # The Linear's own frames are torch's: its operators name the loop's line.
    assert set(last_line[2:]) == {"y = torch.relu(layer(y))  # one line, another module each time"}
    assert [list(n.meta["nn_module_stack"]) for n in nodes] == [
        [""], [""], ["", "layers.0"], ["", "layers.0"], [""], ["", "layers.1"], ["", "layers.1"], [""]]


def _sources(gm):
    return [(n.name, n.meta.get("stack_trace"), n.meta.get("nn_module_stack"))
            for n in gm.graph.nodes]


def test_stack_traces_the_same_when_traced_again():
    # Note [Frames cached across traces]: a second trace, of the same program
    # or another, finds what the first made; the nodes say the same.
    m = nn.Sequential(Block(), nn.ReLU())
    x = torch.randn(1, 3, 8, 8)
    first = _sources(torchcap.trace(m, (x,)))
    other = torch.nn.Sequential(nn.ReLU(), Block())  # the same code, other modules
    other_first = _sources(torchcap.trace(other, (x,)))
    assert _sources(torchcap.trace(m, (x,))) == first
    assert _sources(torchcap.trace(other, (x,))) == other_first
    assert other_first != first
    tanh = [s for name, s, _ in first if name == "tanh"]
    assert tanh == [s for name, s, _ in other_first if name == "tanh"]
    assert "return torch.tanh(y)" in tanh[0]


def test_module_stacks_follow_renamed_and_reclassed_modules():
    # Note [Module stacks cached across traces]: the same module objects, now
    # under another name or of another class, are on the next trace's stacks
    # as they are then.
    m = nn.Sequential(Block(), nn.ReLU())
    x = torch.randn(1, 3, 8, 8)

    def tanh_stack():
        gm = torchcap.trace(m, (x,))
        return next(n for n in gm.graph.nodes
                    if n.target == torch.ops.aten.tanh.default).meta["nn_module_stack"]

    assert list(tanh_stack()) == ["", "0"]
    m._modules["body"] = m._modules.pop("0")
    m._modules.move_to_end("body", last=False)
    assert tanh_stack() == {"": ("", "torch.nn.modules.container.Sequential"),
                            "body": ("body", f"{__name__}.Block")}

    class Renamed(Block):
        pass

    m.body.__class__ = Renamed
    assert tanh_stack()["body"] == ("body", f"{__name__}.{Renamed.__qualname__}")


def test_module_stacks_of_a_module_two_models_share():
    # One module object under two paths, in two models: each trace names its
    # own, traced in turn and from two threads at once.
    shared = Block()
    a = nn.Sequential(shared, nn.ReLU())
    b = nn.Sequential(nn.ReLU(), nn.Sequential(shared))
    x = torch.randn(1, 3, 8, 8)

    def tanh_stack(model):
        gm = torchcap.trace(model, (x,))
        return list(next(n for n in gm.graph.nodes
                         if n.target == torch.ops.aten.tanh.default).meta["nn_module_stack"])

    for _ in range(3):
        assert tanh_stack(a) == ["", "0"]
        assert tanh_stack(b) == ["", "1", "1.0"]
    stacks = {"a": [], "b": []}

    def work(name, model):
        for _ in range(20):
            stacks[name].append(tanh_stack(model))

    threads = [threading.Thread(target=work, args=item) for item in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stacks == {"a": [["", "0"]] * 20, "b": [["", "1", "1.0"]] * 20}
    assert tanh_stack(a) == ["", "0"]


def test_module_list_of_other_types_is_refused():
    m = nn.Linear(2, 2)
    args = (m, [], [], (torch.randn(1, 2),), {}, False, False, None, False, False, True,
            _trace._INTERNAL_DIRS)
    for modules, match in (([(m, "", "Linear", 1)], r"modules\[0\]"),
                           ([(m, "", "x"), (m, 0, "Linear")], r"modules\[1\]")):
        with pytest.raises(TypeError, match=match):
            _trace._C.trace(*args, modules)


def test_resnet_module_stack():
    model = torchvision.models.resnet18().eval()
    gm = torchcap.trace(model, (torch.randn(1, 3, 32, 32),))
    stacks = [n.meta.get("nn_module_stack", {}) for n in gm.graph.nodes]
    assert any(list(s) == ["", "layer1", "layer1.0", "layer1.0.conv1"] for s in stacks)
    # Every recorded operator runs inside the root's forward.
    assert all(s.get("") == ("", "torchvision.models.resnet.ResNet")
               for n, s in zip(gm.graph.nodes, stacks) if n.op == "call_function")
    trace = next(n for n in gm.graph.nodes if n.op == "call_function").meta["stack_trace"]
    assert "torchvision/models/resnet.py" in trace


def test_module_stack_has_the_root_for_a_bound_method_and_a_leaf_module():
    # f = model.forward: the root's hooks never run, the root is still outermost.
    m = nn.Sequential(Block(), nn.ReLU())
    gm = torchcap.trace(m.forward, (torch.randn(1, 3, 8, 8),))
    relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
    assert list(relu.meta["nn_module_stack"]) == ["", "1"]
    # A module without submodules: the root alone.
    gm = torchcap.trace(nn.Linear(3, 2), (torch.randn(1, 3),))
    addmm = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert addmm.meta["nn_module_stack"] == {"": ("", "torch.nn.modules.linear.Linear")}
    # A plain function has no module stack.
    gm = torchcap.trace(lambda x: x.sin(), (torch.randn(2),))
    assert all("nn_module_stack" not in n.meta for n in gm.graph.nodes)


class Closure(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))

    def forward(self, x):
        def helper(y):  # captures self: in a cell, not a plain local
            return y * self.scale
        return helper(x).cos()


class Derived(Closure):
    def forward(self, x):
        return super().forward(x).sin()


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.derived = Derived()
        self.direct = Closure()

    def forward(self, x):
        return self.direct.forward(self.derived(x)).exp()


def test_module_stacks_read_from_frames():
    # Module stacks come from the Python frames running a module's forward:
    # a self captured by a closure, a forward calling its base class's (one
    # module call) and a submodule's forward called directly all count.
    gm = torchcap.trace(Outer(), (torch.randn(2),))
    stacks = {n.target: list(n.meta["nn_module_stack"]) for n in gm.graph.nodes
              if n.op == "call_function"}
    assert stacks[torch.ops.aten.sin.default] == ["", "derived"]
    assert stacks[torch.ops.aten.cos.default] in (["", "derived"], ["", "direct"])
    assert stacks[torch.ops.aten.exp.default] == [""]
    cosines = [list(n.meta["nn_module_stack"]) for n in gm.graph.nodes
               if n.target == torch.ops.aten.cos.default]
    assert cosines == [["", "derived"], ["", "direct"]]


# --- Export ----------------------------------------------------------------------------------

def test_export_batchnorm_train_mode_has_the_programs_effect():
    model = torchvision.models.resnet18().train()
    before = copy.deepcopy(model)
    x = torch.randn(2, 3, 32, 32)
    ep = torchcap.export(model, (x,))
    assert not any(str(n.target).split(".")[1].endswith("_") for n in ep.graph.nodes
                   if n.op == "call_function" and str(n.target).startswith("aten."))
    # The graph holds the buffers as they were before the trace; running it once
    # is running the program once.
    torch.testing.assert_close(ep.bn1.running_mean, before.bn1.running_mean)
    out = ep(x)
    expected = before(x)
    torch.testing.assert_close(out, expected)
    for name, buf in before.named_buffers():
        torch.testing.assert_close(ep.get_buffer(name), buf, msg=name)
    assert ep.bn1.num_batches_tracked.item() == 1
    assert torchcap.dispatch_trace(before, (x,)).code.count("copy_") == ep.code.count("copy_")


def test_export_input_mutation():
    def f(x, y):
        x.add_(1)
        return x * y

    x, y = torch.zeros(3), torch.ones(3)
    ep = torchcap.export(f, (x, y))
    assert torch.equal(x, torch.zeros(3))  # the trace works on a copy
    out = ep(x, y)
    assert torch.equal(out, torch.ones(3)) and torch.equal(x, torch.ones(3))


@pytest.mark.parametrize("made_by", ["trace", "export", "load"])
def test_buffer_updates_from_several_threads(tmp_path, made_by):
    # Note [Concurrent runs that write buffers back] in _codegen.py: runs of a
    # module that write buffers back are serialized, so no update is lost
    # (the exported module reached about 190 of 800). A traced module
    # (allow_input_mutation or not) writes its buffers in place, as eager.
    torch.manual_seed(0)
    model = nn.BatchNorm1d(4).train()
    eager = copy.deepcopy(model)
    x = torch.randn(8, 4)
    if made_by == "trace":
        gm = torchcap.trace(model, (x,), allow_input_mutation=True)
    else:
        gm = torchcap.export(model, (x,))
    if made_by == "load":
        torchcap.save(gm, tmp_path / "bn.tcg")
        gm = torchcap.load(tmp_path / "bn.tcg")
    assert run_in_threads(lambda: gm(x)) == []
    for _ in range(800):
        eager(x)
    assert gm.num_batches_tracked.item() == eager.num_batches_tracked.item() == 800
    # The same input each time: the statistics do not depend on the order.
    torch.testing.assert_close(gm.running_mean, eager.running_mean)
    torch.testing.assert_close(gm.running_var, eager.running_var)
    if made_by == "trace":
        return
    assert "with _buffer_updates_lock(self):" in gm.code
    # One lock per module: while it is held, the module's runs wait and
    # another module's go ahead; copies have their own.
    from torchcap import _codegen
    other = copy.deepcopy(gm)
    assert _codegen._buffer_updates_lock(other) is not _codegen._buffer_updates_lock(gm)
    with _codegen._buffer_updates_lock(gm):
        waiting = threading.Thread(target=gm, args=(x,))
        waiting.start()
        assert run_in_threads(lambda: other(x), threads=2, calls=5) == []
        waiting.join(0.2)
        assert waiting.is_alive() and gm.num_batches_tracked.item() == 800
    waiting.join()
    assert gm.num_batches_tracked.item() == 801 and other.num_batches_tracked.item() == 810
    # Graphs that write no buffers run without a lock, in parallel.
    assert "_buffer_updates_lock" not in torchcap.export(model.eval(), (x,)).code
    assert "_buffer_updates_lock" not in torchcap.export(lambda a: a.add_(1), (x,)).code


# --- Errors -----------------------------------------------------------------------------------

def test_data_dependent_control_flow_is_an_error_naming_the_line():
    def f(x):
        if x.sum() > 0:  # data-dependent
            return x + 1
        return x - 1

    x = torch.randn(4)
    with pytest.raises(torchcap.TraceError) as info:
        torchcap.trace(f, (x,))
    message = str(info.value)
    assert "aten::_local_scalar_dense" in message or "is_nonzero" in message
    assert "allow_data_dependent_values=True" in message
    assert "if x.sum() > 0:  # data-dependent" in message and HERE in message
    assert isinstance(info.value, RuntimeError)
    gm = torchcap.trace(f, (x,), allow_data_dependent_values=True)
    assert torch.equal(gm(x), f(x))


def test_values_no_input_can_change_are_read_as_constants():
    """Note [Values no input can change]: torchvision's detection transform
    reads a factor computed from the image's sizes and literals (`.item()`,
    `float()`), and MultiScaleRoIAlign log2 of a ratio of sizes; those reads
    are constants of the graph, allowed without allow_data_dependent_values.
    A parameter's value is not such a constant, nor a random number."""
    class Resize(nn.Module):
        def forward(self, image):
            im_shape = torch.tensor(image.shape[-2:])
            scale = torch.min(200.0 / im_shape.min().to(torch.float32), 300.0 / im_shape.max())
            factor = scale.item()
            level = float(torch.tensor(100 / image.shape[-1]).log2().round())
            return torch.nn.functional.interpolate(image[None], scale_factor=factor)[0] * level

    image = torch.rand(3, 40, 60)
    gm = torchcap.trace(Resize(), (image,))
    assert all(n.target is not torch.ops.aten._local_scalar_dense.default for n in gm.graph.nodes)
    assert torch.equal(gm(image), Resize()(image))

    class ByWeight(nn.Linear):
        def forward(self, x):
            return x * self.weight.sum().item()

    with pytest.raises(torchcap.TraceError, match="aten::_local_scalar_dense reads a tensor's value"):
        torchcap.trace(ByWeight(2, 2), (torch.ones(2),))
    with pytest.raises(torchcap.TraceError, match="aten::_local_scalar_dense reads a tensor's value"):
        torchcap.trace(lambda x: x * torch.rand(()).item(), (torch.ones(2),))


def test_values_read_with_allow_data_dependent_values_are_guarded(tmp_path):
    """Note [Guards of values the program read]: the read is baked in and
    checked on every run, by the traced module, a loaded one and the
    command; a run that reads another value fails naming the line and both
    values, instead of answering with the traced branch."""
    def f(x):
        return x * 2 if x.sum() > 0 else x * 3

    gm = torchcap.trace(f, (torch.ones(3),), allow_data_dependent_values=True)
    assert any(n.target is torch.ops.torchcap.guard_value.default for n in gm.graph.nodes)
    torchcap.save(gm, tmp_path / "g.tcg")
    for module in (gm, torchcap.load(tmp_path / "g.tcg")):
        assert torch.equal(module(torch.full((3,), 2.0)), torch.full((3,), 4.0))
        with pytest.raises(torchcap.Error) as info:
            module(-torch.ones(3))
        message = str(info.value)
        # (Through torch.fx's code, Python hands the bools over as ints.)
        assert re.search(r"that was (True|1) when it was traced and is (False|0) in this run",
                         message), message
        assert "return x * 2 if x.sum() > 0 else x * 3" in message and HERE in message
    cli = os.environ.get("TORCHCAP_CLI")
    if cli:
        torch.save(-torch.ones(3), tmp_path / "x.pt")
        out = subprocess.run([cli, "run", str(tmp_path / "g.tcg"), "--input", str(tmp_path / "x.pt")],
                             capture_output=True, text=True)
        assert out.returncode == 1 and "that was True when it was traced and is False" in out.stderr, \
            out.stderr

    # A raw read (.tolist()) is checked against a copy of the values read.
    g = torchcap.trace(lambda x: x * x.argmax().tolist(), (torch.tensor([1.0, 3.0, 2.0]),),
                       allow_data_dependent_values=True)
    assert torch.equal(g(torch.tensor([0.0, 5.0, 1.0])), torch.tensor([0.0, 5.0, 1.0]))
    with pytest.raises(torchcap.Error, match="which were 1 when it was traced and are 0 in this run"):
        g(torch.tensor([5.0, 0.0, 1.0]))


# --- Silent wrong answers and internal errors, closed as classes (issue 42) ---------------

def test_work_on_another_thread_is_refused_not_baked_in():
    import concurrent.futures
    x = torch.randn(4)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with pytest.raises(torchcap.TraceError, match="aten::cos was called on a traced tensor on "
                                                      "a thread that is not tracing it"):
            torchcap.trace(lambda a: pool.submit(lambda: a.cos()).result() + 1, (x,))


@pytest.mark.parametrize("name, f", [
    ("aten::index.Tensor", lambda a: a[a > 0]),
    ("aten::nonzero", lambda a: torch.nonzero(a)),
    ("aten::nonzero", lambda a: torch.where(a > 0)[0]),
    ("aten::masked_select", lambda a: torch.masked_select(a, a > 0)),
    ("aten::_unique2", lambda a: torch.unique(a.round())),
])
def test_shapes_that_depend_on_values_are_refused_naming_the_line(name, f):
    x = torch.randn(8)
    with pytest.raises(torchcap.TraceError) as info:
        torchcap.trace(f, (x,))
    message = str(info.value)
    assert message.startswith(name + " returns a tensor whose shape depends on tensor values")
    assert "allow_data_dependent_values=True" in message and HERE in message
    # Allowed, the graph computes the size on every run.
    gm = torchcap.trace(f, (x,), allow_data_dependent_values=True)
    y = torch.randn(8)
    assert torch.equal(gm(y), f(y))


@pytest.mark.parametrize("read", [lambda a: a.tolist()[0], lambda a: float(a.numpy()[0]),
                                  lambda a: a.data_ptr() % 2])
def test_raw_reads_of_traced_tensors_are_trace_errors(read):
    with pytest.raises(torchcap.TraceError, match="reads the memory of traced tensor") as info:
        torchcap.trace(lambda a: a * read(a), (torch.ones(3),))
    assert HERE in str(info.value) and str(info.value).count(HERE) == 1
    gm = torchcap.trace(lambda a: a * read(a), (torch.ones(3),), allow_data_dependent_values=True)
    assert gm(torch.ones(3)).shape == (3,)


@pytest.mark.parametrize("f, args", [
    (lambda a: torch.nn.functional.max_pool1d(a, 2), (torch.randn(1, 2, 8),)),
    (lambda a: torch.linalg.eigvals(a).real, (torch.randn(3, 3),)),
    (lambda lp, t: torch.nn.functional.ctc_loss(lp, t, torch.tensor([5]), torch.tensor([2])),
     (torch.randn(5, 1, 4).log_softmax(2), torch.tensor([[1, 2]]))),
])
def test_composites_with_a_raw_fast_path_trace(f, args):
    # Note [Wrappers are subclass-like]: their operator path, as make_fx's.
    # (ctc_loss's log_alpha has a size that depends on values: allowed here.)
    gm = torchcap.trace(f, args, allow_data_dependent_values=True)
    assert torch.allclose(gm(*args), f(*args))
    exported = torchcap.dispatch_trace(f, args) if f.__code__.co_argcount == 1 else None
    if exported is not None:
        assert torch.allclose(exported(*args), f(*args))


def test_tensor_split_by_a_traced_tensor_names_the_operator():
    with pytest.raises(torchcap.TraceError, match="aten::tensor_split.tensor_indices_or_sections "
                                                  "reads the memory of traced tensor %i"):
        torchcap.trace(lambda a, i: torch.tensor_split(a, i)[0], (torch.randn(6), torch.tensor([2])))


def test_backward_inside_a_trace_points_to_export_training():
    def f(a):
        w = torch.ones(4, requires_grad=True)
        (a * w).sum().backward()
        return w.grad

    with pytest.raises(torchcap.TraceError, match="capture no gradients.*export_training"):
        torchcap.trace(f, (torch.randn(4),))


@pytest.mark.parametrize("op, f", [
    ("aten::t_", lambda a: a.t_() * 1),
    ("aten::unsqueeze_", lambda a: a.unsqueeze_(0) * 1),
    ("aten::resize_", lambda a: a.resize_(6) * 1),
    ("aten::set_", lambda a: a.set_(torch.zeros(3)) * 1),
])
def test_export_refuses_changes_of_an_inputs_shape_or_memory(op, f):
    x = torch.randn(2, 3)
    with pytest.raises(torchcap.TraceError, match=re.escape(f"({op}") + ".*graph input %a "):
        torchcap.export(f, (x.clone(),))
    # trace with allow_input_mutation runs the operator itself.
    gm = torchcap.trace(f, (x.clone(),), allow_input_mutation=True)
    a, b = x.clone(), x.clone()
    assert torch.equal(gm(a), f(b)) and a.shape == b.shape


def test_export_of_a_write_through_a_view_of_an_input():
    def f(a):
        a[0].add_(1)
        return a

    gm = torchcap.export(f, (torch.randn(2, 3),))
    a = torch.randn(2, 3)
    expected = f(a.clone())
    out = gm(a)
    assert torch.equal(out, expected) and torch.equal(a, expected)


def test_dispatch_trace_refuses_out_arguments_that_are_inputs():
    def f(a, b):
        return torch.add(a, b, out=a)

    with pytest.raises(torchcap.TraceError, match="Immutable tensor `out` is potentially getting "
                                                  "modified by aten::add.out") as info:
        torchcap.dispatch_trace(f, (torch.randn(3), torch.randn(3)))
    assert HERE in str(info.value)
    # export gives the write back through its signature.
    a = torch.ones(3)
    torchcap.export(f, (torch.randn(3), torch.randn(3)))(a, torch.ones(3))
    assert torch.equal(a, torch.full((3,), 2.0))


def test_inputs_of_other_strides_run_in_the_traced_layout(tmp_path):
    # Note [Inputs in the traced layout]: embedding_bag reads its indices as
    # laid out when traced; LibTorch made them contiguous only if they were not.
    weight = torch.randn(10, 3)
    offsets = torch.tensor([0, 2])
    strided = torch.tensor([0, 9, 2, 9, 4, 9, 5, 9])[::2]

    def f(i, o):
        return torch.nn.functional.embedding_bag(i, weight, o)

    for traced_with in (strided.contiguous(), strided):
        modules = [torchcap.trace(f, (traced_with, offsets)),
                   torchcap.dispatch_trace(f, (traced_with, offsets))]
        torchcap.save(modules[0], tmp_path / "bag.tcg")
        modules.append(torchcap.load(tmp_path / "bag.tcg"))
        for gm in modules:
            for given in (strided, strided.contiguous()):
                assert torch.equal(gm(given, offsets), f(given, offsets))


def test_written_inputs_of_other_strides_are_refused():
    gm = torchcap.trace(lambda a: a.add_(1), (torch.zeros(2, 3),), allow_input_mutation=True)
    transposed = torch.zeros(3, 2).t()
    with pytest.raises(torchcap.InputError, match=re.escape(
            "input 0 (a, args[0]) is written by the graph and must have the strides it was "
            "traced with, [3, 1]; got [1, 2]")):
        gm(transposed)
    assert torch.equal(transposed, torch.zeros(2, 3))


def test_item_is_an_error():
    with pytest.raises(torchcap.TraceError, match="reads a tensor's value"):
        torchcap.trace(lambda x: x * x.max().item(), (torch.randn(3),))


def test_input_mutation_is_an_error_and_the_input_keeps_its_value():
    x = torch.zeros(3)
    with pytest.raises(torchcap.TraceError, match="Immutable tensor") as info:
        torchcap.trace(lambda t: t.add_(1), (x,))
    assert "allow_input_mutation=True" in str(info.value) and HERE in str(info.value)
    assert torch.equal(x, torch.zeros(3))
    gm = torchcap.trace(lambda t: t.add_(1), (x,), allow_input_mutation=True)
    assert torch.equal(x, torch.zeros(3))
    assert torch.equal(gm(x.clone()), torch.ones(3))


def test_unsupported_argument_types():
    with pytest.raises(torchcap.TraceError, match=r"args\[1\]: .*type object"):
        torchcap.trace(lambda x, o: x, (torch.ones(1), object()))
    with pytest.raises(torchcap.TraceError, match=r"kwargs\['k'\]\[0\].*type set"):
        torchcap.trace(lambda x, k: x, (torch.ones(1),), {"k": [{1}]})
    with pytest.raises(TypeError, match="tuple"):
        torchcap.trace(lambda x: x, torch.ones(1))
    with pytest.raises(torchcap.TraceError, match="output"):
        torchcap.trace(lambda x: "text", (torch.ones(1),))


def test_module_holding_a_non_tensor_as_a_buffer_is_refused():
    # register_buffer checks the type; writing the module's dict does not.
    m = nn.Sequential(nn.Linear(2, 2))
    m[0]._buffers["scale"] = 2.0
    with pytest.raises(torchcap.TraceError, match="buffer '0.scale' is a float, not a tensor"):
        torchcap.trace(m, (torch.ones(1, 2),))
    m[0]._buffers["scale"] = torch.ones(1)
    assert torch.equal(torchcap.trace(m, (torch.ones(1, 2),))(torch.ones(1, 2)),
                       m(torch.ones(1, 2)))


def test_wrong_inputs_to_the_graph():
    gm = torchcap.trace(lambda p: p[0] + p[1], ((torch.ones(2), torch.ones(2)),))
    with pytest.raises(Exception):
        gm((torch.ones(2),))


@pytest.mark.parametrize("made_by", ["trace", "export", "load"])
def test_inputs_of_other_shapes_or_dtypes_are_refused(tmp_path, made_by):
    # The graph holds the traced shapes: view(2, -1) stays that, and on a
    # [5, 3, 4] input would give a [2, 30] result without a word.
    def f(x, *, scale):
        return x.view(x.shape[0], -1) * scale

    x, scale = torch.randn(2, 3, 4), torch.randn(12)
    gm = (torchcap.export if made_by == "export" else torchcap.trace)(f, (x,), {"scale": scale})
    call = gm
    if made_by == "load":  # called as the traced module: the file keeps the keywords
        torchcap.save(gm, tmp_path / "f.tcg")
        call = torchcap.load(tmp_path / "f.tcg")
    expected = f(x, scale=scale)
    torch.testing.assert_close(call(x, scale=scale), expected, rtol=0, atol=0)
    other = torch.randn(5, 3, 4)
    with pytest.raises(torchcap.InputError,
                       match=r"input 0 \(x[^)]*\): expected f32\[2, 3, 4\], got f32\[5, 3, 4\]"):
        call(other, scale=scale)
    with pytest.raises(torchcap.InputError,
                       match=r"input 1 \(scale[^)]*\): expected f32\[12\], got f64\[12\]"):
        call(x, scale=scale.double())
    assert other.shape == (5, 3, 4)  # the inputs are left as they were
    if made_by != "load":  # keywords in another order are matched by name
        two = torchcap.trace(lambda *, a, b: a.sum() + b.sum(), (), {"a": torch.ones(2, 3), "b": torch.ones(4)})
        assert two(b=torch.ones(4), a=torch.ones(2, 3)).item() == 10
        with pytest.raises(torchcap.InputError, match=r"expected f32\[2, 3\], got f32\[4\]"):
            two(b=torch.ones(2, 3), a=torch.ones(4))
        # Kept by pickling.
        with pytest.raises(torchcap.InputError):
            pickle.loads(pickle.dumps(gm))(other, scale=scale)
    # Each input named as the C++ Interpreter names it, and where the call
    # passed it.
    where = ["input 0 (x, args[0])", "input 1 (scale, kwargs['scale'])"]
    with pytest.raises(torchcap.InputError) as e:
        call(other, scale=scale.double())
    assert f"\n  {where[0]}: expected f32[2, 3, 4], got f32[5, 3, 4]\n" in str(e.value)
    assert f"\n  {where[1]}: expected f32[12], got f64[12]\n" in str(e.value)


@pytest.mark.parametrize("made_by", ["trace", "export", "load"])
def test_values_that_are_not_tensors_are_refused(tmp_path, made_by):
    # Note [Inputs of the traced shapes] in _runtime.py: None or a NumPy array
    # where a tensor was traced failed inside an operator with its error,
    # and a number was computed with, without a word.
    import numpy as np

    def f(x, *, scale):
        return x * scale

    x, scale = torch.randn(4), torch.randn(4)
    gm = (torchcap.export if made_by == "export" else torchcap.trace)(f, (x,), {"scale": scale})
    call, where = gm, ["input 0 (x, args[0])", "input 1 (scale, kwargs['scale'])"]
    if made_by == "load":
        torchcap.save(gm, tmp_path / "f.tcg")
        call = torchcap.load(tmp_path / "f.tcg")
    values = {"None": None, "a numpy.ndarray": np.ones(4, dtype=np.float32),
              "a float (2.0)": 2.0, "an int (3)": 3, "a bool (True)": True}
    for got, value in values.items():
        with pytest.raises(torchcap.InputError) as e:
            call(value, scale=scale)
        assert f"\n  {where[0]}: expected a tensor f32[4], got {got}\n" in str(e.value)
        assert "input 1" not in str(e.value) and "torch.as_tensor" in str(e.value)
        assert isinstance(e.value, TypeError)
        with pytest.raises(torchcap.InputError, match=rf"{re.escape(where[1])}: expected a tensor "
                                                      rf"f32\[4\], got {re.escape(got)}"):
            call(x, scale=value)
    with pytest.raises(torchcap.InputError) as e:
        call(None, scale=2.5)
    assert str(e.value).count("expected a tensor f32[4]") == 2
    torch.testing.assert_close(call(x, scale=scale), f(x, scale=scale), rtol=0, atol=0)


class Boom(Exception):
    pass


def test_exception_inside_f_propagates_unchanged_and_leaves_no_state():
    def f(x):
        x * 2  # an operator recorded before the exception
        raise Boom("from inside")

    with pytest.raises(Boom, match="from inside") as info:
        torchcap.trace(f, (torch.ones(2),))
    assert info.traceback[-1].name == "f"  # the traceback reaches the raise
    # Nothing is left: hooks removed, tracing works, tensors compute as usual.
    from torch.nn.modules import module as module_mod
    assert not module_mod._global_forward_pre_hooks and not module_mod._global_forward_hooks
    assert gc.isenabled()  # paused during the trace (Note [No collections])
    x = torch.ones(2)
    assert torch.equal(x * 2, torch.full((2,), 2.0))
    gm = torchcap.trace(lambda t: t * 3, (x,))
    assert torch.equal(gm(x), x * 3)


def test_nested_trace_is_an_error():
    def f(x):
        return torchcap.trace(lambda t: t + 1, (x,))

    with pytest.raises(torchcap.TraceError, match="traces do not nest"):
        torchcap.trace(f, (torch.ones(2),))


def test_threads_trace_at_once():
    model = torchvision.models.resnet18().eval()
    inputs = [torch.randn(1, 3, 32, 32) for _ in range(4)]
    results = [None] * 4

    def work(i):
        results[i] = torchcap.trace(model, (inputs[i],))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with torch.no_grad():
        for gm, x in zip(results, inputs):
            torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)
            assert any("nn_module_stack" in n.meta for n in gm.graph.nodes)


def test_threads_tracing_at_once_leave_the_collector_on():
    # Note [No collections] in _runtime.py: while any thread traces the cyclic
    # collector is off, and once the last trace is done it is on again. A
    # pause that saved and restored the switch on its own left it on during
    # the second trace below, and now and then off for good.
    assert gc.isenabled()
    first_inside, second_inside, first_done = (threading.Event() for _ in range(3))
    seen, failures = [], []

    def first(t):
        first_inside.set()
        assert second_inside.wait(30)
        return t + 1

    def second(t):
        second_inside.set()
        assert first_done.wait(30)
        seen.append(gc.isenabled())  # the first trace has ended, this one has not
        return t * 2

    def work(program, before=None, after=None):
        try:
            if before is not None:
                assert before.wait(30)
            torchcap.trace(program, (torch.ones(2),))
        except Exception as e:  # noqa: BLE001 -- every failure is reported below
            failures.append(f"{type(e).__name__}: {e}")
        finally:
            if after is not None:
                after.set()

    threads = [threading.Thread(target=work, args=(first, None, first_done)),
               threading.Thread(target=work, args=(second, first_inside))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and seen == [False]
    assert gc.isenabled()

    # Many short traces at once, the threads switching between nearly every
    # bytecode: the collector is on after each round.
    x = torch.randn(3)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(10):
            start = threading.Barrier(4)

            def trace_some(start=start):
                start.wait()
                for _ in range(20):
                    torchcap.trace(lambda a: a * 2 + 1, (x,))

            threads = [threading.Thread(target=trace_some) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert gc.isenabled()
    finally:
        sys.setswitchinterval(switching)
        gc.enable()


@pytest.mark.parametrize("made_by", ["trace", "load"])
def test_first_use_from_several_threads(tmp_path, made_by):
    # Note [First use from several threads]: threads calling a new module at
    # once, and listing its parameters, each see it whole; its graph,
    # attributes and code are made once.
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4), nn.Tanh())).eval()
    x = torch.randn(2, 8)
    expected = m(x)
    torchcap.save(torchcap.trace(m, (x,)), tmp_path / "m.tcg")
    failures = []
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between nearly every bytecode
    try:
        for _ in range(40):
            gm = torchcap.trace(m, (x,)) if made_by == "trace" else torchcap.load(tmp_path / "m.tcg")
            start = threading.Barrier(4)

            def work(i, gm=gm, start=start):
                try:
                    start.wait()
                    if i % 2:
                        assert len(dict(gm.named_parameters())) == 4
                    torch.testing.assert_close(gm(x), expected)
                except Exception as e:  # noqa: BLE001 -- every failure is reported below
                    failures.append(f"{type(e).__name__}: {e}")

            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(switching)
    assert failures == []


# --- Save, then run in C++ ----------------------------------------------------------------------

def test_save_then_load_in_python(tmp_path):
    m = Nested()
    args = ((torch.randn(3, 8), {"bias": torch.randn(8)}), torch.randn(2))
    gm = torchcap.trace(m, args)
    torchcap.save(gm, tmp_path / "m.tcg")
    loaded = torchcap.load(tmp_path / "m.tcg")
    assert_tree_equal(loaded(*args), gm(*args))
    # Where each node came from travels with it.
    model = torchvision.models.resnet18().eval()
    gm = torchcap.trace(model, (torch.randn(1, 3, 32, 32),))
    torchcap.save(gm, tmp_path / "r.tcg")
    loaded = {n.name: n for n in torchcap.load(tmp_path / "r.tcg").graph.nodes}
    for n in gm.graph.nodes:
        for key in ("stack_trace", "nn_module_stack"):
            assert loaded[n.name].meta.get(key) == n.meta.get(key), (n.name, key)


@pytest.mark.parametrize("exported", [False, True])
def test_save_then_run_in_cpp(tmp_path, exported):
    cli = os.environ.get("TORCHCAP_CLI")
    if not cli:
        pytest.skip("TORCHCAP_CLI is not set")
    model = torchvision.models.mobilenet_v3_small().eval()
    x = torch.randn(1, 3, 64, 64)
    gm = (torchcap.export if exported else torchcap.trace)(model, (x,))
    torchcap.save(gm, tmp_path / "m.tcg")
    torch.save(x, tmp_path / "x.pt")
    subprocess.run([cli, "run", tmp_path / "m.tcg", "--input", tmp_path / "x.pt",
                    "-o", tmp_path / "y.pt"], check=True, capture_output=True)
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "y.pt"), model(x), rtol=1e-5, atol=1e-5)


def test_save_make_fx_graph_then_run_in_cpp(tmp_path):
    cli = os.environ.get("TORCHCAP_CLI")
    if not cli:
        pytest.skip("TORCHCAP_CLI is not set")
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        gm = make_fx(model)(x)
    torchcap.save(gm, tmp_path / "m.tcg")
    loaded = torchcap.load(tmp_path / "m.tcg")
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(loaded(x)[0], expected)
    torch.save(x, tmp_path / "x.pt")
    subprocess.run([cli, "run", tmp_path / "m.tcg", "--input", tmp_path / "x.pt",
                    "-o", tmp_path / "y.pt"], check=True, capture_output=True)
    torch.testing.assert_close(torch.load(tmp_path / "y.pt"), expected, rtol=1e-5, atol=1e-5)


def test_code_generated_on_first_use(tmp_path, monkeypatch):
    # forward() is generated when the module is first called or its code
    # read; a module whose code was generated saves as traced, nesting kept.
    m = Nested()
    args = ((torch.randn(3, 8), {"bias": torch.randn(8)}), torch.randn(2))
    generated = []
    python_code = torch.fx.Graph.python_code
    monkeypatch.setattr(torch.fx.Graph, "python_code",
                        lambda g, *a, **k: generated.append(g) or python_code(g, *a, **k))
    gm = torchcap.trace(m, args)
    assert not [g for g in generated if g is gm.graph]
    assert_tree_equal(gm(*args), m(*args))
    assert gm.code == gm.graph.python_code("self").src
    torchcap.save(gm, tmp_path / "m.tcg")
    assert_tree_equal(torchcap.load(tmp_path / "m.tcg")(*args), m(*args))
    # Edited after its code was generated: the edit is saved.
    gm = torchcap.trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    x = torch.randn(2, 4)
    gm(x)
    for n in gm.graph.nodes:
        if n.target == torch.ops.aten.relu.default:
            n.target = torch.ops.aten.sigmoid.default
    gm.recompile()
    torchcap.save(gm, tmp_path / "e.tcg")
    torch.testing.assert_close(torchcap.load(tmp_path / "e.tcg")(x)[0], gm(x))
    assert (gm(x) > 0).all()


@pytest.mark.parametrize("first_use", ["call", "graph", "code", "str", "deepcopy", "pickle", "save"])
def test_graph_made_on_first_use(tmp_path, first_use):
    # A traced module holds no torch.fx graph until something needs one; each
    # thing that does works on a module without one, and saving needs none.
    m = Nested()
    args = ((torch.randn(3, 8), {"bias": torch.randn(8)}), torch.randn(2))
    gm = torchcap.trace(m, args)
    assert "_graph" not in vars(gm)
    if first_use == "call":
        assert_tree_equal(gm(*args), m(*args))
    elif first_use == "graph":
        assert [n.op for n in gm.graph.nodes][-1] == "output"
    elif first_use == "code":
        assert "def forward(" in gm.code
    elif first_use == "str":
        assert "def forward(" in str(gm)
    elif first_use == "deepcopy":
        assert_tree_equal(copy.deepcopy(gm)(*args), m(*args))
    elif first_use == "pickle":
        assert_tree_equal(pickle.loads(pickle.dumps(gm))(*args), m(*args))
    else:
        torchcap.save(gm, tmp_path / "m.tcg")
        assert "_graph" not in vars(gm)
        assert_tree_equal(torchcap.load(tmp_path / "m.tcg")(*args), m(*args))
    made_now = _bridge._fx_graph(gm._torchcap_graph, [])
    assert gm.code == made_now.python_code("self").src
    assert _node_facts(gm.graph)[0] == _node_facts(made_now)[0]
    assert_tree_equal(gm(*args), m(*args))


@pytest.mark.parametrize("first_use", ["call", "attribute", "named_parameters", "state_dict",
                                       "set_module", "set_parameter", "set_buffer",
                                       "register_parameter", "register_buffer", "delete",
                                       "to", "deepcopy", "pickle", "save"])
def test_attributes_attached_on_first_use(tmp_path, first_use):
    # A traced module holds its tensors in its C++ graph until something
    # needs them as attributes; each such use finds them where torch.fx's
    # constructor puts them, and saving or pickling needs none.
    m = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    gm = torchcap.trace(m, (x,))
    assert not {"_parameters", "_buffers", "_modules"} & vars(gm).keys()
    expected = dict(m.named_parameters())
    # The buffers the program read (num_batches_tracked is not read in eval mode).
    traced = [name for name, _, _ in gm._torchcap_graph.attributes()]
    buffers = dict(m.named_buffers())
    if first_use == "call":
        torch.testing.assert_close(gm(x), m(x))
    elif first_use == "attribute":
        assert gm.get_submodule("layer1.0.conv1").weight is m.layer1[0].conv1.weight
    elif first_use == "named_parameters":
        assert {k: v for k, v in gm.named_parameters()} == expected
        assert {k: v for k, v in gm.named_buffers()} == {k: buffers[k] for k in traced
                                                           if k not in expected}
    elif first_use == "state_dict":
        assert list(gm.state_dict().keys()) == traced
    elif first_use == "set_module":
        gm.extra = nn.Linear(2, 2)
        assert gm._modules["extra"] is gm.extra and "layer1" in gm._modules
        expected.update({f"extra.{k}": v for k, v in gm.extra.named_parameters()})
    elif first_use == "set_parameter":
        gm.scale = nn.Parameter(torch.ones(1))
        assert gm._parameters["scale"] is gm.scale and "layer1" in gm._modules
        expected["scale"] = gm.scale
    elif first_use == "register_parameter":
        gm.register_parameter("scale", nn.Parameter(torch.ones(1)))
        assert gm._parameters["scale"] is gm.scale and "layer1" in gm._modules
        expected["scale"] = gm.scale
    elif first_use == "register_buffer":
        gm.register_buffer("step", torch.zeros(1))
        assert gm._buffers["step"] is gm.step and "layer1" in gm._modules
    elif first_use == "set_buffer":
        gm.get_submodule("layer1.0.bn1").running_mean = torch.zeros(64)
        assert gm.state_dict()["layer1.0.bn1.running_mean"].eq(0).all()
    elif first_use == "delete":
        del gm.fc
        assert "fc" not in gm._modules
        expected = {k: v for k, v in expected.items() if not k.startswith("fc.")}
    elif first_use == "to":
        gm.to(torch.float64)
        expected = {k: v.double() for k, v in expected.items()}
    elif first_use == "deepcopy":
        copied = copy.deepcopy(gm)
        assert "_modules" not in vars(gm)
        torch.testing.assert_close(copied(x), m(x))
    elif first_use == "pickle":
        unpickled = pickle.loads(pickle.dumps(gm))
        assert "_modules" not in vars(gm)
        torch.testing.assert_close(unpickled(x), m(x))
    else:
        torchcap.save(gm, tmp_path / "m.tcg")
        assert "_modules" not in vars(gm)
        torch.testing.assert_close(torchcap.load(tmp_path / "m.tcg")(x), m(x))
    params = dict(gm.named_parameters())
    assert params.keys() == expected.keys()
    assert all(torch.equal(params[k], v) for k, v in expected.items())
    if first_use not in ("to", "delete"):
        torch.testing.assert_close(gm(x), m(x))
    # Once attached and with its graph made, the module's class does nothing lazily.
    gm.graph  # noqa: B018
    assert not {"__getattr__", "__setattr__", "register_buffer",
                "register_parameter"} & vars(type(gm)).keys()


def test_pickled_like_a_torch_fx_module(tmp_path):
    # pickle and torch.save carry a traced module as torch.fx pickles its
    # modules (code and tensors), with the C++ graph beside it, so that the
    # copy runs and saves as the original does; the C++ graph travels without
    # its tensors (Note [Pickling a traced module]).
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    gm = torchcap.trace(model, (x,))
    expected = model(x)
    path = tmp_path / "gm.pt"
    torch.save(gm, path)
    copied = torch.load(path)
    assert_tree_equal(copied(x), expected)
    assert path.stat().st_size < 1.2 * sum(t.numel() * t.element_size()
                                            for t in model.state_dict().values())
    torchcap.save(copied, tmp_path / "copied.tcg")
    torchcap.save(gm, tmp_path / "original.tcg")
    assert_tree_equal(torchcap.load(tmp_path / "copied.tcg")(x), expected)
    assert str(torchcap.load(tmp_path / "copied.tcg").graph) == \
        str(torchcap.load(tmp_path / "original.tcg").graph)
    # copy.deepcopy makes it again the same way, with tensors of its own.
    deep = copy.deepcopy(gm)
    assert deep.fc.weight is not gm.fc.weight and torch.equal(deep.fc.weight, gm.fc.weight)
    assert_tree_equal(deep(x), expected)
    torchcap.save(deep, tmp_path / "deep.tcg")
    assert str(torchcap.load(tmp_path / "deep.tcg").graph) == \
        str(torchcap.load(tmp_path / "original.tcg").graph)
    with pytest.raises(torchcap.InputError, match="arguments structured as"):
        copied(x, x)  # its argument structure is checked, as the original's
    # An exported train-mode module's copy updates its buffers, as the program.
    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    before = copy.deepcopy(bn)
    exported = pickle.loads(pickle.dumps(torchcap.export(bn, (x,))))
    torch.testing.assert_close(exported(x), before(x))
    for name, buf in before.named_buffers():
        torch.testing.assert_close(exported.get_buffer(name), buf, msg=name)
    # A loaded module is made as a traced one (Note [One bridge to torch.fx]
    # in _load.py): it pickles the same way, and its copy checks its inputs.
    loaded = torchcap.load(tmp_path / "original.tcg")
    unpickled = pickle.loads(pickle.dumps(loaded))
    assert_tree_equal(unpickled(x), expected)
    assert str(unpickled.graph) == str(loaded.graph)
    with pytest.raises(torchcap.InputError, match="expected"):
        unpickled(torch.zeros(1, 3, 8, 8))
    # torch.fx would make an edited module again from its code, as a module
    # that takes no arguments: refused, saying what to do instead.
    edited = torchcap.trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    relu = next(n for n in edited.graph.nodes if n.target == torch.ops.aten.relu.default)
    relu.target = torch.ops.aten.sigmoid.default
    edited.recompile()
    with pytest.raises(torchcap.Error, match="cannot be pickled.*torchcap.save"):
        pickle.dumps(edited)


def _node_facts(graph):
    """Everything torch.fx keeps of a graph's nodes, by name, comparable."""
    def arg(a):
        if isinstance(a, torch.fx.Node):
            return ("node", a.name)
        if isinstance(a, (list, tuple, dict)):
            items = a.items() if isinstance(a, dict) else enumerate(a)
            return (type(a), [(k, arg(v)) for k, v in items])
        return (type(a), a)
    facts = []
    for n in graph.nodes:
        state = dict(vars(n))
        for key in ("graph", "_prev", "_next", "_input_nodes", "users", "_args", "_kwargs"):
            state.pop(key)
        facts.append((list(vars(n)), state, arg(n._args), arg(n._kwargs), n.graph is graph,
                      n._prev.name, n._next.name, [i.name for i in n._input_nodes],
                      [u.name for u in n.users]))
    ns = graph._graph_namespace
    return (facts, len(graph.nodes), graph._len, dict(ns._used_names), ns._unassociated_names,
            {n.name: name for n, name in ns._obj_to_name.items()})


class OddNames(nn.Module):
    """Values named after builtins and keywords, an operator with list
    arguments and keyword arguments, a shared input."""

    def forward(self, x, input, *, sum=None):
        max = x.max(dim=1)
        y = torch.cat([x, input], 1).sum(1, keepdim=False)
        return y, max.values, {"s": sum * 2, "t": torch.ones(2, dtype=torch.int64).float()}


@pytest.mark.parametrize("exported", [False, True])
def test_nodes_made_directly_equal_create_nodes(exported):
    # Note [Creating torch.fx nodes directly]: the nodes build_fx makes equal
    # those torch.fx's create_node makes, attribute by attribute.
    cases = [(torchvision.models.resnet18().eval(), (torch.randn(1, 3, 32, 32),), {}),
             (Nested(), ((torch.randn(3, 8), {"bias": torch.randn(8)}), torch.randn(2)),
              {"mask": torch.ones(8)}),
             (OddNames(), (torch.randn(2, 3), torch.randn(2, 3)), {"sum": torch.randn(2)})]
    for m, args, kwargs in cases:
        gm = (torchcap.export if exported else torchcap.trace)(m, args, kwargs)
        keywords = list(kwargs)
        direct = _bridge._fx_graph(gm._torchcap_graph, keywords)
        made = _bridge._fx_graph(gm._torchcap_graph, keywords, direct=False)
        assert _node_facts(direct) == _node_facts(made)
        assert direct.python_code("self").src == made.python_code("self").src
        direct.lint()


def test_save_refuses_what_it_cannot_store(tmp_path):
    with pytest.raises(torchcap.Error, match="call_module node"):
        torchcap.save(torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2))), tmp_path / "x.tcg")
    with pytest.raises(torchcap.Error, match="not an operator"):
        torchcap.save(torch.fx.symbolic_trace(lambda x: torch.relu(x)), tmp_path / "x.tcg")
    assert not (tmp_path / "x.tcg").exists()


def test_loader_works_without_the_compiled_part(tmp_path):
    gm = torchcap.trace(nn.Linear(2, 2), (torch.ones(1, 2),))
    torchcap.save(gm, tmp_path / "l.tcg")
    code = ("import sys; sys.modules['torchcap._C'] = None; import torchcap; "
            f"print(torchcap.load({str(tmp_path / 'l.tcg')!r})(__import__('torch').ones(1, 2)).shape);"
            "torchcap.trace(lambda x: x, (1,))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "torch.Size([1, 2])" in r.stdout
    assert "ImportError" in r.stderr and "torchcap._C" in r.stderr


def test_export_with_keyword_arguments():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x, *, scale):
            return self.bn(x) * scale

    m = M().train()
    before = copy.deepcopy(m)
    x, s = torch.randn(8, 4), torch.tensor(2.0)
    ep = torchcap.export(m, (x,), {"scale": s})
    torch.testing.assert_close(ep(x, scale=s), before(x, scale=s))
    torch.testing.assert_close(ep.bn.running_mean, before.bn.running_mean)


def test_save_an_edited_trace(tmp_path):
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    gm = torchcap.trace(m, (x,))
    for n in gm.graph.nodes:
        if n.target == torch.ops.aten.relu.default:
            n.target = torch.ops.aten.sigmoid.default
    gm.recompile()
    torchcap.save(gm, tmp_path / "e.tcg")
    loaded = torchcap.load(tmp_path / "e.tcg")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x)[0], torch.sigmoid(m[0](x)))


# --- The package ---------------------------------------------------------------------------------

def test_the_version_is_the_commands_and_the_format_docs_name_it():
    assert re.fullmatch(r"\d+\.\d+\.\d+", torchcap.__version__)
    shown = subprocess.run([os.environ["TORCHCAP_CLI"], "--version"], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert shown == f"torchcap {torchcap.__version__}"
    root = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    with open(os.path.join(root, "docs", "FORMAT.md")) as f:
        assert f"\n| {torchcap.__version__} |" in f.read()


# --- Python numbers in tensor arithmetic (issue 58) -------------------------------

class PythonNumbers(nn.Module):
    """Each result's dtype depends on a Python number being a wrapped number
    (Note [Python numbers as tensors] in src/graph/ivalue_conversion.cpp): as
    a float64 or int64 tensor, type promotion would give another dtype."""

    def forward(self, i, f, b, h):
        return (i + 0.5, i * 2.5 - 1, i / 2, f + 2, b + 1.5, b * 3, (1 - b.int()) * 0.25,
                h + 1.0, h * 3)


def python_number_inputs():
    return (torch.arange(6).reshape(2, 3), torch.randn(2, 3), torch.tensor([[True, False, True]]),
            torch.randn(2, 3).half())


def test_python_numbers_keep_eager_dtypes_through_every_capture_and_file(tmp_path):
    """An int tensor plus 0.5 is float32 in eager, as is every other result of
    PythonNumbers; so it is after each capture, after save and load by both
    loaders, and when the command runs the file. (Lifted as tensor constants,
    the numbers lost what made them numbers in the file: float64.)"""
    model, args = PythonNumbers(), python_number_inputs()
    expected = model(*args)
    assert [t.dtype for t in expected] == [torch.float32] * 5 + [
        torch.int64, torch.float32, torch.float16, torch.float16]
    captures = {
        "trace": torchcap.trace(model, args),
        "dispatch_trace": torchcap.dispatch_trace(model, args),
        "export": torchcap.export(model, args),
    }
    captures["optimized"] = torchcap.optimize_for_inference(captures["trace"])
    for name, gm in captures.items():
        # The numbers are arguments, not float64 or int64 constants.
        constants = [n for n, t in gm.named_buffers() if t.dim() == 0]
        assert not constants, (name, constants)
        path = tmp_path / f"{name}.tcg"
        torchcap.save(gm, path)
        from torchcap._load import load_in_python
        for how, module in (("captured", gm), ("loaded", torchcap.load(path)),
                            ("read in Python", load_in_python(path))):
            got = module(*args)
            for k, (g, e) in enumerate(zip(got, expected)):
                assert g.dtype == e.dtype, (name, how, k, g.dtype, e.dtype)
                torch.testing.assert_close(g, e, rtol=0, atol=0, msg=f"{name} {how} {k}")
        cli = os.environ.get("TORCHCAP_CLI")
        if cli:
            out = subprocess.run([cli, "run", str(path), "--json"], capture_output=True, text=True,
                                 check=True).stdout
            dtypes = [o["dtype"] for o in __import__("json").loads(out)["outputs"]]
            assert dtypes == [str(e.dtype).replace("torch.", "") for e in expected], (name, dtypes)
