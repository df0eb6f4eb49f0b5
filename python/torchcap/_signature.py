"""torchcap.signature(gm): what a captured module takes and returns, in the
vocabulary of torch.export's graph signature."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.fx

from torchcap._codegen import TorchcapCodeGen


class InputSpec(NamedTuple):
    """One placeholder or attribute of the graph.

    kind: "user_input", "parameter", "buffer" or "constant_tensor".
    name: the node's name in the graph (a placeholder's, or the get_attr
    target for attributes). argument: for a user input, where a call passes
    it ("x", "xs[1]", "batch['image']", "scale" for a keyword argument);
    None for attributes. dtype and shape: recorded at capture (shape entries
    are ints, or names like "s0" for a dynamic graph's symbols); None when
    not recorded.
    """
    kind: str
    name: str
    argument: Optional[str]
    dtype: Optional[torch.dtype]
    shape: Optional[tuple]


class OutputSpec(NamedTuple):
    """One value the graph's output node returns.

    kind: "user_output" (part of the result), "loss_output" (a training
    step's loss), "gradient_to_parameter" (a training step's gradient of
    parameter `target`), "parameter_mutation" / "buffer_mutation" (the new
    value of parameter or buffer `target`, written back after a call; an
    optimizer's state is a buffer) or "user_input_mutation" (of input
    `target`). name: the node that computes it. target: what is written or
    differentiated, or for a user output where the result holds it ("[0]",
    "['loss']").
    """
    kind: str
    name: str
    target: str
    dtype: Optional[torch.dtype]
    shape: Optional[tuple]


class GraphSignature:
    """The roles of a captured module's inputs and outputs (torch.export's
    ExportGraphSignature, in its vocabulary): input_specs, then
    output_specs, and the lists torch.export derives from them."""

    def __init__(self, call: str, input_specs: list, output_specs: list):
        self.call = call
        self.input_specs = list(input_specs)
        self.output_specs = list(output_specs)

    def _inputs(self, kind):
        return [s.name for s in self.input_specs if s.kind == kind]

    @property
    def user_inputs(self) -> list:
        return self._inputs("user_input")

    @property
    def parameters(self) -> list:
        return self._inputs("parameter")

    @property
    def buffers(self) -> list:
        return self._inputs("buffer")

    @property
    def constants(self) -> list:
        return self._inputs("constant_tensor")

    @property
    def user_outputs(self) -> list:
        return [s.name for s in self.output_specs if s.kind in ("user_output", "loss_output")]

    @property
    def buffers_to_mutate(self) -> dict:
        """Output node name -> the buffer it is the new value of."""
        return {s.name: s.target for s in self.output_specs if s.kind == "buffer_mutation"}

    @property
    def user_inputs_to_mutate(self) -> dict:
        return {s.name: s.target for s in self.output_specs if s.kind == "user_input_mutation"}

    def __repr__(self):
        def type_of(s):
            if s.dtype is None:
                return "?"
            return f"{str(s.dtype).replace('torch.', '')}[{', '.join(map(str, s.shape))}]"
        lines = [f"forward{self.call}", "inputs:"]
        for s in self.input_specs:
            where = f" <- {s.argument}" if s.argument is not None else ""
            lines.append(f"  {s.kind:<16} {s.name}: {type_of(s)}{where}")
        lines.append("outputs:")
        for s in self.output_specs:
            where = f" -> {s.target}" if s.target else ""
            lines.append(f"  {s.kind:<19} {s.name}: {type_of(s)}{where}")
        return "\n".join(lines)

    __str__ = __repr__


def _type_of(node):
    """(dtype, shape) recorded for a node, or (None, None)."""
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "dtype"):
        return None, None
    sizes = node.meta.get("torchcap_symbolic_sizes")
    return meta.dtype, tuple(sizes) if sizes is not None else tuple(meta.shape)


def _paths(spec, root, out):
    """The access path of every leaf of a tree spec, in order."""
    if spec.kind == "leaf":
        out.append(root)
    elif spec.kind in ("tuple", "list"):
        for i, child in enumerate(spec.children):
            _paths(child, f"{root}[{i}]", out)
    elif spec.kind == "dict":
        for k, child in zip(spec.keys, spec.children):
            _paths(child, f"{root}[{k!r}]", out)
    return out


def _codegen_of(gm):
    codegen = gm.graph._codegen
    return codegen if isinstance(codegen, TorchcapCodeGen) else None


def _argument_paths(codegen):
    """Where a call passes each placeholder, in order, and the call's
    parameter list ("(x, *, scale)")."""
    spec = codegen.in_spec
    top = spec.children if spec.kind == "tuple" else [spec]
    keywords = list(getattr(codegen, "keywords", ()))
    positional = top[:len(top) - 1] if keywords else top
    names = list(codegen.names)
    paths, params = [], []
    for i, child in enumerate(positional):
        name = names[i] if i < len(names) else f"arg{i}"
        params.append(name)
        _paths(child, name, paths)
    if keywords:
        params.append("*")
        for k, child in zip(top[-1].keys, top[-1].children):
            params.append(k)
            _paths(child, k, paths)
    return paths, "(" + ", ".join(params) + ")"


def _attribute_kinds(gm):
    """Attribute name -> "parameter" | "buffer" | "constant"."""
    graph = gm.__dict__.get("_torchcap_graph")
    if graph is not None:
        return {name: kind for name, kind, _ in graph.attributes()}
    listed = gm.__dict__.get("_torchcap_attributes")
    if listed is not None:
        return dict(listed)
    kinds = {name: "parameter" for name, _ in gm.named_parameters(remove_duplicate=False)}
    kinds.update({name: "buffer" for name, _ in gm.named_buffers(remove_duplicate=False)})
    return kinds


# training_signature's roles (src/export/training.cpp) as torch.export names them.
_ROLE_KINDS = {"loss": "loss_output", "gradient": "gradient_to_parameter",
               "parameter update": "parameter_mutation", "optimizer state": "buffer_mutation",
               "buffer update": "buffer_mutation"}


def signature(gm: torch.fx.GraphModule) -> GraphSignature:
    """The graph signature of a module torchcap made (traced, exported,
    loaded, optimized or a training step): each input with its kind (user
    input, parameter, buffer, constant tensor), where a call passes it,
    dtype and shape; each output with its kind (user output, loss, buffer or
    input mutation) and what it is written to. print() shows it as a table.

    A function rather than an attribute of gm: a model's own attribute
    could be named `signature`, and the module's code reads its attributes
    by name.
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"torchcap.signature: expected a torch.fx.GraphModule torchcap made, "
                        f"not a {type(gm).__name__}")
    codegen = _codegen_of(gm)
    if codegen is None:
        raise TypeError("torchcap.signature: this GraphModule was not made by torchcap (its "
                        "code generator is torch.fx's), so its inputs' structure is unknown")
    kinds = _attribute_kinds(gm)
    paths, call = _argument_paths(codegen)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = []
    for node, path in zip(placeholders, paths):
        inputs.append(InputSpec("user_input", node.name, path, *_type_of(node)))
    seen = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target not in seen:
            seen.add(node.target)
            kind = kinds.get(node.target, "buffer")
            inputs.append(InputSpec("constant_tensor" if kind == "constant" else kind,
                                    node.target, None, *_type_of(node)))
    output = next(iter(reversed(gm.graph.nodes)))
    results = output.args[0]
    mutations = codegen.mutations
    if mutations:
        results = results[0]
    num_user = len(results) - len(mutations)
    outputs = []
    user_paths = _paths(codegen.out_spec, "", [])
    for i, value in enumerate(results[:num_user]):
        name = value.name if isinstance(value, torch.fx.Node) else "None"
        types = _type_of(value) if isinstance(value, torch.fx.Node) else (None, None)
        outputs.append(OutputSpec("user_output", name, user_paths[i] if i < len(user_paths) else "",
                                  *types))
    for (kind, target), value in zip(mutations, results[num_user:]):
        if kind == "input_mutation":
            kind = "user_input_mutation"
        elif kinds.get(target) == "parameter":
            kind = "parameter_mutation"
        outputs.append(OutputSpec(kind, value.name, target, *_type_of(value)))
    # A training step's outputs by role (one per output value).
    roles = gm.__dict__.get("training_signature")
    if roles is not None and len(roles) == len(outputs):
        for i, (role, target, _, _) in enumerate(roles):
            kind = _ROLE_KINDS.get(role)
            if kind is not None:
                spec = outputs[i]
                outputs[i] = spec._replace(
                    kind=kind, target=spec.target if kind == "loss_output" else target)
    return GraphSignature(call, inputs, outputs)
