"""Types of torchcap._C, the compiled part of the package (src/python/*.cpp).

torchcap's own modules are its only callers: the public API is torchcap's
(torchcap/__init__.py). Each name here is one the module defines, with the
parameter names its bindings give (positional-only where they give none);
tests/python/test_package.py checks both against the built module.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch.fx.graph import Graph
from torch.fx.node import Node

# (name, tensor) of the parameters or buffers of a module, by qualified name.
_NamedTensors = Sequence[tuple[str, torch.Tensor]]
# TraceOptions::dynamic: (input, dim, symbol name, min, max or None).
_DynamicDims = Sequence[tuple[int, int, str, int, Optional[int]]]
# (module, qualified path, class name) of the modules on module stacks.
_Modules = list[tuple[torch.nn.Module, str, str]]


class GraphModule:
    """A C++ torchcap::GraphModule (graph, attributes, specs), immutable
    once made: the methods that change something return a copy."""

    def build_fx(self, graph: Graph, spec_class: Callable[..., Any],
                 direct: bool = True) -> tuple[Any, Any, list[tuple[str, str]],
                                               dict[str, Node]]: ...
    def fx_specs(self, spec_class: Callable[..., Any]) -> tuple[Any, Any, list[tuple[str, str]]]: ...
    # (name, kind, tensor): kind "parameter", "buffer" or "constant"; None
    # for an undefined attribute.
    def attributes(self) -> list[tuple[str, str, Optional[torch.Tensor]]]: ...
    def attach_attributes(self, module: torch.nn.Module,
                          new_module: Callable[[], torch.nn.Module]) -> list[tuple[str, str]]: ...
    def has_meta_attributes(self) -> bool: ...
    def set_loaded_attributes(self, tensors: Sequence[tuple[str, Optional[torch.Tensor]]],
                              /) -> None: ...
    def with_attributes(self, tensors: _NamedTensors, /) -> GraphModule: ...
    def save(self, path: str, tensors: _NamedTensors, /) -> None: ...
    def num_nodes(self) -> int: ...
    def code_with_source(self) -> str: ...
    # (role, target, parameter, state) of each output of a training step.
    def training_signature(self) -> list[tuple[str, str, str, str]]: ...
    def written_inputs(self) -> list[bool]: ...
    # (dtype, sizes, strides) of each placeholder, None where not recorded;
    # in a dynamic graph a symbolic size is None, and so are its strides.
    def placeholder_metas(
        self) -> list[Optional[tuple[torch.dtype, tuple[Optional[int], ...],
                                     Optional[tuple[int, ...]]]]]: ...
    def placeholder_names(self) -> list[str]: ...
    def call_names(self) -> list[str]: ...
    def call_keywords(self) -> list[str]: ...
    def is_dynamic(self) -> bool: ...
    def check_sizes(self, inputs: Sequence[torch.Tensor], /) -> list[int]: ...
    def optimized_for_inference(self) -> GraphModule: ...
    def with_passes(self, names: Sequence[str], /) -> GraphModule: ...
    def runner(self) -> Runner: ...
    def __str__(self) -> str: ...
    def __copy__(self) -> GraphModule: ...
    def __deepcopy__(self, memo: Any, /) -> GraphModule: ...
    def __getstate__(self) -> bytes: ...
    def __setstate__(self, state: bytes, /) -> None: ...


class Runner:
    """Runs a GraphModule's calls with the C++ interpreter (Note [Calls run
    from the C++ graph] in src/python/runner.cpp)."""

    # The flat outputs, or None where the torch.fx code must run the call.
    def run(self, inputs: list[Any]) -> Optional[list[torch.Tensor]]: ...
    # (table, Chrome trace, [(node, target, source, seconds over all runs)]).
    def profile(self, inputs: list[Any],
                runs: int) -> tuple[str, str, list[tuple[str, str, str, float]]]: ...


def trace(fn: Callable[..., Any], parameters: _NamedTensors, buffers: _NamedTensors,
          args: tuple[Any, ...], kwargs: dict[str, Any], export_program: bool, inference: bool,
          preserve: Optional[Sequence[str]], allow_input_mutation: bool,
          allow_data_dependent_values: bool, record_stack_traces: bool,
          internal_dirs: Sequence[str], modules: _Modules = ..., meta: bool = False,
          refuse_out_into_inputs: bool = False, dynamic: _DynamicDims = ...,
          argument_names: list[str] = ...) -> GraphModule: ...


def export_training(forward: Callable[..., Any], loss: Callable[..., torch.Tensor],
                    parameters: _NamedTensors, buffers: _NamedTensors, args: tuple[Any, ...],
                    targets: tuple[Any, ...], optimizer: str, optimizer_options: dict[str, Any],
                    record_stack_traces: bool, internal_dirs: Sequence[str],
                    modules: _Modules = ..., dynamic: _DynamicDims = ...) -> GraphModule: ...


def load(path: str, verify_checksums: bool, check_shapes: bool) -> GraphModule: ...


# nodes: (op, name, target, args, kwargs, (dtype, sizes, strides) or None)
# of each node; attributes: (name, kind, tensor).
def save_fx(nodes: list[tuple[str, str, str, Any, dict[str, Any],
                              Optional[tuple[torch.dtype, list[int], list[int]]]]],
            attributes: list[tuple[str, str, torch.Tensor]], path: str, /) -> None: ...


# (named_parameters(), named_buffers(), modules) of root in one walk, or
# None for a module whose class lists them its own way.
def module_contents(root: torch.nn.Module, with_modules: bool, plain: Callable[[type], bool],
                    class_name: Callable[[type], str]) -> Optional[tuple[
                        list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]], _Modules]]: ...


# The name of the torchcap error class a RuntimeError's message stands for,
# or "" (Note [Errors raised inside operators] in src/trace/trace_state.h).
def operator_error_kind(message: str) -> str: ...
