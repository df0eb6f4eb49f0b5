"""The package's manners (docs/python.md, Typing): the public API has
docstrings naming its parameters and signatures help() can show, the
compiled part's stub (_C.pyi) names exactly what torchcap._C defines, with
its parameters, and the types (py.typed, _C.pyi) ship beside the package."""

import ast
import filecmp
import importlib.util
import inspect
import os
import pathlib
import pydoc
import re
import subprocess
import sys
import tempfile
import textwrap
import typing

import pytest

import torchcap
from torchcap import _C

PACKAGE = pathlib.Path(torchcap.__file__).parent
SOURCE = pathlib.Path(__file__).resolve().parents[2] / "python" / "torchcap"

# The public functions and classes, by their name in torchcap.
PUBLIC = {name: getattr(torchcap, name) for name in torchcap.__all__
          if callable(getattr(torchcap, name))}
ERRORS = {name: obj for name, obj in PUBLIC.items()
          if isinstance(obj, type) and issubclass(obj, BaseException)}
CLASSES = {name: obj for name, obj in PUBLIC.items() if isinstance(obj, type) and name not in ERRORS}
FUNCTIONS = {name: obj for name, obj in PUBLIC.items() if not isinstance(obj, type)}


def _parameters(obj):
    """The parameters of a function, or of a class's constructor, without self."""
    return [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]


# --- The public API ---------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_public_functions_have_docstrings_naming_each_parameter(name):
    f = FUNCTIONS[name]
    doc = inspect.getdoc(f)
    assert doc and len(doc.splitlines()) > 1, f"torchcap.{name} has no docstring to speak of"
    unnamed = [p.name for p in _parameters(f)
               if not re.search(rf"\b{p.name}\b", doc)]
    assert not unnamed, f"torchcap.{name}'s docstring does not explain {unnamed}"


@pytest.mark.parametrize("name", sorted({**CLASSES, **ERRORS}))
def test_public_classes_have_docstrings(name):
    cls = PUBLIC[name]
    assert inspect.getdoc(cls), f"torchcap.{name} has no docstring"
    for method, f in vars(cls).items():
        if inspect.isfunction(f) and not method.startswith("_"):
            assert inspect.getdoc(f), f"torchcap.{name}.{method} has no docstring"


@pytest.mark.parametrize("name", sorted({**FUNCTIONS, **CLASSES}))
def test_public_signatures_are_the_real_ones(name):
    """Not a wrapper's (*args, **kwargs): a named parameter at least, and
    what help() shows is the signature inspect finds."""
    obj = PUBLIC[name]
    named = [p for p in _parameters(obj) if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    assert named, f"torchcap.{name}{inspect.signature(obj)} hides its parameters"
    target = obj.__init__ if isinstance(obj, type) else obj
    assert not hasattr(target, "__wrapped__"), f"torchcap.{name} is a wrapper"
    shown = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    for p in named:
        assert re.search(rf"\b{p.name}\b", shown), f"help(torchcap.{name}) does not show {p.name}"


@pytest.mark.parametrize("name", sorted({**FUNCTIONS, **CLASSES}))
def test_public_api_is_annotated(name):
    """Every parameter has a type, and every function a return type; the
    annotations name real objects."""
    obj = PUBLIC[name]
    signature = inspect.signature(obj)
    parameters = _parameters(obj)
    empty = inspect.Parameter.empty
    if all(p.annotation is empty for p in parameters) and signature.return_annotation is empty:
        pytest.fail(f"torchcap.{name} ({obj.__module__}) has no annotations")
    missing = [p.name for p in parameters if p.annotation is empty]
    assert not missing, f"torchcap.{name}: parameters without a type: {missing}"
    if not isinstance(obj, type):
        assert signature.return_annotation is not empty, f"torchcap.{name} has no return type"
    typing.get_type_hints(obj)
    if isinstance(obj, type) and inspect.isfunction(obj.__init__):
        typing.get_type_hints(obj.__init__)


def test_help_shows_trace_parameters_and_their_types():
    shown = pydoc.render_doc(torchcap.trace, renderer=pydoc.plaintext)
    assert "trace(f: Callable[..., Any], args: Union[tuple[Any, ...], list[Any]]" in shown
    assert "allow_input_mutation: bool = False" in shown
    assert "-> torch.fx.graph_module.GraphModule" in shown
    assert "preserve: the operators kept whole" in shown


# --- The compiled part's stub -------------------------------------------------------

def _stub():
    return ast.parse((PACKAGE / "_C.pyi").read_text())


def _defined(body):
    """{name: FunctionDef or ClassDef} of a stub's body (type aliases are
    the stub's own, not _C's)."""
    return {d.name: d for d in body if isinstance(d, (ast.FunctionDef, ast.ClassDef))}


def _pybind_members(cls):
    """The attributes pybind11 defined on a class: each has a docstring
    that starts with its signature (its __init__ is Python's default, which
    refuses to make one)."""
    return {name: f for name, f in vars(cls).items()
            if (not name.startswith("__") or (f.__doc__ or "").startswith(name + "("))}


def _split_top_level(text):
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def _pybind_parameters(name, f):
    """[(name, has default)] from the signature pybind11 writes first in a
    function's docstring ("load(path: str, verify_checksums: bool) -> ...")."""
    first = (f.__doc__ or "").splitlines()[0]
    assert first.startswith(name + "(") and "Overloaded function" not in f.__doc__, \
        f"{name}: no single pybind11 signature in its docstring: {first!r}"
    depth, end = 0, None
    for i, c in enumerate(first[len(name):], len(name)):
        depth += c in "([{"
        depth -= c in ")]}"
        if depth == 0:
            end = i
            break
    return [(p.split(":", 1)[0].strip(), " = " in p)
            for p in _split_top_level(first[len(name) + 1:end])]


def _stub_parameters(d):
    """[(name, has default, positional-only)] of a stub function."""
    a = d.args
    positional = a.posonlyargs + a.args
    defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
    out = [(p.arg, has, i < len(a.posonlyargs)) for i, (p, has) in enumerate(zip(positional, defaults))]
    out += [(p.arg, default is not None, False) for p, default in zip(a.kwonlyargs, a.kw_defaults)]
    assert a.vararg is None and a.kwarg is None, f"{d.name}: the stub takes *args or **kwargs"
    return out


def _check_parameters(where, f, d):
    """The stub's parameters are pybind11's: the same names (a positional-only
    one where pybind11 names none: arg0, arg1, ...) and defaults."""
    given = _pybind_parameters(f.__name__, f)
    stub = _stub_parameters(d)
    assert len(given) == len(stub), f"{where}: _C takes {given}, the stub {stub}"
    for (name, default), (stub_name, stub_default, positional_only) in zip(given, stub):
        if re.fullmatch(r"arg\d+", name):
            assert positional_only, f"{where}: {stub_name} is positional-only in _C"
        elif name == "self":
            assert stub_name == "self", f"{where}: the stub's {stub_name} is self in _C"
        else:
            assert (stub_name, positional_only) == (name, False), \
                f"{where}: _C's parameter {name}, the stub's {stub_name}"
        assert default == stub_default, f"{where}: {name}: a default in one of _C and the stub only"


def test_stub_lists_exactly_what_C_defines():
    stub = _defined(_stub().body)
    defined = {name for name in dir(_C) if not name.startswith("__")}
    assert defined - set(stub) == set(), "defined by _C, missing from _C.pyi"
    assert set(stub) - defined == set(), "in _C.pyi, not defined by _C"
    for name, d in stub.items():
        obj = getattr(_C, name)
        if isinstance(d, ast.ClassDef):
            assert isinstance(obj, type), f"_C.{name} is not a class"
            members = _pybind_members(obj)
            methods = _defined(d.body)
            assert set(members) - set(methods) == set(), f"_C.{name}: missing from _C.pyi"
            assert set(methods) - set(members) == set(), f"_C.{name}: in _C.pyi, not defined by _C"
            for method, md in methods.items():
                _check_parameters(f"_C.{name}.{method}", members[method], md)
        else:
            assert isinstance(d, ast.FunctionDef) and callable(obj) and not isinstance(obj, type)
            _check_parameters(f"_C.{name}", obj, d)


def test_types_ship_in_the_build_tree():
    for name in ("py.typed", "_C.pyi"):
        assert (PACKAGE / name).is_file(), f"{name} is not beside {PACKAGE / '__init__.py'}"
        if SOURCE.is_dir() and SOURCE != PACKAGE:
            assert filecmp.cmp(PACKAGE / name, SOURCE / name, shallow=False), \
                f"the build tree's {name} is not the source's (ninja torchcap_python_files)"


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_reads_the_types(tmp_path):
    """With mypy (python3-mypy), a program using the API type-checks and sees
    its types; the check needs none of it."""
    (tmp_path / "user.py").write_text(textwrap.dedent("""\
        import torch
        import torchcap
        from torchcap import _C

        gm = torchcap.trace(torch.nn.Linear(3, 2), (torch.ones(1, 3),), inference=True)
        reveal_type(gm)
        reveal_type(torchcap.profile(gm, torch.ones(1, 3)).nodes)
        reveal_type(torchcap.Dim("batch", max=64).max)
        reveal_type(_C.load("x.tcg", True).runner())
        version: str = torchcap.__version__
        torchcap.trace(torch.nn.Linear(3, 2), torch.ones(1, 3))
        """))
    # The package imported here, whatever PYTHONPATH says relative to where.
    path = os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")])
    # torch takes mypy a minute or two to read; its cache, kept between runs,
    # makes later runs take seconds.
    cache = pathlib.Path(tempfile.gettempdir()) / f"torchcap-mypy-cache-{os.getuid()}"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir",
         str(cache), "user.py"],
        cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path))
    # Only the program's lines: torchcap's own modules are not all typed yet.
    lines = [line.split(": ", 1)[1] for line in result.stdout.splitlines()
             if line.startswith("user.py:")]
    assert lines == [
        'note: Revealed type is "torch.fx.graph_module.GraphModule"',
        'note: Revealed type is "builtins.list[Tuple[builtins.str, builtins.str, builtins.str, '
        'builtins.float]]"',
        'note: Revealed type is "Union[builtins.int, None]"',
        'note: Revealed type is "torchcap._C.Runner"',
        'error: Argument 2 to "trace" has incompatible type "Tensor"; expected '
        '"Union[Tuple[Any, ...], List[Any]]"  [arg-type]',
    ], result.stdout + result.stderr
