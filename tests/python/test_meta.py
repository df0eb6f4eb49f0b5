"""torchcap.trace / export with meta=True: torchvision eager models give the
graph a real trace gives, node for node, while nothing is computed; the errors
meta mode raises."""

import pytest
import torch
import torch.nn as nn
import torchvision

import torchcap

torch.manual_seed(0)


def capture(model, args, meta, export=False, **options):
    """Both modes through one call site, so that stack traces match."""
    f = torchcap.export if export else torchcap.trace
    return f(model, args, meta=meta, **options)


def assert_same_graph(real, meta):
    assert real.code == meta.code
    real_nodes, meta_nodes = list(real.graph.nodes), list(meta.graph.nodes)
    assert len(real_nodes) == len(meta_nodes)
    for a, b in zip(real_nodes, meta_nodes):
        assert (a.op, a.name, a.target) == (b.op, b.name, b.target)
        assert str(a.args) == str(b.args) and str(a.kwargs) == str(b.kwargs)
        for key in ("val", "tensor_meta", "stack_trace", "nn_module_stack"):
            assert a.meta.get(key) == b.meta.get(key), (a.name, key)
    real_state = dict(real.state_dict(keep_vars=True))
    meta_state = dict(meta.state_dict(keep_vars=True))
    assert list(real_state) == list(meta_state)
    for name, t in meta_state.items():
        assert not t.is_meta, name
        assert t is real_state[name] or torch.equal(t, real_state[name]), name


def small_vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                num_heads=2, hidden_dim=32, mlp_dim=64)


MODELS = {
    "resnet18": (torchvision.models.resnet18, (1, 3, 64, 64)),
    "mobilenet_v3_small": (torchvision.models.mobilenet_v3_small, (1, 3, 64, 64)),
    "vit": (small_vit, (1, 3, 32, 32)),
    "swin_t": (torchvision.models.swin_t, (1, 3, 64, 64)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_torchvision_graph_equals_the_real_trace(name):
    build, shape = MODELS[name]
    model = build().eval()
    x = torch.randn(shape)
    assert_same_graph(capture(model, (x,), meta=False), capture(model, (x,), meta=True))


@pytest.mark.parametrize("name", ["resnet18", "vit"])
def test_shapes_only_inputs(name):
    build, shape = MODELS[name]
    model = build().eval()
    real = capture(model, (torch.randn(shape),), meta=False)
    meta = capture(model, (torch.empty(shape, device="meta"),), meta=True)
    assert_same_graph(real, meta)


def test_export_in_train_mode_equals_the_real_export():
    # Two copies: a real trace updates BatchNorm's running statistics.
    torch.manual_seed(0)
    real_model = torchvision.models.resnet18().train()
    meta_model = torchvision.models.resnet18()
    meta_model.load_state_dict(real_model.state_dict())
    meta_model.train()
    before = {k: v.clone() for k, v in meta_model.state_dict().items()}
    x = torch.randn(2, 3, 64, 64)
    real = capture(real_model, (x,), meta=False, export=True)
    meta = capture(meta_model, (x,), meta=True, export=True)
    assert real.code == meta.code
    for a, b in zip(real.graph.nodes, meta.graph.nodes):
        assert (a.name, a.target, a.meta.get("val")) == (b.name, b.target, b.meta.get("val"))
    # Nothing ran: the statistics are untouched.
    for k, v in meta_model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_meta_trace_saved_and_loaded_runs_like_eager(tmp_path):
    model = torchvision.models.resnet18().eval()
    gm = torchcap.trace(model, (torch.empty(1, 3, 64, 64, device="meta"),), meta=True)
    torchcap.save(gm, tmp_path / "resnet18.tcg")
    loaded = torchcap.load(tmp_path / "resnet18.tcg")
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))


def test_the_program_sees_cpu_tensors():
    seen = []

    def f(x):
        seen.append((x.device.type, x.is_meta))
        return x * 2

    torchcap.trace(f, (torch.empty(3, device="meta"),), meta=True)
    assert seen == [("cpu", False)]


# --- Errors ---------------------------------------------------------------------

def test_item_is_an_error():
    with pytest.raises(torchcap.TraceError, match="in meta mode tensors have no values"):
        torchcap.trace(lambda x: x * x.sum().item(), (torch.randn(3),), meta=True,
                       allow_data_dependent_values=True)


def test_nonzero_is_an_error():
    with pytest.raises(torchcap.TraceError, match="aten::nonzero.*depends on tensor values"):
        torchcap.trace(lambda x: torch.nonzero(x), (torch.randn(3),), meta=True)


def test_boolean_mask_indexing_is_an_error():
    with pytest.raises(torchcap.TraceError, match="depends on tensor values"):
        torchcap.trace(lambda x: x[x > 0], (torch.randn(3),), meta=True)


def test_operator_without_meta_kernel_is_named():
    with pytest.raises(torchcap.TraceError, match="aten::histc has no meta kernel.*meta=False"):
        torchcap.trace(lambda x: torch.histc(x, 10), (torch.randn(3),), meta=True)
