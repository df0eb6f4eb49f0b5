"""torchcap.to_onnx (docs/python.md, "Exporting to ONNX"): traced, exported
and loaded modules written as ONNX, each file checked by onnx.checker and
run, by onnxruntime where it is installed and always by a NumPy reference
evaluator of the ONNX operators (onnx_reference.py), against eager; the
lowerings the models need (native_batch_norm, _unsafe_view, the fused
transformer kernels, writes through views, dynamic sizes); and the
refusals, each a torchcap.Error naming the node and its operator."""

import io

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree
import torchvision

import torchcap
from torchcap import _onnx

import onnx_reference
from gpt_decoder import Decoder
from zoo import small_vit

try:
    import onnxruntime
except ImportError:  # Debian has none: the reference evaluator runs anyway
    onnxruntime = None

# float32 rounding of another order of operations (the exporter folds batch
# norms into convolutions; NumPy sums in its own order): relative to the
# largest eager output, at least 1.
TOLERANCE = 1e-4


def randomized(model):
    """`model` in eval mode with weights and batch-norm statistics drawn from
    a fixed generator, so that outputs are of order 1 (torchvision's heads
    start at zero or near it) and batch norms do more than nothing."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.in_features ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            elif isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                    m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model.eval()


def image(batch=1, size=64):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch * size))


def flat(value):
    """The tensors of a nested output, in order (the ONNX file's outputs)."""
    return [t for t in pytree.tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def to_onnx(gm, args, **options):
    """The ONNX model to_onnx writes, checked by onnx.checker (with shape inference)."""
    f = io.BytesIO()
    torchcap.to_onnx(gm, args, f, **options)
    model = onnx.load_from_string(f.getvalue())
    onnx.checker.check_model(model, full_check=True)
    return model


def assert_runs_as(model, inputs, expected):
    """The ONNX model's outputs for `inputs` equal `expected` (eager's)
    within TOLERANCE, by the reference evaluator and by onnxruntime if
    installed."""
    expected = [e.detach().numpy() for e in flat(expected)]
    arrays = [x.numpy() for x in inputs]
    runs = {"reference": onnx_reference.run(model, arrays)}
    if onnxruntime is not None:
        session = onnxruntime.InferenceSession(model.SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        runs["onnxruntime"] = session.run(None, dict(zip(names, arrays)))
    for how, actual in runs.items():
        assert len(actual) == len(expected), how
        for a, e in zip(actual, expected):
            assert a.shape == e.shape and a.dtype == e.dtype, (how, a.shape, e.shape)
            bound = TOLERANCE * max(1.0, float(np.abs(e).max()))
            assert np.abs(a.astype(np.float64) - e).max() <= bound, (how, np.abs(a - e).max())


def placeholders(gm):
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def operators(gm):
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def eager(model, *inputs, **kwargs):
    with torch.no_grad():
        return model(*inputs, **kwargs)


def test_resnet18_loaded_from_a_file(tmp_path):
    model = randomized(torchvision.models.resnet18())
    x = image()
    torchcap.save(torchcap.trace(model, (x,)), tmp_path / "resnet18.tcg")
    gm = torchcap.load(tmp_path / "resnet18.tcg")
    code = gm.code
    assert "aten.native_batch_norm.default" in operators(gm)
    torchcap.to_onnx(gm, (x,), tmp_path / "resnet18.onnx")
    model_proto = onnx.load(str(tmp_path / "resnet18.onnx"))
    onnx.checker.check_model(model_proto, full_check=True)
    assert [i.name for i in model_proto.graph.input] == placeholders(gm)
    assert [o.name for o in model_proto.graph.output] == ["output_0"]
    assert_runs_as(model_proto, [x], eager(model, x))
    assert gm.code == code  # the module was only read
    torch.testing.assert_close(eager(gm, x), eager(model, x))


@pytest.mark.parametrize("capture", ["trace", "export"])
def test_mobilenet_v2(capture):
    model = randomized(torchvision.models.mobilenet_v2())
    x = image(batch=2)
    gm = getattr(torchcap, capture)(model, (x,))
    assert_runs_as(to_onnx(gm, (x,)), [x], eager(model, x))


def test_unsafe_view_of_a_decoder():
    # Its 3-D by 2-D matmuls end in aten::_unsafe_view; its softmax is _softmax.
    torch.manual_seed(0)
    model = randomized(Decoder(layers=2, d=32, heads=4, vocab=50))
    idx = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    gm = torchcap.trace(model, (idx,))
    assert {"aten._unsafe_view.default", "aten._softmax.default"} <= operators(gm)
    lowered, _ = _onnx.lower(gm, (idx,))
    assert not {"aten._unsafe_view.default", "aten._softmax.default"} & operators(lowered)
    assert_runs_as(to_onnx(gm, (idx,)), [idx], eager(model, idx))


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_fused_transformer_encoder_layer(norm_first, activation):
    torch.manual_seed(0)
    layer = randomized(nn.TransformerEncoderLayer(32, 4, 64, activation=activation,
                                                  norm_first=norm_first, batch_first=True))
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    gm = torchcap.trace(layer, (x,))
    assert "aten._transformer_encoder_layer_fwd.default" in operators(gm)  # eval mode's kernel
    assert_runs_as(to_onnx(gm, (x,)), [x], eager(layer, x))


def test_vision_transformer_with_a_dynamic_batch():
    # Fused attention (aten::_native_multi_head_attention); the batch, a
    # dynamic size, flows into views and an expand (Note [Dynamic sizes]).
    torch.manual_seed(0)
    model = randomized(small_vit())
    x = image(batch=2, size=32)
    gm = torchcap.export(model, (x,), dynamic_shapes=({0: torchcap.Dim("batch", max=16)},))
    model_proto = to_onnx(gm, (x,))
    batch = model_proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param == f"{placeholders(gm)[0]}_dim0"
    other = image(batch=3, size=32)
    assert_runs_as(model_proto, [other], eager(model, other))


def test_keyword_arguments_dict_results_and_names():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.bn = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 10)

        def forward(self, x, *, scale=None):
            y = self.bn(self.conv(x)).relu().mean(dim=(2, 3))
            return {"logits": self.fc(y * scale), "features": y}

    torch.manual_seed(0)
    model = randomized(Net())
    x, scale = image(batch=2, size=16), torch.tensor(0.5)
    gm = torchcap.trace(model, (x,), {"scale": scale})
    model_proto = to_onnx(gm, (x,), kwargs={"scale": scale}, input_names=["x", "scale"],
                          output_names=["logits", "features"])
    assert [o.name for o in model_proto.graph.output] == ["logits", "features"]
    assert_runs_as(model_proto, [x, scale], eager(model, x, scale=scale))


def writes_through_views(x):
    y = torch.empty(2, 3)
    y.copy_(x * 2)
    v = x.clone()
    v[:, 1] = 7.0  # a write into a view of v, which is returned
    u = x.clone()
    u[0] = x[1]
    return y.relu_(), v, u


def test_writes_through_views_are_made_functional():
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    gm = torchcap.trace(writes_through_views, (x,))
    assert {"aten.copy_.default", "aten.fill_.Tensor"} <= operators(gm)
    lowered, _ = _onnx.lower(gm, (x,))
    assert not any(str(t).endswith("_.default") or "_.Tensor" in str(t) for t in operators(lowered))
    assert_runs_as(to_onnx(gm, (x,)), [x], writes_through_views(x))


def writes_into_slices(x):
    v = x.clone()
    v[1:] = 0.5 * v[1:]  # along the batch
    w = x.clone()
    w[:, -1] = 3.0
    w[-2, 1:3] = 2.0
    return v, w


def test_writes_into_slices_of_a_dynamic_graph():
    # Exported: slice_scatter and select_scatter, whose slices hold no size.
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    dynamic = ({0: torchcap.Dim("batch", max=16)},)
    gm = torchcap.export(writes_into_slices, (x,), dynamic_shapes=dynamic)
    assert {"aten.slice_scatter.default", "aten.select_scatter.default"} <= operators(gm)
    other = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))
    assert_runs_as(to_onnx(gm, (x,)), [other], writes_into_slices(other))
    # Traced, it writes through views, which only a re-trace with the sizes
    # of the example would make functional.
    traced = torchcap.trace(writes_into_slices, (x,), dynamic_shapes=dynamic)
    with pytest.raises(torchcap.Error, match=r"(?s)writes into a view.*in a dynamic graph; make the "
                                             r"graph with torchcap.export.*v\[1:\] = 0.5"):
        torchcap.to_onnx(traced, (x,), io.BytesIO())


# --- Refusals -----------------------------------------------------------------

def grid_sampling(x, grid):
    return torch.nn.functional.grid_sample(x, grid, align_corners=False)


def test_an_operator_without_a_rule_is_named_with_its_node_and_line():
    x, grid = torch.randn(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1
    gm = torchcap.trace(grid_sampling, (x, grid))
    with pytest.raises(torchcap.Error) as e:
        torchcap.to_onnx(gm, (x, grid), io.BytesIO())
    message = str(e.value)
    assert "torch.onnx has no rule at opset 14 for aten::grid_sampler" in message
    assert "node grid_sampler_2d (aten::grid_sampler_2d.default, lowered to aten::grid_sampler" in message
    assert "opset_version=16" in message
    assert "test_onnx.py" in message and "grid_sample(x, grid" in message  # the user's line
    assert "Traceback" not in message


def max_pooling(x):
    return torch.nn.functional.adaptive_max_pool2d(x, 3)


def test_a_rules_refusal_names_the_node_without_the_exporters_traceback():
    # The exporter has a rule, which takes only output sizes that divide the input's.
    x = torch.randn(1, 2, 8, 8)
    gm = torchcap.trace(max_pooling, (x,))
    with pytest.raises(torchcap.Error) as e:
        torchcap.to_onnx(gm, (x,), io.BytesIO())
    message = str(e.value)
    assert message.startswith(
        "to_onnx: torch.onnx.export failed on the lowered graph (the first of its nodes: node "
        "adaptive_max_pool2d (aten::adaptive_max_pool2d.default)): SymbolicValueError: Unsupported: "
        "ONNX export of operator adaptive_max_pool2d, output size that are not factor of input size")
    assert "adaptive_max_pool2d(x, 3)" in message and "Traceback" not in message
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_a_batch_norm_in_training_mode_is_refused():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    x = image(batch=2, size=8)
    with pytest.raises(torchcap.Error, match=r"(?s)num_batches_tracked.*model\.eval\(\)"):
        torchcap.to_onnx(torchcap.trace(model, (x,)), (x,), io.BytesIO())
    with pytest.raises(torchcap.Error, match=r"writes buffer .*Export the model in eval mode"):
        torchcap.to_onnx(torchcap.export(model, (x,)), (x,), io.BytesIO())


def test_a_write_to_an_input_is_refused():
    def bump(x):
        x.add_(1)
        return x * 2

    x = torch.zeros(3)
    gm = torchcap.trace(bump, (x.clone(),), allow_input_mutation=True)
    with pytest.raises(torchcap.Error, match=rf"node add_ \(aten::add_\.Tensor\) writes the graph's input "
                                             rf"\({placeholders(gm)[0]}\); an ONNX model cannot update"):
        torchcap.to_onnx(gm, (x,), io.BytesIO())


def test_a_dynamic_axis_of_a_static_graph_is_refused():
    model = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    gm = torchcap.trace(model, (x,))
    (name,) = placeholders(gm)
    with pytest.raises(torchcap.Error, match=f"dimension 0 of input {name} dynamic, but the graph holds"):
        torchcap.to_onnx(gm, (x,), io.BytesIO(), dynamic_axes={name: {0: "batch"}})


def test_the_reference_evaluator_refuses_what_it_does_not_know():
    node = onnx.helper.make_node("Celu", ["x"], ["y"])
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 14)])
    with pytest.raises(onnx_reference.UnsupportedOperator, match="Celu"):
        onnx_reference.run(model, [np.zeros(2, np.float32)])
