"""The code a module torchcap made runs as its forward(), as torch.fx's
code generator would write it for the module's graph: the argument and
result structure (tree specs) unpacked and rebuilt, get_attr statements
valid for any attribute name, buffer writes under the module's lock, the
program's keyword arguments (TorchcapCodeGen, _KeywordCodeGen), and the
code of aten graphs made without torch.fx's per-node machinery.
"""

import keyword
import math
import threading

import torch
import torch.fx
from torch.fx.graph import CodeGen

class _Spec:
    """A tree spec: kind is leaf, none, constant, tuple, list or dict."""

    __slots__ = ("kind", "children", "keys", "value", "num_leaves")

    def __init__(self, kind, children=(), keys=(), value=None):
        self.kind = kind
        self.children = list(children)
        self.keys = list(keys)
        self.value = value
        self.num_leaves = 1 if kind == "leaf" else sum(c.num_leaves for c in self.children)


def _set_output_val(graph, mutations):
    """The output node's meta["val"], as every other node has one: the values
    it returns (user outputs, then the new values of written buffers and
    inputs), each its node's meta["val"], None for a None result."""
    output = next(iter(reversed(graph.nodes)))
    results = output.args[0]
    if mutations:  # ((results, written inputs),): Note in _fx_graph
        results = results[0]
    output.meta["val"] = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                          for a in results]


def _spec_leaf_paths(spec, root):
    """(spec, access expression) of every leaf below `spec`, in order, without recursion."""
    out = []
    stack = [(spec, root)]
    while stack:
        s, path = stack.pop()
        if s.kind == "leaf":
            out.append(path)
            continue
        for k in reversed(range(len(s.children))):
            key = repr(s.keys[k]) if s.kind == "dict" else str(k)
            stack.append((s.children[k], f"{path}[{key}]"))
    return out


def _spec_expression(spec, leaves):
    """Python source that builds `spec`'s structure from the names in `leaves` (consumed)."""
    if spec.kind == "leaf":
        return leaves.pop(0)
    if spec.kind == "none":
        return "None"
    if spec.kind == "constant":
        v = spec.value
        if isinstance(v, float) and not math.isfinite(v):
            return f"float({str(v)!r})"
        return repr(v)
    parts = [_spec_expression(c, leaves) for c in spec.children]
    if spec.kind == "tuple":
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    if spec.kind == "list":
        return "[" + ", ".join(parts) + "]"
    return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(spec.keys, parts)) + "}"


def _spec_flatten(spec, value):
    """The leaves of `value` by `spec`; constants and None are skipped."""
    if spec.kind == "leaf":
        return [value]
    if spec.kind in ("none", "constant"):
        return []
    out = []
    items = [value[k] for k in spec.keys] if spec.kind == "dict" else list(value)
    for child, item in zip(spec.children, items):
        out.extend(_spec_flatten(child, item))
    return out


def _spec_unflatten(spec, leaves):
    if spec.kind == "leaf":
        return leaves.pop(0)
    if spec.kind == "none":
        return None
    if spec.kind == "constant":
        return spec.value
    parts = [_spec_unflatten(c, leaves) for c in spec.children]
    if spec.kind == "tuple":
        return tuple(parts)
    if spec.kind == "list":
        return parts
    return dict(zip(spec.keys, parts))


class TorchcapCodeGen(CodeGen):
    """forward() takes the program's nested arguments and returns its nested result.

    Each top-level element of the input spec is one parameter of forward: a
    tensor parameter is its placeholder; a nested one is unpacked into its
    placeholders by indexing. Constants and None in the input spec were
    specialised when the program was captured: their parameters are accepted
    and ignored. The return statement rebuilds the output spec's structure.
    """

    def __init__(self, in_spec, out_spec, mutations=(), placeholders=None, names=()):
        super().__init__()
        self.in_spec = in_spec
        self.out_spec = out_spec
        # The positional arguments' names (Note [Calling convention] in
        # src/graph/call_convention.cpp); a nested argument's parameter takes
        # its name, a tensor's is its placeholder (named after it by the
        # trace). Empty when unknown: arg<i>.
        self.names = list(names)
        # (kind, target) of the output values after the user outputs: the new
        # values of buffers and inputs the program wrote (the signature).
        self.mutations = list(mutations)
        # The file's placeholder names -> their names in the code. Names, not
        # nodes: a deep copy of the module copies its code generator, and nodes
        # would drag the whole graph into that copy, one recursion per node.
        self.placeholders = {k: v if isinstance(v, str) else v.name
                             for k, v in (placeholders or {}).items()}
        self._body_transformer = _BodyRewrite()

    def _gen_python_code(self, nodes, root_module, namespace, **kwargs):
        # Note [Attribute names in generated code]: torch.nn accepts any
        # attribute name without a dot ("block1-0", "class", 'a"b'), but
        # torch.fx writes get_attr targets into code as self.class or
        # getattr(self, "a"b"), which do not compile. Each get_attr statement
        # is rewritten with an access expression that is valid for any name.
        rewrite = self._body_transformer
        rewrite.statements = {
            f"{node.name} = ": _attribute_expression(node.target, root_module)
            for node in nodes if node.op == "get_attr"}
        # Note [Concurrent runs that write buffers back]: the body runs
        # holding the module's lock, under a global name no node takes (the
        # namespace renames a node of that name in the code).
        rewrite.lock = None
        if any(kind == "buffer_mutation" for kind, _ in self.mutations):
            rewrite.lock = (namespace.create_name(_BUFFER_UPDATES_LOCK, _buffer_updates_lock),
                            root_module)
        code = None
        if not kwargs.get("verbose", False):
            code = _aten_python_code(self, nodes, root_module, namespace)
        if code is None:
            code = super()._gen_python_code(nodes, root_module, namespace, **kwargs)
        if rewrite.lock is not None:
            code.globals[rewrite.lock[0]] = _buffer_updates_lock
        return code

    def gen_fn_def(self, free_vars, maybe_return_annotation):
        placeholders = list(free_vars)
        if placeholders and placeholders[0] == "self":
            placeholders = placeholders[1:]
        taken = set(placeholders)
        top = self.in_spec.children if self.in_spec.kind == "tuple" else [self.in_spec]
        params, lines, next_leaf = ["self"], [], 0
        for i, child in enumerate(top):
            if child.kind == "leaf":
                params.append(placeholders[next_leaf])
                next_leaf += 1
                continue
            param = self.names[i] if i < len(self.names) else f"arg{i}"
            while param in taken or param in _fx_illegal_names():
                param += "_"
            taken.add(param)
            params.append(param)
            for path in _spec_leaf_paths(child, param):
                lines.append(f"    {placeholders[next_leaf]} = {path}")
                next_leaf += 1
        head = f"def forward({', '.join(params)}){maybe_return_annotation}:"
        return "\n".join([head] + lines)

    def generate_output(self, output_args):
        # With mutations the output node holds (results, written inputs): the
        # second part only keeps those placeholders alive to the end.
        results = output_args[0] if self.mutations else output_args
        num_user = len(results) - len(self.mutations)
        # The writes the program made are applied before returning, so calling
        # forward has the program's effect.
        lines = []
        for (kind, target), value in zip(self.mutations, results[num_user:]):
            dest = (_attribute_expression(target) if kind == "buffer_mutation"
                    else self.placeholders[target])
            lines.append(f"{dest}.copy_({value!r})")
        leaves = [repr(a) for a in results[:num_user]]
        lines.append("return " + _spec_expression(self.out_spec, leaves))
        return "\n".join(lines)

    def process_inputs(self, *args):
        value = tuple(args) if self.in_spec.kind == "tuple" else args[0]
        return _spec_flatten(self.in_spec, value)

    def process_outputs(self, outputs):
        results = outputs[0] if self.mutations else outputs
        return _spec_unflatten(self.out_spec, list(results[:len(results) - len(self.mutations)]))


# Note [Code of aten graphs]
# torch.fx's code generator serves every graph a Python tracer makes, and
# costs as much as building the graph (map_arg over each node's arguments to
# find last uses, a global looked up per call, a type annotation considered
# per node; docs/benchmarks.md). For the graphs torchcap makes (placeholders
# without defaults, get_attr, aten operators and getitem, one output, no
# type annotations) the same text is made here, statement for statement as
# CodeGen._gen_python_code makes it (the same reprs of the same arguments,
# the same deletions after last uses, the same globals), in less time.
# Any other graph (one the user edited to call other functions, say) gets
# torch.fx's. tests/python/test_bridge.py compares the two on every graph it
# can make.
_QUALIFIED_NAMES = {}  # OpOverload -> "torch.ops.aten.add.Tensor"


def _aten_python_code(codegen, nodes, root_module, namespace):
    """CodeGen._gen_python_code(nodes, root_module, namespace) of a graph of
    aten operators, or None if the graph holds anything else."""
    import operator

    from torch.fx.graph import PythonCode, _custom_builtins, _is_from_torch, _get_qualified_name
    getitem, overload, fx_node = operator.getitem, torch._ops.OpOverload, torch.fx.Node
    nodes = list(nodes)
    targets = {}
    last_uses, seen = {}, set()
    for node in reversed(nodes):
        op = node.op
        if node.type is not None:
            return None
        if op == "call_function":
            target = node.target
            if target is not getitem:
                if type(target) is not overload or node.meta.get("is_wrapped", False):
                    return None
                name = _QUALIFIED_NAMES.get(target)
                if name is None:
                    if not _is_from_torch(target):
                        return None
                    name = _QUALIFIED_NAMES[target] = _get_qualified_name(target)
                targets[node] = name
            for a in node.args:
                if isinstance(a, tuple) and hasattr(a, "_fields"):
                    return None  # a named tuple: torch.fx names its type
            for a in node.kwargs.values():
                if isinstance(a, tuple) and hasattr(a, "_fields"):
                    return None
        elif op == "placeholder":
            if node.args:
                return None
        elif op not in ("get_attr", "output"):
            return None
        for n in node._input_nodes:
            if n not in seen:
                seen.add(n)
                last_uses.setdefault(node, []).append(n)

    globals_ = {}
    for name, (_, obj) in _custom_builtins.items():  # as add_global adds them
        if _is_from_torch(obj) and obj != torch.device:
            continue
        globals_[namespace.create_name(name, obj)] = obj

    free_vars, body = [], []
    append = body.append
    rewrite = codegen._body_transformer.statements
    for node in nodes:
        op, name = node.op, node.name
        if op == "placeholder":
            free_vars.append(node.target)
            raw = node.target.replace("*", "")
            if raw != name:
                append(f"{name} = {raw}\n")
            continue
        if op == "call_function":
            target = targets.get(node)
            if target is None:  # getitem
                a, b = node.args
                append(f"{name} = {a!r}[{b!r}]")
            else:
                # A node's repr is its name, without calling Node.__repr__.
                args = ", ".join([a.name if type(a) is fx_node else repr(a) for a in node.args])
                if node.kwargs:
                    kw = ", ".join([f"{k} = {v.name if type(v) is fx_node else repr(v)}"
                                    for k, v in node.kwargs.items()])
                    args = f"{args}, {kw}" if args else kw
                append(f"{name} = {target}({args})")
        elif op == "get_attr":
            head = f"{name} = "
            access = rewrite.get(head)
            append(head + (access if access is not None else _fx_format_target(root_module, node.target)))
        else:  # output
            append(codegen.generate_output(node.args[0]))
            append("\n")
            continue
        dead = last_uses.get(node)
        if dead:
            append(";  " + " = ".join([n.name for n in dead] + ["None"]) + "\n")
        else:
            append("\n")
    if not body:
        body.append("pass\n")
    transform = codegen._body_transformer
    if isinstance(transform, _BodyRewrite):
        body = transform.locked(body)  # get_attr statements are written above as it rewrites them
    elif transform:
        body = transform(body)
    for name, value in codegen.additional_globals():
        if _is_from_torch(value) and value != torch.device:
            continue
        globals_[namespace.create_name(name, value)] = value
    prologue = codegen.gen_fn_def(free_vars, "")
    code = "".join(body)
    code = "\n".join("    " + line for line in code.split("\n"))
    return PythonCode(f"\n\n\n{prologue}\n{code}", globals_)


def _fx_format_target(base, target):
    from torch.fx.graph import _format_target
    return _format_target(base, target)


class _BodyRewrite:
    """Rewrites torch.fx's code body: get_attr statements (Note [Attribute names
    in generated code]), and the whole body under the module's lock when the
    graph writes buffers back (Note [Concurrent runs that write buffers
    back]). A plain object, so that copies of the module copy it too."""

    def __init__(self):
        self.statements = {}  # "NAME = " of each get_attr node -> its access expression
        self.lock = None  # (the lock function's global name, the module's name), or None

    def __call__(self, body):
        # torch.fx emits a get_attr node as one body element, "NAME = access";
        # no other element starts with that node's "NAME = ".
        out = []
        for line in body:
            head = line.split(" = ", 1)[0] + " = "
            access = self.statements.get(head)
            out.append(head + access if access is not None else line)
        return self.locked(out)

    def locked(self, body):
        """The body, under the module's lock if the graph writes buffers back."""
        if self.lock is None:
            return body
        # Elements are not lines (a statement and its deletions, the output's
        # lines), so the joined text is indented line by line; no line of
        # torch.fx's code continues a string of the line before.
        name, root = self.lock
        lines = "".join(body).split("\n")
        return [f"with {name}({root}):\n" + "\n".join("    " + l if l else l for l in lines)]


# The name of _buffer_updates_lock in generated code, where it is a global.
_BUFFER_UPDATES_LOCK = "_buffer_updates_lock"


# Note [Concurrent runs that write buffers back]
# A graph that writes buffers back (an exported BatchNorm in train mode, a
# training step) reads each buffer at the start of a run and copies its new
# value in at the end. Two runs at once would both read the old value and
# one update would be lost: 8 threads calling an exported BatchNorm 100
# times each advanced num_batches_tracked by about 190, not 800. As the C++
# Interpreter does (Note [Concurrent runs that update buffers] in
# src/runtime/interpreter.cpp), such runs of one module are serialized, so
# each sees the updates of those before it, as successive calls would; runs
# of modules that write no buffers, and runs of other modules, go in
# parallel. The generated forward holds the lock around its body, so every
# way of calling it (module call, forward(), a loaded or traced or exported
# module, a training step) is covered. The lock belongs to the module's
# class, which torch.fx makes for each module: copies, pickles and reloads
# get a lock of their own, and nothing in the module's state (which deepcopy
# copies) holds one. Reentrant: a run that calls its own module again (a
# tensor subclass's hook, say) goes on instead of waiting for itself.
_BUFFER_LOCKS_MADE = threading.Lock()


def _buffer_updates_lock(module):
    """The lock of `module`'s runs that write buffers back, made on first use."""
    cls = type(module)
    lock = cls.__dict__.get("_torchcap_buffer_updates")
    if lock is None:
        with _BUFFER_LOCKS_MADE:
            lock = cls.__dict__.get("_torchcap_buffer_updates")
            if lock is None:
                lock = threading.RLock()
                cls._torchcap_buffer_updates = lock
    return lock


def _attribute_expression(path, root="self"):
    """self.a.b, with getattr(..., '0') for parts that are not identifiers or are keywords."""
    expr = root
    for part in path.split("."):
        if part.isidentifier() and not keyword.iskeyword(part):
            expr += "." + part
        else:
            expr = f"getattr({expr}, {part!r})"
    return expr


def _fx_illegal_names():
    """The names torch.fx's namespace refuses for a node (it renames them)."""
    import builtins
    from torch.fx.graph import _custom_builtins
    return frozenset(keyword.kwlist) | frozenset(builtins.__dict__) | frozenset(_custom_builtins)


# Short dtype names, as the C++ printer writes them (src/graph/meta.cpp), for
# messages that read like the C++ loader's.


class _KeywordCodeGen(TorchcapCodeGen):
    """forward(self, <positional>, *, <keywords>): the program's keyword
    arguments, which the graph takes as one trailing dict argument.

    Note [Keywords that are no parameter names]: a program takes whatever
    keywords its caller passes, `class` or `torch` among them
    (f(x, **{"class": y})). Made a parameter of the generated forward, such
    a name is a syntax error (a Python keyword) or hides a name the code
    reads (torch.ops..., getattr, float('inf'), a placeholder). Those
    keywords come in through one `**` parameter, under a name the code does
    not use, so callers pass them by their own names as before; the others
    stay keyword-only parameters, which the signature shows. Which keywords
    a call must pass is checked before forward runs (_CheckedCall).
    """

    def __init__(self, base, keywords):
        super().__init__(base.in_spec, base.out_spec, base.mutations, base.placeholders, base.names)
        self.keywords = list(keywords)

    def gen_fn_def(self, free_vars, maybe_return_annotation):
        text = super().gen_fn_def(free_vars, maybe_return_annotation)
        head, _, body = text.partition("\n")
        params = head[head.index("(") + 1:head.rindex(")")].split(", ")
        packed = params.pop()  # the dict parameter
        used = _fx_illegal_names().union(params, [_BUFFER_UPDATES_LOCK])
        named = [k for k in self.keywords if k.isidentifier() and k not in used]
        signature, values, rest = list(params), [], None
        if any(k in params for k in self.keywords):
            signature.append("/")  # so that such a keyword reaches `rest`
        if named:
            signature += ["*"] + named
        if len(named) < len(self.keywords):
            rest = "keywords"
            while rest in used or rest in self.keywords:
                rest += "_"
            signature.append(f"**{rest}")
        named = set(named)
        for k in self.keywords:
            values.append(f"{k!r}: {k}" if k in named else f"{k!r}: {rest}[{k!r}]")
        head = f"def forward({', '.join(signature)}){maybe_return_annotation}:"
        pack = f"    {packed} = {{{', '.join(values)}}}"
        return "\n".join([head, pack] + ([body] if body else []))

    def process_inputs(self, *args, **kwargs):
        return super().process_inputs(*args, kwargs) if self.keywords else \
            super().process_inputs(*args)
