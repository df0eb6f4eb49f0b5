"""Calls of traced, exported and loaded modules run from their C++ graph
(Note [Calls run from the C++ graph] in src/python/runner.cpp): the same
results as eager and as the torch.fx code, the torch.fx code wherever the
interpreter would differ, and everything a GraphModule does still works."""

import copy
import inspect
import pickle
import warnings

import pytest
import torch
import torch.nn as nn
import torchvision

import torchcap
from thread_helpers import run_in_threads

torch.manual_seed(0)


def runs_cpp(gm):
    return getattr(type(gm).__dict__.get("forward"), "_torchcap_runs_cpp", False)


def fx_made(gm):
    return "_graph" in gm.__dict__


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, pair, *, scale):
        a, b = pair
        return {"out": self.fc(x) * scale + a.sum(), "rest": (b.relu(), None)}


def scaled_inputs(batch=2):
    return ((torch.randn(batch, 4), (torch.randn(3), torch.randn(2, 2))), {"scale": torch.tensor(1.5)})


def same_structure(a, b):
    return torch.utils._pytree.tree_flatten(a)[1] == torch.utils._pytree.tree_flatten(b)[1]


@pytest.mark.parametrize("family", ["resnet18", "mobilenet_v3_small"])
def test_the_first_call_runs_the_cpp_graph_and_gives_eager_results(family):
    model = getattr(torchvision.models, family)().eval()
    x = torch.randn(2, 3, 32, 32)
    gm = torchcap.trace(model, (x,))
    with torch.no_grad():
        got = gm(x)
        want = model(x)
        assert runs_cpp(gm) and not fx_made(gm)
        assert torch.equal(got, want)
        # And as the torch.fx code computes it.
        gm.recompile()
        assert not runs_cpp(gm)
        assert torch.equal(gm(x), want)


def test_nested_arguments_and_keywords_and_results_keep_their_structure():
    model = Scaled()
    args, kwargs = scaled_inputs()
    gm = torchcap.trace(model, args, kwargs)
    with torch.no_grad():
        got = gm(*args, **kwargs)
        assert runs_cpp(gm)
        want = model(*args, **kwargs)
    assert same_structure(got, want)
    assert torch.equal(got["out"], want["out"]) and torch.equal(got["rest"][0], want["rest"][0])
    assert got["rest"][1] is None
    # The signature is the one torch.fx's code has.
    made = inspect.signature(type(gm).forward)
    gm.recompile()
    assert made == inspect.signature(type(gm).forward)


def test_positional_parameters_given_by_name_on_the_first_call():
    model = Scaled()
    (x, pair), kwargs = scaled_inputs()
    other = torchcap.trace(model, (x, pair), kwargs)
    other.recompile()
    names = list(inspect.signature(type(other).forward).parameters)
    assert names == ["self", "x", "pair", "scale"]  # forward's own
    gm = torchcap.trace(model, (x, pair), kwargs)
    with torch.no_grad():
        got = gm(x=x, pair=pair, scale=kwargs["scale"])  # the first call
        assert runs_cpp(gm)
        assert torch.equal(got["out"], model(x, pair, **kwargs)["out"])


def test_calls_under_autograd_record_eager_gradients():
    model = torchvision.models.resnet18().eval()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 32, 32)
    gm = torchcap.trace(model, (x,))  # its parameters are the model's
    out = gm(x)  # grad mode on, parameters require grad
    assert out.grad_fn is not None and runs_cpp(gm) and not fx_made(gm)
    out.square().sum().backward()
    reference(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_an_input_that_requires_grad_gets_its_gradient():
    gm = torchcap.trace(lambda t: t.sin() * 2, (torch.randn(3),))
    x = torch.randn(3, requires_grad=True)
    y = gm(x)
    assert y.grad_fn is not None and runs_cpp(gm)
    y.sum().backward()
    assert torch.allclose(x.grad, 2 * x.detach().cos())
    with torch.no_grad():  # and the inference run next to it
        assert gm(x).grad_fn is None


def test_dispatch_modes_and_subclasses_see_the_operators():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    gm = torchcap.trace(lambda t: (t + 1).relu(), (torch.randn(3),))
    x = torch.randn(3)
    with torch.no_grad(), Recorder() as recorder:
        gm(x)
    assert recorder.ops == ["aten.add.Tensor", "aten.relu.default"]

    class Marked(torch.Tensor):
        pass

    gm = torchcap.trace(lambda t: t * 3, (torch.randn(3),))
    with torch.no_grad():
        out = gm(torch.randn(3).as_subclass(Marked))
    assert not runs_cpp(gm)  # declined: the subclass runs through torch.fx's code
    assert isinstance(out, torch.Tensor)


def test_replaced_attributes_are_what_runs():
    model = Scaled()
    args, kwargs = scaled_inputs()
    gm = torchcap.trace(model, args, kwargs)
    with torch.no_grad():
        gm(*args, **kwargs)
        assert runs_cpp(gm)
        gm.fc.bias = nn.Parameter(torch.full((3,), 100.0))
        got = gm(*args, **kwargs)["out"]
    x, (a, _) = args
    want = (x @ model.fc.weight.T + 100.0) * kwargs["scale"] + a.sum()
    assert torch.allclose(got, want.detach())


def test_an_edit_through_graph_and_recompile_changes_what_runs():
    gm = torchcap.trace(lambda t: (t * 2).relu(), (torch.randn(4),))
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    with torch.no_grad():
        assert torch.equal(gm(x), torch.tensor([0.0, 4.0, 0.0, 8.0]))
        assert runs_cpp(gm)
        for node in gm.graph.nodes:
            if node.target == torch.ops.aten.relu.default:
                node.target = torch.ops.aten.neg.default
        gm.recompile()
        assert not runs_cpp(gm)
        assert torch.equal(gm(x), torch.tensor([2.0, -4.0, 6.0, -8.0]))
    # A graph made (and so perhaps edited) is what later calls run, as a
    # module's graph was before calls ran the C++ graph.
    gm = torchcap.trace(lambda t: (t * 2).relu(), (torch.randn(4),))
    with torch.no_grad():
        gm(x)
        for node in gm.graph.nodes:
            if node.target == torch.ops.aten.relu.default:
                node.target = torch.ops.aten.neg.default
        assert torch.equal(gm(x), torch.tensor([2.0, -4.0, 6.0, -8.0]))
    assert "neg" in gm.code


def test_code_is_shown_without_compiling_and_is_what_recompile_makes():
    gm = torchcap.trace(torchvision.models.resnet18().eval(), (torch.randn(1, 3, 32, 32),))
    code = gm.code
    assert runs_cpp(gm)
    gm.recompile()
    assert gm.code == code


def test_an_exported_module_writes_its_buffers_back():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    x = torch.randn(2, 3, 8, 8)
    # The exported graph's buffers hold their values from before the trace.
    reference = copy.deepcopy(model)
    gm = torchcap.export(model, (x,))
    fx = torchcap.export(copy.deepcopy(reference), (x,))
    fx.recompile()
    with torch.no_grad():
        for _ in range(2):
            got, by_fx, want = gm(x), fx(x), reference(x)
            assert runs_cpp(gm) and not runs_cpp(fx)
            assert torch.allclose(got, want, atol=1e-6) and torch.equal(got, by_fx)
    for name, buffer in reference.named_buffers():
        assert torch.allclose(gm.get_buffer(name), buffer), name
        assert torch.equal(gm.get_buffer(name), fx.get_buffer(name)), name


def test_a_loaded_module_runs_the_cpp_graph(tmp_path):
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    path = tmp_path / "r.tcg"
    torchcap.save(torchcap.trace(model, (x,)), str(path))
    gm = torchcap.load(str(path))
    with torch.no_grad():
        got = gm(x)
        assert runs_cpp(gm)
        assert torch.equal(got, model(x))
    with pytest.raises(torchcap.InputError):
        with torch.no_grad():
            gm(torch.randn(1, 3, 16, 16))


def test_modules_still_pickle_copy_and_train_toggle():
    model = Scaled()
    args, kwargs = scaled_inputs()
    gm = torchcap.trace(model, args, kwargs)
    assert gm.eval() is gm and not gm.training
    with torch.no_grad():
        first = gm(*args, **kwargs)["out"]
        assert "_torchcap_unattached" in gm.__dict__  # eval() attached nothing
        again = pickle.loads(pickle.dumps(gm))
        copied = copy.deepcopy(gm)
        assert torch.equal(again(*args, **kwargs)["out"], first)
        assert torch.equal(copied(*args, **kwargs)["out"], first)
    assert [n for n, _ in gm.named_parameters()] == ["fc.weight", "fc.bias"]
    assert not gm.training and gm.train() is gm and gm.training


def test_first_calls_from_several_threads_agree():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
    gm = torchcap.trace(model, (x,))
    wrong = []

    def call():
        with torch.no_grad():
            if not torch.equal(gm(x), want):
                wrong.append(1)

    assert run_in_threads(call, threads=4, calls=5) == []
    assert wrong == [] and runs_cpp(gm)


# --- Note [Code of aten graphs] in _codegen.py -------------------------------------

def _programs():
    def kwargs_and_constants(x):
        a = torch.sum(x, dim=1, keepdim=True, dtype=torch.float64)
        b = torch.zeros(3, device="cpu", dtype=torch.float16) + 0.1
        values, indices = torch.max(x, dim=1)
        c = torch.nn.functional.interpolate(x[None], scale_factor=1.5, mode="linear")
        return a, b, values * indices, c, x.to(torch.float64).clamp(min=-float("inf"), max=0.25)

    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    return [
        ("resnet18", lambda: torchcap.trace(torchvision.models.resnet18().eval(),
                                            (torch.randn(1, 3, 32, 32),))),
        ("mobilenet_v3_small", lambda: torchcap.trace(torchvision.models.mobilenet_v3_small().eval(),
                                                      (torch.randn(2, 3, 32, 32),))),
        ("keywords", lambda: torchcap.trace(Scaled(), *scaled_inputs())),
        ("constants", lambda: torchcap.trace(kwargs_and_constants, (torch.randn(3, 4),))),
        ("exported_batch_norm", lambda: torchcap.export(bn, (torch.randn(2, 3, 8, 8),))),
        ("input_writes", lambda: torchcap.trace(lambda t: t.mul_(2).sum(), (torch.randn(3),),
                                                allow_input_mutation=True)),
        ("nothing_computed", lambda: torchcap.trace(lambda t: t, (torch.randn(3),))),
    ]


@pytest.mark.parametrize("name,make", _programs(), ids=[n for n, _ in _programs()])
def test_the_code_of_aten_graphs_is_torch_fx_s(name, make, monkeypatch):
    from torchcap import _codegen
    gm = make()
    fast = gm.graph.python_code(root_module="self")
    monkeypatch.setattr(_codegen, "_aten_python_code", lambda *args: None)
    slow = gm.graph.python_code(root_module="self")
    assert fast.src == slow.src
    assert fast.globals.keys() == slow.globals.keys()
    assert all(fast.globals[k] is slow.globals[k] for k in slow.globals)


def test_a_graph_calling_other_functions_gets_torch_fx_s_code():
    gm = torchcap.trace(lambda t: t.relu(), (torch.randn(3),))
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.target = torch.neg  # not an aten operator
    gm.recompile()
    assert "torch.neg(" in gm.code
    assert torch.equal(gm(torch.ones(3)), -torch.ones(3))


def test_a_training_step_runs_the_cpp_graph_as_its_code_would():
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
    twin = copy.deepcopy(model)
    x, y = torch.randn(4, 3, 6, 6), torch.randint(0, 5, (4,))

    def step_of(m):
        return torchcap.export_training(m, F.cross_entropy, (x,), (y,),
                                        optimizer=torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))

    by_cpp, by_fx = step_of(model), step_of(twin)
    by_fx.recompile()
    for _ in range(3):
        got, want = by_cpp(x, y), by_fx(x, y)
        assert runs_cpp(by_cpp) and not runs_cpp(by_fx)
        assert torch.equal(got["loss"], want["loss"])
    for (name, a), b in zip(by_cpp.state_dict().items(), by_fx.state_dict().values()):
        assert torch.equal(a, b), name


def test_every_kind_of_module_is_a_graph_module_torch_fx_tools_run(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    x = torch.randn(3, 4)
    traced = torchcap.trace(model, (x,))
    torchcap.save(traced, str(tmp_path / "m.tcg"))
    modules = {"traced": traced, "exported": torchcap.export(model, (x,)),
               "loaded": torchcap.load(str(tmp_path / "m.tcg"))}
    with torch.no_grad():
        want = model(x)
        for kind, gm in modules.items():
            assert isinstance(gm, torch.fx.GraphModule), kind
            assert torch.equal(gm(x), want), kind
            assert runs_cpp(gm), kind
            # torch.fx's own interpreter, over the graph made on request.
            assert torch.equal(torch.fx.Interpreter(gm).run(x), want), kind
            assert "torch.ops.aten.addmm.default" in gm.code, kind


def test_autocast_and_torchscript_s_tracer_see_the_operators():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    x = torch.randn(2, 4)
    gm = torchcap.trace(model, (x,))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = gm(x), model(x)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)
    gm = torchcap.trace(model, (x,))
    with torch.no_grad(), warnings.catch_warnings():
        # torchcap's own input check warns TorchScript's tracer of nothing.
        warnings.simplefilter("error", torch.jit.TracerWarning)
        scripted = torch.jit.trace(gm, (x,))
    kinds = {n.kind() for n in scripted.graph.nodes()}
    assert "aten::addmm" in kinds and "aten::relu" in kinds, kinds
    with torch.no_grad():
        assert torch.equal(scripted(x), model(x))


def test_weights_whose_data_was_replaced_are_what_runs():
    # `p.data = t` keeps the parameter and replaces its memory (module.to()
    # does it too): the interpreter's plan is made again, never run stale.
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    x = torch.randn(2, 4)
    gm = torchcap.trace(model, (x,))
    with torch.no_grad():
        gm(x)
        model[0].weight.data = torch.randn(3, 4)
        assert torch.equal(gm(x), model(x))
        model[2].weight.data = torch.randn(2, 3).t().contiguous().t()  # other strides
        assert torch.equal(gm(x), model(x))
        model[0].bias.add_(1)  # in place, as before
        assert torch.equal(gm(x), model(x))
    assert runs_cpp(gm)
