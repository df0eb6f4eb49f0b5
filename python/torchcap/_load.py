"""Reading `.tcg` files (docs/FORMAT.md) into torch.fx.GraphModules.

The reader checks what it relies on, in file order, and raises ValueError
naming the first problem and, where it has one, its byte offset:

    model.tcg: byte 8: format version 2.0 is not supported; ...

It does not check operator schemas: a call with arguments that do not fit its
operator fails when the module runs, as any torch.fx call would. The C++
loader (torchcap::load) checks schemas as well, and shapes. But it does refuse,
as the C++ loader does, the arguments some kernels would not survive (a
convolution's groups of 0: Note [Integers kernels divide by]).

With the compiled part (torchcap._C) the graph of a usual file is read by the
C++ loader instead, and the rest here; without it, or for any file that reader
does not take, everything is read here (Note [The graph read in C++]). Both
ways make the same GraphModule, and the same messages.

Tensors are not copied: the file is mapped copy-on-write (mmap.ACCESS_COPY)
and each tensor is a view of the mapping, which stays open as long as a tensor
uses it. Writing to a tensor changes this process's copy of the page only.
"""

import collections
import contextlib
import gc
import json
import keyword
import math
import mmap
import operator
import os
import re
import stat
import struct
import threading
import zlib

import torch
import torch.fx
import torch.utils._pytree as _pytree
from torch.fx.graph import CodeGen
from torch.fx.immutable_collections import immutable_dict as _immutable_dict
from torch.fx.immutable_collections import immutable_list as _immutable_list
from torch.fx.passes.shape_prop import TensorMetadata as _TensorMetadata

from torchcap._errors import Error, InputError, WeightError
from torchcap._format_tables import TABLES as _TABLES

try:  # the compiled part reads the graph faster (Note [The graph read in C++])
    from torchcap._C import read_graph as _read_graph_in_cpp
except ImportError:
    _read_graph_in_cpp = None

# Note [Wire tokens] in src/serialize/format.h: the format's constants and
# token tables come from the C++ ones (_format_tables.py is generated from
# them, and test_load.py fails when the two differ).
FORMAT_MAJOR_VERSION = _TABLES["version"]["major"]
FORMAT_MINOR_VERSION = _TABLES["version"]["minor"]

_MAGIC = bytes(_TABLES["header"]["magic"])
# magic, major, minor, header size, file size, JSON offset, JSON size,
# data offset, data size, alignment, flags: the fields of every version, in
# the order of _TABLES["header"]["fields"].
_HEADER = struct.Struct("<8sHHIQQQQQII")
_BASE_HEADER_SIZE = _TABLES["header"]["base_size"]
# From version 1.1: the JSON section's CRC-32 and the header's, after those.
_CHECKSUMS = struct.Struct("<II")
_CHECKSUMS_SINCE = _TABLES["header"]["checksums_since"]
_HEADER_SIZE = _TABLES["header"]["size"]
_FIELD = _TABLES["header"]["fields"]
_HEADER_CRC_AT = _FIELD["header_crc"]
_ALIGNMENT = _TABLES["header"]["alignment"]
_MAX_DIMS = _TABLES["limits"]["max_tensor_dims"]
_MAX_JSON_SIZE = _TABLES["limits"]["max_json_size"]
_INT64_MAX = (1 << 63) - 1
_NODE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Names a node cannot take because generated code would break: keywords,
# builtins, and names the code uses; the C++ graph's list
# (src/graph/reserved_names.h), so both loaders refuse the same files.
_RESERVED_NODE_NAMES = frozenset(_TABLES["reserved_node_names"])

# Dtypes whose tensors the data section holds, and the others an argument or
# a value's metadata may name; element sizes without making a tensor
# (complex32 warns when one is made).
_DTYPES = {name: getattr(torch, name) for name in _TABLES["dtypes"]}
_STORABLE_DTYPES = {name: _DTYPES[name] for name, d in _TABLES["dtypes"].items() if d["storable"]}
_ITEM_SIZES = {name: d["item_size"] for name, d in _TABLES["dtypes"].items()}
_LAYOUTS = {name: getattr(torch, name) for name in _TABLES["layouts"]}
_MEMORY_FORMATS = {name: getattr(torch, name) for name in _TABLES["memory_formats"]}
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
# The keys of each JSON object, with the minor version that added each
# (Note [Keys by version] in src/serialize/format.h).
_KEYS = _TABLES["keys"]


class _Spec:
    """A tree spec: kind is leaf, none, constant, tuple, list or dict."""

    __slots__ = ("kind", "children", "keys", "value", "num_leaves")

    def __init__(self, kind, children=(), keys=(), value=None):
        self.kind = kind
        self.children = list(children)
        self.keys = list(keys)
        self.value = value
        self.num_leaves = 1 if kind == "leaf" else sum(c.num_leaves for c in self.children)


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

    def __init__(self, in_spec, out_spec, mutations=(), placeholders=None):
        super().__init__()
        self.in_spec = in_spec
        self.out_spec = out_spec
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
            param = f"arg{i}"
            while param in taken:
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
        if self.lock is None:
            return out
        # Elements are not lines (a statement and its deletions, the output's
        # lines), so the joined text is indented line by line; no line of
        # torch.fx's code continues a string of the line before.
        name, root = self.lock
        lines = "".join(out).split("\n")
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
def _buffer_updates_lock(module):
    """The lock of `module`'s runs that write buffers back, made on first use."""
    cls = type(module)
    lock = cls.__dict__.get("_torchcap_buffer_updates")
    if lock is None:
        with _FIRST_USE_LOCK:
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


class _Reader:
    def __init__(self, path, buf, verify_checksums=True, graph=None):
        self.path = path
        self.buf = buf
        # What _C.read_graph returned, or None (Note [The graph read in C++]).
        self.graph_from_cpp = graph
        self.verify = verify_checksums
        self.checksums = False
        self.strict = True
        self.minor = FORMAT_MINOR_VERSION
        self.module_stacks = []
        self._scan = None

    # --- Errors ---------------------------------------------------------------

    def fail(self, offset, what):
        if callable(offset):  # computed only now that it is needed
            offset = offset()
        raise ValueError(f"{self.path}: byte {offset}: {what}")

    def element_offset(self, key, index):
        """The byte where element `index` of top-level array `key` starts.

        Found by a scan of the JSON text that only runs when an error needs it.
        """
        if self._scan is None:
            self._scan = _scan_json(self.buf[self.json_offset : self.json_offset + self.json_size])
        values, elements = self._scan
        if key in elements and index < len(elements[key]):
            return self.json_offset + elements[key][index]
        return self.json_offset + values.get(key, 0)

    # --- Header ---------------------------------------------------------------

    def read_header(self):
        size = len(self.buf)
        if size < 8 or self.buf[:8] != _MAGIC:
            self.fail(0, "not a torchcap graph file (the first 8 bytes are not the .tcg magic)")
        if size < _BASE_HEADER_SIZE:
            self.fail(size, f"the file ends after {size} bytes, inside the 64-byte header")
        (_, major, minor, header_size, file_size, json_offset, json_size, data_offset,
         data_size, alignment, flags) = _HEADER.unpack_from(self.buf, 0)
        version = f"{major}.{minor}"
        if major != FORMAT_MAJOR_VERSION:
            self.fail(_FIELD["major"], f"format version {version} is not supported; this torchcap "
                         f"reads version {FORMAT_MAJOR_VERSION}.x")
        self.strict = minor <= FORMAT_MINOR_VERSION
        self.minor = minor
        self.checksums = minor >= _CHECKSUMS_SINCE
        expected_header = _HEADER_SIZE if self.checksums else _BASE_HEADER_SIZE
        if size < expected_header:
            self.fail(size, f"the file ends after {size} bytes, inside the {expected_header}-byte "
                            f"header of version {version}")
        if self.strict and header_size != expected_header:
            self.fail(_FIELD["header_size"], f"header size {header_size} is not {expected_header}, the header size "
                          f"of version {version}")
        if header_size < expected_header or header_size > size:
            self.fail(_FIELD["header_size"], f"header size {header_size} is not between {expected_header} and the "
                          f"file size {size}")
        if self.checksums:
            self.json_crc, recorded = _CHECKSUMS.unpack_from(self.buf, _BASE_HEADER_SIZE)
            if self.verify:
                crc = zlib.crc32(self.buf[_HEADER_CRC_AT + 4 : header_size],
                                 zlib.crc32(self.buf[:_HEADER_CRC_AT]))
                if crc != recorded:
                    self.fail(_HEADER_CRC_AT, f"the header is damaged: its CRC-32 is "
                                              f"0x{crc:08x}, the header records 0x{recorded:08x}")
        if file_size != size:
            self.fail(_FIELD["file_size"], f"the header gives the file size as {file_size} bytes but the file has "
                          f"{size}" + (" (truncated)" if file_size > size else " (trailing bytes)"))
        if alignment != _ALIGNMENT:
            self.fail(_FIELD["alignment"], f"alignment {alignment} is not {_ALIGNMENT}")
        if self.strict and flags != 0:
            self.fail(_FIELD["flags"], f"unknown flags {flags:#x} for version {major}.{minor}")
        if json_offset < header_size or json_offset > size:
            self.fail(_FIELD["json_offset"], f"the JSON section's offset {json_offset} is not between the end of "
                          "the header and the end of the file")
        if json_size > size - json_offset:
            self.fail(_FIELD["json_size"], f"the JSON section [{json_offset}, +{json_size}) extends past the end "
                          f"of the file at {size}")
        if json_size > _MAX_JSON_SIZE:
            self.fail(_FIELD["json_size"], f"the JSON section is {json_size} bytes; the format allows at most "
                          f"{_MAX_JSON_SIZE}")
        json_end = json_offset + json_size
        if data_offset % _ALIGNMENT or data_offset < json_end or data_offset > size:
            self.fail(_FIELD["data_offset"], f"the data section's offset {data_offset} is not a multiple of 64 "
                          f"between the end of the JSON section at {json_end} and the end of "
                          "the file")
        if data_size > size - data_offset:
            self.fail(_FIELD["data_size"], f"the data section [{data_offset}, +{data_size}) extends past the end "
                          f"of the file at {size}")
        self.json_offset, self.json_size = json_offset, json_size
        self.data_offset, self.data_size = data_offset, data_size

    # --- JSON -----------------------------------------------------------------

    def read_json(self):
        raw = bytes(self.buf[self.json_offset : self.json_offset + self.json_size])
        if self.checksums and self.verify:
            crc = zlib.crc32(raw)
            if crc != self.json_crc:
                self.fail(self.json_offset, f"the JSON section is damaged: its CRC-32 is "
                                            f"0x{crc:08x}, the header records 0x{self.json_crc:08x}")
        if self.graph_from_cpp is not None:
            # The nodes are read already: the rest of the document, without them.
            begin, end = self.graph_from_cpp[0], self.graph_from_cpp[1]
            raw = raw[:begin] + b"[]" + raw[end:]
        nul = raw.find(b"\0")
        if nul >= 0:
            self.fail(self.json_offset + nul, "the JSON section contains a NUL byte")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(self.json_offset + e.start, "the JSON section is not valid UTF-8")
        try:
            doc = json.loads(text, parse_constant=self._reject_constant,
                             parse_float=self._parse_float)
        except json.JSONDecodeError as e:
            at = self.json_offset + len(text[: e.pos].encode("utf-8"))
            self.fail(at, f"the JSON section is not valid JSON: {e.msg}")
        except RecursionError:
            self.fail(self.json_offset, "the JSON nests too deeply")
        # An integer beyond int64 has at least 19 digits: only then is each
        # literal looked at (a hook on every integer costs a Python call each).
        if _LONG_DIGITS.search(raw):
            # Where: the scan finds the first such literal, as the C++ reader's does.
            at, literal = _first_big_integer(raw)
            if literal is not None:
                self.fail(self.json_offset + at,
                          f"integer {literal} does not fit in 64 signed bits")
        if not isinstance(doc, dict):
            self.fail(self.json_offset, "the JSON section must hold an object, not "
                                        f"{_json_type(doc)}")
        self.doc = doc
        self.check_keys(doc, "document", self.json_offset, "")

    def _parse_float(self, text):
        # A number too large for a double: Python would read inf, C++ refuses.
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{self.path}: byte {self.json_offset}: the JSON section is not "
                             f"valid JSON: number overflow parsing '{text}'")
        return value

    def _reject_constant(self, name):
        # Python's json accepts NaN and Infinity; JSON and the format do not.
        raise ValueError(f"{self.path}: byte {self.json_offset}: the JSON section is not valid "
                         f"JSON: {name} is not a JSON value")

    def top(self, key):
        if key not in self.doc:
            self.fail(self.json_offset, f"the JSON section has no '{key}'")
        return self.doc[key]

    def check_keys(self, obj, table, offset, label):
        """Refuses keys the file's version does not have (Note [Keys by version])."""
        if not self.strict:
            return
        allowed = _KEYS[table]
        for k in obj:
            if allowed.get(k, self.minor + 1) > self.minor:
                # A key of a later version in a file that says it is older: say so.
                since = allowed.get(k)
                later = (f" in a file of version {FORMAT_MAJOR_VERSION}.{self.minor} (version "
                         f"1.{since} added it)" if since is not None else "")
                self.fail(offset, f"{label}unknown key '{k}'{later}")

    # --- Typed fields ---------------------------------------------------------

    def expect(self, value, kind, offset, label):
        types = {"object": dict, "array": list, "string": str}
        if not isinstance(value, types[kind]):
            article = "an" if kind[0] in "aeiou" else "a"
            self.fail(offset, f"{label}expected {article} {kind}, got {_json_type(value)}")
        return value

    def member(self, obj, key, offset, label):
        if key not in obj:
            self.fail(offset, f"{label}missing '{key}'")
        return obj[key]

    def integer(self, value, offset, label, minimum=-(1 << 63)):
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(offset, f"{label}expected an integer, got {_json_type(value)}")
        if not -(1 << 63) <= value <= _INT64_MAX:
            self.fail(offset, f"{label}integer {value} does not fit in 64 signed bits")
        if value < minimum:
            self.fail(offset, f"{label}expected a non-negative integer, got {value}")
        return value

    def dims(self, value, offset, label, non_negative):
        self.expect(value, "array", offset, label)
        if len(value) > _MAX_DIMS:
            self.fail(offset, f"{label}{len(value)} dimensions; the format allows at most "
                              f"{_MAX_DIMS}")
        lo = 0 if non_negative else -(1 << 63)
        return [self.integer(v, offset, f"{label[:-2]}[{i}]: ", lo) for i, v in enumerate(value)]

    def float_value(self, value, offset, label):
        if isinstance(value, float):
            return value
        self.expect(value, "string", offset, label)
        if value in _NONFINITE:
            return _NONFINITE[value]
        if len(value) == 18 and value.startswith("0x"):
            try:
                d = struct.unpack("<d", int(value[2:], 16).to_bytes(8, "little"))[0]
            except ValueError:
                d = 0.0
            if not math.isfinite(d):
                return d
        self.fail(offset, f"{label}'{value}' is not inf, -inf, nan or the 0x bits of a NaN")

    def named(self, table, value, what, offset, label):
        self.expect(value, "string", offset, label)
        if value not in table:
            self.fail(offset, f"{label}unknown {what} '{value}'")
        return table[value]

    def device(self, value, offset, label):
        self.expect(value, "string", offset, label)
        try:
            return torch.device(value)
        except RuntimeError:
            self.fail(offset, f"{label}'{value}' is not a device")

    # --- Tensors --------------------------------------------------------------

    def read_tensors(self):
        table = self.expect(self.top("tensors"), "array", self.json_offset, "'tensors': ")
        self.tensors, names, ranges = [], set(), []
        for i, entry in enumerate(table):
            t = _Lazy(lambda i=i: self.element_offset("tensors", i))
            label = f"tensors[{i}]: "
            self.expect(entry, "object", t, label)
            self.check_keys(entry, "tensor", t, label)
            name = self.expect(self.member(entry, "name", t, label), "string", t,
                               label + "name: ")
            if not name:
                self.fail(t, label + "name: the name is empty")
            label = f"tensor '{name}' (tensors[{i}]): "
            if name in names:
                self.fail(t, label + "name: a second tensor has this name")
            names.add(name)
            dtype_name = self.expect(self.member(entry, "dtype", t, label), "string",
                                     t, label + "dtype: ")
            if dtype_name not in _DTYPES:
                self.fail(t, f"{label}dtype: unknown dtype '{dtype_name}'")
            if dtype_name not in _STORABLE_DTYPES:
                self.fail(t, f"{label}dtype: tensors of dtype {dtype_name} cannot be "
                                    "stored in the data section")
            dtype = _STORABLE_DTYPES[dtype_name]
            sizes = self.dims(self.member(entry, "sizes", t, label), t,
                              label + "sizes: ", True)
            strides = self.dims(self.member(entry, "strides", t, label), t,
                                label + "strides: ", True)
            if len(strides) != len(sizes):
                self.fail(t, f"{label}strides: {len(strides)} strides for {len(sizes)} "
                                    "dimensions")
            if "weightless" in entry:
                self.tensors.append(self.weightless(entry, dtype_name, sizes, strides, t, label))
                continue
            offset = self.integer(self.member(entry, "offset", t, label), t,
                                  label + "offset: ", 0)
            length = self.integer(self.member(entry, "length", t, label), t,
                                  label + "length: ", 0)
            if self.checksums:
                recorded = self.integer(self.member(entry, "crc32", t, label), t,
                                        label + "crc32: ", 0)
                if recorded > 0xFFFFFFFF:
                    self.fail(t, f"{label}crc32: CRC-32 {recorded} does not fit in 32 "
                                        "bits")
            item = _ITEM_SIZES[dtype_name]
            if any(s == 0 for s in sizes):
                span = 0
            else:
                span = (1 + sum((s - 1) * st for s, st in zip(sizes, strides))) * item
            numel = math.prod(sizes)
            if span > _INT64_MAX or numel > _INT64_MAX:
                self.fail(t, f"{label}sizes {sizes} with strides {strides} span more "
                                    "bytes than 64 bits can count")
            if length != span:
                self.fail(t, f"{label}length: byte length {length} does not match dtype "
                                    f"{dtype_name}, sizes {sizes} and strides {strides}, which "
                                    f"span {span} bytes")
            if offset % _ALIGNMENT:
                self.fail(t, f"{label}offset: offset {offset} is not a multiple of "
                                    f"{_ALIGNMENT}")
            if offset > self.data_size or length > self.data_size - offset:
                self.fail(t, f"{label}bytes [{offset}, {offset + length}) of the data "
                                    f"section extend past its end at {self.data_size}")
            if length:
                ranges.append((offset, length, i, name))
            start = self.data_offset + offset
            if self.checksums and self.verify:
                with memoryview(self.buf) as view:
                    crc = zlib.crc32(view[start : start + length])
                if crc != recorded:
                    self.fail(start, f"{label[:-2]}: its bytes are damaged: their CRC-32 is "
                                     f"0x{crc:08x}, the tensor table records 0x{recorded:08x}")
            if length == 0:
                tensor = torch.empty_strided(sizes, strides, dtype=dtype)
            else:
                flat = torch.frombuffer(self.buf, dtype=dtype, count=length // item, offset=start)
                tensor = flat.as_strided(sizes, strides)
            if dtype == torch.bool and length:
                raw = torch.frombuffer(self.buf, dtype=torch.uint8, count=length, offset=start)
                bad = (raw > 1).nonzero()
                if len(bad):
                    k = int(bad[0])
                    self.fail(start + k, f"{label[:-2]}: bool byte {int(raw[k])} is neither 0 "
                                         "nor 1")
            self.tensors.append(tensor)
        ranges.sort()
        for (o1, l1, i1, n1), (o2, _, i2, n2) in zip(ranges, ranges[1:]):
            if o2 < o1 + l1:
                # Named at the later of the two table entries, as if read in order.
                (index, name), other = ((i2, n2), n1) if i2 > i1 else ((i1, n1), n2)
                self.fail(self.element_offset("tensors", index),
                          f"tensor '{name}' (tensors[{index}]): its bytes overlap those of "
                          f"tensor '{other}'")

    def weightless(self, entry, dtype_name, sizes, strides, t, label):
        """A tensor table entry without bytes (Note [Weightless tensors] in
        src/serialize/format.h): a meta tensor, for load(weights=...) to bind."""
        flag = entry["weightless"]
        if flag is not True:
            got = "false" if flag is False else _json_type(flag)
            self.fail(t, f"{label}weightless: expected true, got {got}")
        for key in ("offset", "length", "crc32"):
            if key in entry:
                self.fail(t, f"{label}{key}: a weightless tensor has no bytes in the file, so "
                             f"no '{key}'")
        item = _ITEM_SIZES[dtype_name]
        span = 0 if any(s == 0 for s in sizes) else (
            1 + sum((s - 1) * st for s, st in zip(sizes, strides))) * item
        if span > _INT64_MAX or math.prod(sizes) > _INT64_MAX:
            self.fail(t, f"{label}sizes {sizes} with strides {strides} span more bytes than 64 "
                         "bits can count")
        return torch.empty_strided(sizes, strides, dtype=_STORABLE_DTYPES[dtype_name],
                                   device="meta")

    # --- Module stacks --------------------------------------------------------

    def read_module_stacks(self):
        """The table of distinct module stacks (version 1.2): lists of (path, (path, type))."""
        if "module_stacks" not in self.doc:
            return
        at = lambda: self.top_offset("module_stacks")  # noqa: E731
        table = self.expect(self.doc["module_stacks"], "array", at, "'module_stacks': ")
        for i, entry in enumerate(table):
            t = _Lazy(lambda i=i: self.element_offset("module_stacks", i))
            label = f"module_stacks[{i}]: "
            self.expect(entry, "array", t, label)
            frames = []
            for k, f in enumerate(entry):
                fl = f"{label}[{k}]: "
                self.expect(f, "object", t, fl)
                self.check_keys(f, "module_frame", t, fl)
                path = self.expect(self.member(f, "path", t, fl), "string", t,
                                   fl[:-2] + ".path: ")
                kind = self.expect(self.member(f, "type", t, fl), "string", t,
                                   fl[:-2] + ".type: ")
                frames.append((path, (path, kind)))
            self.module_stacks.append(tuple(frames))

    # --- Attributes -----------------------------------------------------------

    def read_attributes(self):
        table = self.expect(self.top("attributes"), "array", self.json_offset, "'attributes': ")
        self.attributes, names = [], set()
        for i, entry in enumerate(table):
            t = _Lazy(lambda i=i: self.element_offset("attributes", i))
            label = f"attributes[{i}]: "
            self.expect(entry, "object", t, label)
            self.check_keys(entry, "attribute", t, label)
            name = self.expect(self.member(entry, "name", t, label), "string", t,
                               label + "name: ")
            label = f"attribute '{name}' (attributes[{i}]): "
            if not name or any(part == "" for part in name.split(".")):
                self.fail(t, label + "name: the name is not a dotted path of non-empty "
                                            "parts")
            if name in names:
                self.fail(t, label + "name: a second attribute has this name")
            names.add(name)
            kind = self.expect(self.member(entry, "kind", t, label), "string", t,
                               label + "kind: ")
            if kind not in _TABLES["attribute_kinds"]:
                self.fail(t, f"{label}kind: unknown attribute kind '{kind}'")
            index = self.member(entry, "tensor", t, label)
            tensor = None
            if index is not None:
                index = self.integer(index, t, label + "tensor: ")
                if not 0 <= index < len(self.tensors):
                    self.fail(t, f"{label}tensor: tensor index {index} is not in the "
                                        f"tensor table of {len(self.tensors)}")
                tensor = self.tensors[index]
            self.attributes.append((name, kind, tensor))

    # --- Nodes ----------------------------------------------------------------

    def argument(self, value, env, offset, label):
        if value is None or isinstance(value, (bool, int, str)):
            if isinstance(value, int) and not isinstance(value, bool):
                self.integer(value, offset, label)
            return value
        if isinstance(value, float):
            return value
        if isinstance(value, list):
            return [self.argument(v, env, offset, f"{label[:-2]}[{i}]: ")
                    for i, v in enumerate(value)]
        if len(value) != 1:
            self.fail(offset, f"{label}a typed argument is an object with exactly one key")
        (kind, v), = value.items()
        sub = f"{label[:-2]}.{kind}: "
        if kind == "node":
            self.expect(v, "string", offset, sub)
            if v not in env:
                self.fail(offset, f"{sub}%{v} is not a node defined before this one")
            return env[v]
        if kind == "float":
            return self.float_value(v, offset, sub)
        if kind == "dtype":
            return self.named(_DTYPES, v, "dtype", offset, sub)
        if kind == "layout":
            return self.named(_LAYOUTS, v, "layout", offset, sub)
        if kind == "memory_format":
            return self.named(_MEMORY_FORMATS, v, "memory format", offset, sub)
        if kind == "device":
            return self.device(v, offset, sub)
        self.fail(offset, f"{label}unknown argument kind '{kind}'")

    def operator(self, target, offset, label):
        ns, sep, rest = target.partition("::")
        if not sep or not ns or not rest:
            self.fail(offset, f"{label}'{target}' is not a qualified operator name; expected "
                              "namespace::name[.overload], e.g. aten::add.Tensor")
        name, _, overload = rest.partition(".")
        op = None
        # The default overload is written without a name ("aten::addmm"), as
        # LibTorch names it; "aten::addmm.default" is not an operator name.
        if overload != "default":
            try:
                op = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
            except (AttributeError, RuntimeError):
                pass
        # getattr also finds Python attributes of the packet (__call__, ...).
        if not isinstance(op, torch._ops.OpOverload):
            if ns in ("aten", "prim", "prims"):
                self.fail(offset, f"{label}call_function: no operator {target} is registered")
            # A custom operator: registered only once its library is loaded.
            self.fail(offset, f"{label}call_function: no operator {target} is registered in "
                              "torch.ops; load the library that defines it first: "
                              "torch.ops.load_library(path), or import the Python package that "
                              "registers it (import torchvision for torchvision:: operators)")
        return op

    def check_kwargs(self, op, target, kwargs, offset, label):
        # Keyword names end up in generated source: only the schema's own names
        # may get there (the C++ loader checks the whole schema).
        names = {a.name for a in op._schema.arguments}
        for k in kwargs:
            if k not in names:
                self.fail(offset, f"{label}{target} has no argument named '{k}'")

    def meta(self, node, value, offset, label):
        self.expect(value, "object", offset, label)
        self.check_keys(value, "meta", offset, label)
        if "val" in value:
            val = value["val"]
            vlabel = label[:-2] + ".val: "
            self.expect(val, "object", offset, vlabel)
            self.check_keys(val, "value", offset, vlabel)
            kind = self.expect(self.member(val, "kind", offset, vlabel), "string", offset, vlabel)
            tensors = self.expect(self.member(val, "tensors", offset, vlabel), "array", offset,
                                  vlabel)
            want = _TABLES["value_kinds"].get(kind)  # -1: any number
            if want is None:
                self.fail(offset, f"{vlabel[:-2]}.kind: unknown value kind '{kind}'")
            if want >= 0 and len(tensors) != want:
                self.fail(offset, f"{vlabel[:-2]}.tensors: a value of kind '{kind}' has {want} "
                                  f"tensor(s), not {len(tensors)}")
            metas = []
            for i, t in enumerate(tensors):
                tl = f"{vlabel[:-2]}.tensors[{i}]: "
                self.expect(t, "object", offset, tl)
                self.check_keys(t, "tensor_meta", offset, tl)
                dtype = self.named(_DTYPES, self.member(t, "dtype", offset, tl), "dtype", offset,
                                   tl[:-2] + ".dtype: ")
                sizes = self.dims(self.member(t, "sizes", offset, tl), offset,
                                  tl[:-2] + ".sizes: ", True)
                strides = self.dims(self.member(t, "strides", offset, tl), offset,
                                    tl[:-2] + ".strides: ", False)
                self.device(self.member(t, "device", offset, tl), offset, tl[:-2] + ".device: ")
                metas.append(_tensor_metadata(dtype, sizes, strides))
            if kind == "tensor":
                node.meta["tensor_meta"] = metas[0]
            elif kind in ("tuple", "list"):
                node.meta["tensor_meta"] = tuple(metas) if kind == "tuple" else metas
        if "stack_trace" in value:
            frames = value["stack_trace"]
            flabel = label[:-2] + ".stack_trace: "
            self.expect(frames, "array", offset, flabel)
            lines = []
            for i, f in enumerate(frames):
                fl = f"{flabel[:-2]}[{i}]: "
                self.expect(f, "object", offset, fl)
                self.check_keys(f, "frame", offset, fl)
                file = self.expect(self.member(f, "file", offset, fl), "string", offset, fl)
                line = self.integer(self.member(f, "line", offset, fl), offset,
                                    fl[:-2] + ".line: ", 0)
                if line > 2**31 - 1:  # the C++ side holds it in an int
                    self.fail(offset, fl[:-2] + ".line: line number too large")
                function = self.expect(self.member(f, "function", offset, fl), "string", offset,
                                       fl)
                text = f'  File "{file}", line {line}, in {function}\n'
                if "code" in f:
                    code = self.expect(f["code"], "string", offset, fl[:-2] + ".code: ")
                    if code:
                        text += f"    {code}\n"
                lines.append(text)
            # Python tracebacks put the innermost frame last; the file, first.
            node.stack_trace = "".join(reversed(lines))
        if "module_stack" in value:
            sl = label[:-2] + ".module_stack: "
            index = self.integer(value["module_stack"], offset, sl)
            if not 0 <= index < len(self.module_stacks):
                self.fail(offset, f"{sl}module stack {index} is not in the module stack table "
                                  f"of {len(self.module_stacks)}")
            # torch.fx's form: the enclosing modules, outermost first, each
            # path -> (path, type); the type is the class's qualified name.
            node.meta["nn_module_stack"] = dict(self.module_stacks[index])

    def read_nodes(self):
        if self.graph_from_cpp is not None:
            self.read_nodes_from_cpp()
            return
        nodes = self.expect(self.top("nodes"), "array", self.json_offset, "'nodes': ")
        graph = torch.fx.Graph()
        env, output, seen_other = {}, None, False
        fast = _FastNodes(self, graph, env)
        for i, entry in enumerate(nodes):
            # Note [Checked twice only when wrong]: most nodes are calls of
            # the plainest shape, which _FastNodes checks and makes without
            # building a message; anything else, and anything wrong, is read
            # again below, where every check names what it finds wrong.
            if output is None and (node := fast.call(entry)) is not None:
                seen_other = True
                if "meta" in entry and not fast.meta(node, entry["meta"]):
                    name = entry["name"]
                    self.meta(node, entry["meta"],
                              _Lazy(lambda i=i: self.element_offset("nodes", i)),
                              f"node %{name} (nodes[{i}]): meta: ")
                continue
            t = _Lazy(lambda i=i: self.element_offset("nodes", i))
            label = f"nodes[{i}]: "
            self.expect(entry, "object", t, label)
            self.check_keys(entry, "node", t, label)
            name = self.expect(self.member(entry, "name", t, label), "string", t,
                               label + "name: ")
            label = f"node %{name} (nodes[{i}]): "
            op = self.expect(self.member(entry, "op", t, label), "string", t,
                             label + "op: ")
            target = self.expect(self.member(entry, "target", t, label), "string",
                                 t, label + "target: ")
            raw_args = self.expect(entry.get("args", []), "array", t, label + "args: ")
            args = [self.argument(a, env, t, f"{label}args[{k}]: ")
                    for k, a in enumerate(raw_args)]
            raw_kwargs = self.expect(entry.get("kwargs", []), "array", t,
                                     label + "kwargs: ")
            kwargs = {}
            for k, pair in enumerate(raw_kwargs):
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                    self.fail(t, f"{label}kwargs[{k}]: a keyword argument is a "
                                        "[name, value] pair")
                kwargs[pair[0]] = self.argument(pair[1], env, t,
                                                f"{label}kwargs[{k}][1]: ")
            if output is not None:
                self.fail(t, label + "the node comes after the output node")
            if (name in env or not _NODE_NAME.fullmatch(name)
                    or name in _RESERVED_NODE_NAMES):
                self.fail(t, f"{label}name: duplicate or invalid node name '{name}'")
            if op in ("placeholder", "get_attr") and (args or kwargs):
                self.fail(t, f"{label}{'a placeholder' if op == 'placeholder' else op} "
                                    "takes no arguments")
            if op == "placeholder":
                if seen_other:
                    self.fail(t, f"{label}placeholder %{name} comes after "
                                        "non-placeholder nodes")
                node = graph.create_node("placeholder", name, name=name)
            elif op == "get_attr":
                if not target:
                    self.fail(t, label + "get_attr: the attribute path is empty")
                node = graph.create_node("get_attr", target, name=name)
            elif op == "call_function" and target == "getitem":
                if (len(args) != 2 or kwargs or not isinstance(args[0], torch.fx.Node)
                        or isinstance(args[1], bool) or not isinstance(args[1], int)):
                    self.fail(t, label + "args: getitem takes (node, index)")
                node = graph.create_node("call_function", operator.getitem, tuple(args),
                                         name=name)
            elif op == "call_function":
                fn = self.operator(target, t, label)
                self.check_kwargs(fn, target, kwargs, t, label)
                node = graph.create_node("call_function", fn, tuple(args), kwargs, name=name)
            elif op == "output":
                if len(args) != 1 or not isinstance(args[0], list) or kwargs:
                    self.fail(t, label + "args: the output takes one argument, the list "
                                                "of results")
                if target != "output":
                    self.fail(t, label + "target: the output's target is 'output'")
                # The C++ graph names its output node itself: "output", or the
                # first of output_1, output_2, ... that is free.
                expected, k = "output", 0
                while expected in env:
                    k += 1
                    expected = f"output_{k}"
                if name != expected:
                    self.fail(t, f"{label}name: duplicate or invalid node name '{name}'")
                if not all(isinstance(a, torch.fx.Node) for a in args[0]):
                    self.fail(t, label + "the results must be nodes")
                node = output = graph.output(args[0])
                self.output_name = name
            else:
                self.fail(t, f"{label}op: unknown opcode '{op}'")
            seen_other = seen_other or op != "placeholder"
            # torch.fx may rename a node whose name Python code cannot use
            # ("NoneType"); references in the file still use the file's name.
            env[name] = node
            if "meta" in entry:
                self.meta(node, entry["meta"], t, label + "meta: ")
            if op == "call_function" and target != "getitem":
                problem = _check_call(fn, target, args, kwargs, self.recorded_shape)
                if problem:
                    self.fail(t, label + problem)
        if output is None:
            self.fail(self.element_offset("nodes", len(nodes)), "'nodes': the graph has no output "
                                                                "node")
        self.graph, self.output, self.env = graph, output, env

    def check_results(self):
        """Each result is a node of one tensor, as the C++ loader's lint has it
        (a node of several outputs is read through getitem)."""
        if self.graph_from_cpp is not None:
            return  # the C++ reader checked them
        names = {node: name for name, node in self.env.items()}
        for a in self.output.args[0]:
            if a.op == "call_function" and a.target is not operator.getitem:
                returns = a.target._schema.returns
                if len(returns) != 1 or not isinstance(returns[0].type, torch.TensorType):
                    self.fail(self.top_offset("nodes"),
                              f"lint: output %{self.output_name} returns node %{names[a]}; "
                              "results must be Tensor nodes or none")

    def recorded_shape(self, node):
        """(sizes, strides) of a node's tensor value as the file records them, or
        None: an attribute's own, a node's metadata, or a getitem's element of
        its source's (Note [Kernels that trust their arguments])."""
        if node.op == "get_attr":
            for name, _, tensor in self.attributes:
                if name == node.target:
                    return None if tensor is None else (tuple(tensor.shape), tensor.stride())
            return None
        meta = node.meta.get("tensor_meta")
        if isinstance(meta, _TensorMetadata):
            return tuple(meta.shape), tuple(meta.stride)
        if node.op == "call_function" and node.target is operator.getitem:
            source, index = node.args
            metas = source.meta.get("tensor_meta")
            if isinstance(metas, (tuple, list)) and 0 <= index < len(metas):
                return tuple(metas[index].shape), tuple(metas[index].stride)
        return None

    def read_nodes_from_cpp(self):
        """The nodes _C.read_graph read (Note [The graph read in C++]).

        Each node is what read_nodes would make of it, made without
        Graph.create_node where torch.fx would keep its name (as it does for
        nearly every node): a Node made by hand costs much less. Raises
        _NotUsual at anything read_nodes would do otherwise, and the file is
        read again without the compiled part.
        """
        _, _, raw_nodes, raw_vals = self.graph_from_cpp
        graph = torch.fx.Graph()
        namespace = graph._graph_namespace
        used, named = namespace._used_names, namespace._obj_to_name
        illegal = _fx_illegal_names()
        root, new_node, node_class = graph._root, torch.fx.Node.__new__, torch.fx.Node
        metas = [self.value_from_cpp(v) for v in raw_vals]
        operators = {}
        nodes, env, output = [], {}, None

        def convert(a, inputs):
            kind = type(a)
            if kind is tuple:
                if len(a) == 1:
                    n = nodes[a[0]]
                    inputs[n] = None
                    return n
                tag, name = a
                if tag == "device":
                    return torch.device(name)
                return _TYPED_ARGUMENTS[tag][name]
            if kind is list:
                return _immutable_list([convert(v, inputs) for v in a])
            return a

        for name, op, target, raw_args, raw_kwargs, val, stack, modules in raw_nodes:
            if output is not None:
                raise _NotUsual()
            inputs = {}
            args = []
            for a in raw_args:
                if type(a) is tuple and len(a) == 1:  # a node: the common case, inline
                    n = nodes[a[0]]
                    inputs[n] = None
                    args.append(n)
                else:
                    args.append(convert(a, inputs))
            args = tuple(args)
            # Node.__init__ makes kwargs an immutable_dict, and lists immutable_lists.
            kwargs = _immutable_dict(() if raw_kwargs is None else
                                     ((k, convert(v, inputs)) for k, v in raw_kwargs))
            if op == "call_function":
                if target == "getitem":
                    fn = operator.getitem
                else:
                    fn = operators.get(target)
                    if fn is None:
                        try:
                            fn = operators[target] = self.operator(target, 0, "")
                        except ValueError:
                            raise _NotUsual() from None
                target = fn
            elif op == "placeholder":
                target = name
            elif op == "output":
                if len(args) != 1 or not all(isinstance(a, node_class) for a in args[0]):
                    raise _NotUsual()
                node = output = graph.output(list(args[0]))
            if output is None:
                if (name in used or name in illegal
                        or ("0" <= name[-1] <= "9" and _fx_renames_suffix(name))):
                    # torch.fx renames it: its own way, as read_nodes does.
                    node = graph.create_node(op, target, args, dict(kwargs), name=name)
                else:
                    # What Graph.create_node and Node.__init__ do, in their order.
                    node = new_node(node_class)
                    node.graph, node.name, node.op, node.target = graph, name, op, target
                    node._input_nodes = inputs
                    node._args, node._kwargs = args, kwargs
                    node.users = {}
                    node.type = None
                    node._prev = node._next = node
                    node._erased = False
                    node._repr_fn = None
                    node.meta = {}
                    for n in inputs:
                        n.users[node] = None
                    used[name] = 0
                    named[node] = name
                    # graph._insert(node), at the end of a new graph: root.prepend(node).
                    last = root._prev
                    last._next, node._prev = node, last
                    node._next, root._prev = root, node
                    graph._len += 1
            meta = node.meta
            if val >= 0:
                kind, tensors = metas[val]
                if kind == "tensor":
                    shape, dtype, stride = tensors[0]
                    meta["tensor_meta"] = _TensorMetadata(shape, dtype, False, stride, None,
                                                          False, {})
                elif kind == "tuple":
                    meta["tensor_meta"] = tuple(_TensorMetadata(shape, dtype, False, stride, None,
                                                                False, {})
                                                for shape, dtype, stride in tensors)
                elif kind == "list":
                    meta["tensor_meta"] = [_TensorMetadata(shape, dtype, False, stride, None,
                                                           False, {})
                                           for shape, dtype, stride in tensors]
            if stack is not None:
                meta["stack_trace"] = stack
            if modules is not None:
                meta["nn_module_stack"] = dict(modules)
            nodes.append(node)
            env[name] = node
        if output is None:
            raise _NotUsual()
        self.graph, self.output, self.env = graph, output, env

    @staticmethod
    def value_from_cpp(val):
        """(kind, ((shape, dtype, stride), ...)) of a value _C.read_graph describes;
        TensorMetadata of its nodes share them (all three are immutable)."""
        kind, tensors = val
        return kind, tuple((torch.Size(sizes), _DTYPES[dtype], tuple(strides))
                           for dtype, sizes, strides in tensors)

    # --- Specs ----------------------------------------------------------------

    def spec(self, value, offset, label):
        self.expect(value, "object", offset, label)
        kind = self.expect(self.member(value, "kind", offset, label), "string", offset,
                           label[:-2] + ".kind: ")
        if kind in ("leaf", "none"):
            self.check_keys(value, "leaf_spec", offset, label)
            return _Spec(kind)
        if kind == "constant":
            self.check_keys(value, "constant_spec", offset, label)
            return _Spec(kind, value=self.constant(self.member(value, "value", offset, label),
                                                   offset, label[:-2] + ".value: "))
        if kind not in _TABLES["spec_kinds"]:
            self.fail(offset, f"{label[:-2]}.kind: unknown spec kind '{kind}'")
        children = self.expect(self.member(value, "children", offset, label), "array", offset,
                               label[:-2] + ".children: ")
        specs = [self.spec(c, offset, f"{label[:-2]}.children[{i}]: ")
                 for i, c in enumerate(children)]
        if kind != "dict":
            self.check_keys(value, "sequence_spec", offset, label)
            return _Spec(kind, specs)
        self.check_keys(value, "dict_spec", offset, label)
        keys = self.expect(self.member(value, "keys", offset, label), "array", offset,
                           label[:-2] + ".keys: ")
        if len(keys) != len(specs):
            self.fail(offset, f"{label[:-2]}.keys: {len(keys)} keys for {len(specs)} children")
        seen = set()
        for i, k in enumerate(keys):
            kl = f"{label[:-2]}.keys[{i}]: "
            first = keys[0]
            same = (isinstance(k, str) and isinstance(first, str)) or (
                _is_int(k) and _is_int(first))
            if not same:
                self.fail(offset, kl + "dict keys are all strings or all integers")
            if _is_int(k):
                self.integer(k, offset, kl)
            if k in seen:
                self.fail(offset, kl + "the key appears twice")
            seen.add(k)
        return _Spec(kind, specs, keys)

    def signature(self):
        """(kind, target) of the outputs after the user outputs; [] if all are user outputs."""
        if "signature" not in self.doc:
            return []
        label = "'signature': "
        at = lambda: self.top_offset("signature")  # noqa: E731
        sig = self.expect(self.doc["signature"], "object", at, label)
        self.check_keys(sig, "signature", at, label)
        outputs = self.expect(sig.get("outputs", []), "array", at, label + "outputs: ")
        mutations = []
        attributes = {name: kind for name, kind, _ in self.attributes}
        for i, o in enumerate(outputs):
            ol = f"{label}outputs[{i}]: "
            self.expect(o, "object", at, ol)
            self.check_keys(o, "output", at, ol)
            kind = self.expect(self.member(o, "kind", at, ol), "string", at, ol[:-2] + ".kind: ")
            if kind not in _TABLES["output_kinds"]:
                self.fail(at, f"{ol[:-2]}.kind: unknown output kind '{kind}'")
            target = self.expect(self.member(o, "target", at, ol), "string", at,
                                 ol[:-2] + ".target: ")
            where = f"output {i} ({kind.replace('_', ' ')}" + (f" of '{target}')" if target
                                                                  else ")")
            if kind == "user":
                if mutations:
                    self.fail(self.json_offset, where + " comes after a mutation output")
                continue
            if any(t == target for _, t in mutations):
                self.fail(self.json_offset, where + " updates its target twice")
            if kind == "buffer_mutation" and attributes.get(target, "constant") == "constant":
                self.fail(self.json_offset, where + " names no parameter or buffer")
            if kind == "input_mutation" and not (
                    target in self.env and self.env[target].op == "placeholder"):
                self.fail(self.json_offset, where + " names no placeholder")
            mutations.append((kind, target))
        if outputs and len(outputs) != len(self.output.args[0]):
            self.fail(self.json_offset, f"the output returns {len(self.output.args[0])} values but "
                                        f"there are {len(outputs)} output specs")
        return mutations

    def top_offset(self, key):
        """The byte where top-level `key`'s value starts (scanned on demand)."""
        if self._scan is None:
            self._scan = _scan_json(self.buf[self.json_offset : self.json_offset + self.json_size])
        return self.json_offset + self._scan[0].get(key, 0)

    def constant(self, value, offset, label):
        if isinstance(value, bool) or isinstance(value, str):
            return value
        if isinstance(value, int):
            return self.integer(value, offset, label)
        if isinstance(value, float):
            return value
        if isinstance(value, dict) and len(value) == 1 and "float" in value:
            return self.float_value(value["float"], offset, label[:-2] + ".float: ")
        self.fail(offset, f"{label}a constant is an int, float, bool or string, not "
                          f"{_json_type(value)}")

    # --- The module -----------------------------------------------------------

    def read(self, weights=None, strict=True):
        self.read_header()
        self.read_json()
        self.read_tensors()
        self.read_attributes()
        self.read_module_stacks()
        self.read_nodes()
        in_spec = self.spec(self.top("in_spec"), lambda: self.top_offset("in_spec"),
                            "'in_spec': ")
        out_spec = self.spec(self.top("out_spec"), lambda: self.top_offset("out_spec"),
                             "'out_spec': ")
        mutations = self.signature()
        self.check_results()

        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        if in_spec.num_leaves != len(placeholders):
            self.fail(self.json_offset, f"the graph has {len(placeholders)} placeholders but the "
                                        f"input spec has {in_spec.num_leaves} tensors")
        results = self.output.args[0]
        num_user = len(results) - len(mutations)
        if num_user < 0 or out_spec.num_leaves != num_user:
            self.fail(self.json_offset, f"the output returns {len(results)} values, "
                                        f"{len(mutations)} of them mutations; the output spec "
                                        f"expects {out_spec.num_leaves} tensors")
        if mutations:
            # Written inputs are passed to the output too, so that the
            # generated code keeps them bound until the writes at the end.
            written = [self.env[t] for k, t in mutations if k == "input_mutation"]
            self.output.args = ((list(results), written),)

        attributes = self.attributes
        if weights is not None:
            try:
                attributes = _bind(attributes, weights, strict)
            except WeightError as e:
                raise WeightError(f"{self.path}: {e}") from None
        # The attributes go onto the GraphModule directly (in file order, each
        # at its dotted path): GraphModule(root, graph) would copy only those a
        # get_attr names. The graph comes last, which generates forward().
        gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph(),
                                  class_name="TorchcapGraphModule")
        made = {}  # id(tensor) -> its Parameter: tied parameters stay one Parameter
        for i, (name, kind, tensor) in enumerate(attributes):
            def fail(what, i=i, name=name):
                self.fail(self.element_offset("attributes", i),
                          f"attribute '{name}' (attributes[{i}]): {what}")
            _set_attribute(gm, name, kind, tensor, fail, made)
        names = {a[0] for a in self.attributes}
        for node in self.graph.nodes:
            if node.op == "get_attr" and node.target not in names:
                self.fail(self.json_offset, f"get_attr %{node.name} reads attribute "
                                            f"'{node.target}', which the file does not have")
        self.graph.set_codegen(TorchcapCodeGen(
            in_spec, out_spec, mutations,
            {name: node.name for name, node in self.env.items() if node.op == "placeholder"}))
        _set_graph_generating_code_later(gm, self.graph)
        gm._torchcap_attributes = [(name, kind) for name, kind, _ in attributes]
        if any(t is not None and t.is_meta for _, _, t in attributes):
            gm.register_forward_pre_hook(_refuse_unbound_weights)
        written = _written_placeholders(self.graph) | {
            t for kind, t in mutations if kind == "input_mutation"}
        gm._torchcap_inputs = [
            _file_input_meta(node.meta["tensor_meta"], node.name in written)
            if isinstance(node.meta.get("tensor_meta"), _TensorMetadata) else _ANY_TENSOR
            for node in self.graph.nodes if node.op == "placeholder"]
        gm.register_forward_pre_hook(_check_loaded_inputs)
        return gm


def _set_graph_generating_code_later(gm, graph):
    """gm.graph = graph, with forward() generated and compiled when first needed.

    Note [Code generated on first use]: torch.fx generates a module's Python
    code and compiles it whenever its graph is set, which for a big graph
    takes longer than reading the file (a large part of torchcap.load on a
    long chain). Loading defers it, as later torch.fx does
    (_LazyGraphModule): the first call of the module, or the first look at its
    code (gm.code, print(gm)), generates it; gm.recompile() after editing the
    graph works as always. `gm` must be of its own class, as every
    GraphModule is (torch.fx makes one per instance), since the class's
    forward and _code are replaced until then.
    """
    cls = type(gm)
    cls.recompile = lambda self: None  # what setting the graph would call
    try:
        gm.graph = graph
    finally:
        del cls.recompile
    cls.forward = _forward_after_generating_code
    cls._code = property(_generated_code, _set_generated_code)
    gm.__dict__.pop("_code", None)  # an empty graph's, from GraphModule.__init__
    if "__reduce__" not in cls.__dict__:  # a traced module has its own
        cls.__reduce__ = _refuse_pickling


def _refuse_pickling(self):
    """torch.fx pickles a module as its code and rebuilds it by tracing that
    code symbolically, which gives a module of torchcap's code that takes no
    arguments: refused here rather than made wrong."""
    raise Error("this torch.fx module, loaded by torchcap.load (or traced and then edited), "
                "cannot be pickled: torch.fx would rebuild it from its code without the "
                "arguments it takes. Save it with torchcap.save and read it with torchcap.load")


# Note [First use from several threads]
# What a module makes on first use (its code here; a traced module's graph
# and attribute submodules, Note [Graph made on first use] in _trace.py)
# is made under this lock, and the code made once: threads calling a new
# module at once would otherwise each generate it, replacing the class's
# forward and graph under one another (wrong code, unbound locals, runaway
# recursion). Reentrant: making the code makes the graph, which sets it.
_FIRST_USE_LOCK = threading.RLock()


def _forward_after_generating_code(self, *args, **kwargs):
    with _FIRST_USE_LOCK:
        if type(self).__dict__.get("forward") is _forward_after_generating_code:
            self.recompile()  # replaces forward
    return self.forward(*args, **kwargs)


# The source is kept in the instance's __dict__ under torch.fx's own key,
# where pickling a GraphModule looks for it (the property, a data
# descriptor, takes precedence over that entry for attribute lookups).
def _generated_code(self):
    with _FIRST_USE_LOCK:
        if "_code" not in self.__dict__:
            self.recompile()
        return self.__dict__["_code"]


def _set_generated_code(self, src):
    self.__dict__["_code"] = src


class _NotUsual(Exception):
    """The graph _C.read_graph read needs reading the Python way (Note [The graph
    read in C++])."""


# Arguments _C.read_graph gives as (tag, name), by tag and name.
_TYPED_ARGUMENTS = {"dtype": _DTYPES, "layout": _LAYOUTS, "memory_format": _MEMORY_FORMATS}


def _fx_illegal_names():
    """The names torch.fx's namespace refuses for a node (it renames them)."""
    import builtins
    from torch.fx.graph import _custom_builtins
    return frozenset(keyword.kwlist) | frozenset(builtins.__dict__) | frozenset(_custom_builtins)


def _fx_renames_suffix(name):
    """Whether torch.fx rewrites the number at the end of `name` ("add_01" -> "add_1"):
    a number after the last underscore with a leading zero (names are ASCII)."""
    number = name[name.rfind("_") + 1:]
    return "_" in name and len(number) > 1 and number[0] == "0" and number.isdigit()


class _FastNodes:
    """Reads the common node without building any message (Note [Checked twice
    only when wrong] in _Reader.read_nodes).

    Each method returns a result only if the value has the plainest shape and
    passes every check _Reader's own method makes, and otherwise None or False,
    having changed nothing, so that _Reader reads it again and says what is
    wrong. It must never accept what _Reader would refuse.
    """

    def __init__(self, reader, graph, env):
        self.reader, self.graph, self.env = reader, graph, env
        minor, strict = reader.minor, reader.strict
        def allowed(table):
            keys = _KEYS[table]
            return frozenset(k for k, since in keys.items() if since <= minor or not strict)
        self.node_keys = allowed("node")
        self.meta_keys = allowed("meta")
        self.value_keys = allowed("value")
        self.tensor_meta_keys = allowed("tensor_meta")
        self.frame_keys = allowed("frame")
        self.strict = strict
        self.operators = {}  # target -> (OpOverload, its argument names)
        self.devices = set()  # device strings torch.device accepted
        self.module_stacks = reader.module_stacks

    def keys_ok(self, obj, allowed):
        return not self.strict or allowed.issuperset(obj)

    def call(self, entry):
        """A call_function node of an operator, without keyword arguments."""
        if type(entry) is not dict or not self.keys_ok(entry, self.node_keys):
            return None
        name, op, target = entry.get("name"), entry.get("op"), entry.get("target")
        if (op != "call_function" or type(name) is not str or type(target) is not str
                or target == "getitem" or name in self.env or name in _RESERVED_NODE_NAMES
                or not _NODE_NAME.fullmatch(name)):
            return None
        raw_args, raw_kwargs = entry.get("args", []), entry.get("kwargs", [])
        if type(raw_args) is not list or type(raw_kwargs) is not list or raw_kwargs:
            return None
        args = self.arguments(raw_args)
        if args is None:
            return None
        fn = self.operators.get(target)
        if fn is None:
            try:
                fn = self.reader.operator(target, 0, "")
            except ValueError:
                return None
            self.operators[target] = fn
        if _call_checks(fn) is not None:
            return None  # the careful reader checks its arguments
        node = self.graph.create_node("call_function", fn, tuple(args), {}, name=name)
        self.env[name] = node
        return node

    def arguments(self, values):
        """The arguments of a list of plain ones (nodes, ints, floats, strings,
        bools, None, lists of those), or None."""
        out = []
        for v in values:
            kind = type(v)
            if kind is dict:
                if len(v) != 1:
                    return None
                n = v.get("node")
                if type(n) is not str:
                    return None
                node = self.env.get(n)
                if node is None:
                    return None
                out.append(node)
            elif kind is int:
                if not -(1 << 63) <= v <= _INT64_MAX:
                    return None
                out.append(v)
            elif kind is list:
                inner = self.arguments(v)
                if inner is None:
                    return None
                out.append(inner)
            elif kind in (float, str, bool) or v is None:
                out.append(v)
            else:
                return None
        return out

    def meta(self, node, value):
        """Sets the node's metadata from `value`; False if it must be read again."""
        if type(value) is not dict or not self.keys_ok(value, self.meta_keys):
            return False
        tensor_meta = stack_trace = module_stack = None
        if "val" in value:
            tensor_meta = self.value(value["val"])
            if tensor_meta is None:
                return False
        if "stack_trace" in value:
            stack_trace = self.stack_trace(value["stack_trace"])
            if stack_trace is None:
                return False
        if "module_stack" in value:
            index = value["module_stack"]
            if type(index) is not int or not 0 <= index < len(self.module_stacks):
                return False
            module_stack = self.module_stacks[index]
        if tensor_meta is not None and tensor_meta is not _NO_TENSOR_META:
            node.meta["tensor_meta"] = tensor_meta
        if stack_trace is not None:
            node.stack_trace = stack_trace
        if module_stack is not None:
            node.meta["nn_module_stack"] = dict(module_stack)
        return True

    def value(self, val):
        """`tensor_meta` for a value of one tensor or none; None to read again."""
        if type(val) is not dict or not self.keys_ok(val, self.value_keys):
            return None
        kind, tensors = val.get("kind"), val.get("tensors")
        if type(tensors) is not list:
            return None
        if kind == "none" and not tensors:
            return _NO_TENSOR_META
        if kind != "tensor" or len(tensors) != 1:
            return None
        t = tensors[0]
        if type(t) is not dict or not self.keys_ok(t, self.tensor_meta_keys):
            return None
        dtype = _DTYPES.get(t.get("dtype")) if type(t.get("dtype")) is str else None
        sizes, strides, device = t.get("sizes"), t.get("strides"), t.get("device")
        if (dtype is None or not _plain_dims(sizes, 0) or not _plain_dims(strides, -(1 << 63))
                or type(device) is not str):
            return None
        if device not in self.devices:
            try:
                torch.device(device)
            except RuntimeError:
                return None
            self.devices.add(device)
        return _tensor_metadata(dtype, sizes, strides)

    def stack_trace(self, frames):
        if type(frames) is not list:
            return None
        lines = []
        for f in frames:
            if type(f) is not dict or not self.keys_ok(f, self.frame_keys):
                return None
            file, line, function = f.get("file"), f.get("line"), f.get("function")
            code = f.get("code", "")
            if (type(file) is not str or type(line) is not int or not 0 <= line <= 2**31 - 1
                    or type(function) is not str or type(code) is not str):
                return None
            text = f'  File "{file}", line {line}, in {function}\n'
            if code:
                text += f"    {code}\n"
            lines.append(text)
        return "".join(reversed(lines))


# A value of kind "none": no tensor_meta.
_NO_TENSOR_META = object()


# --- Arguments kernels trust ------------------------------------------------------

# Note [Integers kernels divide by] and Note [Kernels that trust their
# arguments] (src/graph/schema_check.cpp): some LibTorch kernels divide by an
# integer argument, read a list argument's values or make a view without
# checking them, and die of SIGFPE or SIGSEGV, which no loader can catch
# (issue 42). This loader refuses such calls by the C++ loader's rule and with
# its messages, so that a file is refused by both or by neither
# (fuzz/compare_loaders.py holds them to it). Like the schema checks, the shape
# check of the C++ loader (Note [Checking a file's shapes]) is not made here: a
# call whose arguments do not fit its inputs' shapes fails when it runs, with
# an error.
_MAX_FACTOR = 2**31 - 1
# name -> (lowest value, only in convolutions and pools)
_INT_RANGES = {
    "groups": (1, False), "group": (1, False), "num_head": (1, False), "num_heads": (1, False),
    "upscale_factor": (1, False), "downscale_factor": (1, False), "chunks": (1, False),
    "sections": (1, False), "step": (1, False), "kernel_size": (1, True), "stride": (1, True),
    "dilation": (1, True), "padding": (0, True), "output_padding": (0, True)}
# Operators whose kernels read N window values unchecked.
_EXACT_WINDOWS = {
    "aten::thnn_conv2d": 2, "aten::_slow_conv2d_forward": 2, "aten::_slow_conv2d_backward": 2,
    "aten::slow_conv3d": 3, "aten::slow_conv3d_forward": 3,
    "aten::mkldnn_reorder_conv2d_weight": 2, "aten::mkldnn_reorder_conv3d_weight": 3}
_NAMED_DIMENSIONS = re.compile(r"[A-Za-z]([123])d(?:_|$)")
_CALL_CHECKS = {}  # OpOverload -> what _check_call checks for it, or None


class _AtLeastOne:
    """The counts of a window list of an operator not named for its dimensions."""

    def __contains__(self, count):
        return count >= 1


_AT_LEAST_ONE = _AtLeastOne()


def _int_kind(t):
    """'int' or 'list' for a parameter of an int, int[] or optional type, else None."""
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    if isinstance(t, (torch.IntType, torch.SymIntType)):
        return "int"
    if isinstance(t, torch.ListType) and isinstance(t.getElementType(),
                                                    (torch.IntType, torch.SymIntType)):
        return "list"
    return None


def _mentions_tensor(t):
    if isinstance(t, torch.TensorType):
        return True
    if isinstance(t, (torch.OptionalType, torch.ListType)):
        return _mentions_tensor(t.getElementType())
    return False


def _call_checks(op):
    """What _check_call checks for calls of `op`, or None if nothing: made once."""
    try:
        return _CALL_CHECKS[op]
    except KeyError:
        pass
    schema = op._schema
    name, params = schema.name, schema.arguments
    tensors = any(_mentions_tensor(a.type) for a in params) or any(
        _mentions_tensor(r.type) for r in schema.returns)
    windows = "conv" in name or "pool" in name or any(
        a.name in ("kernel_size", "dilation", "groups") for a in params)
    exact = _EXACT_WINDOWS.get(name)
    found = [int(m.group(1)) for m in _NAMED_DIMENSIONS.finditer(name)]
    dims = exact or (found[-1] if found else 0)
    kernel_size = any(a.name == "kernel_size" for a in params)
    ints = []  # (index, name, kind, lowest or "mode", counts allowed or None, their text)
    for i, a in enumerate(params):
        kind = _int_kind(a.type)
        if kind is None:
            continue
        if a.name == "mode" and "embedding_bag" in name:
            ints.append((i, a.name, kind, "mode", None, None))
            continue
        rule = _INT_RANGES.get(a.name)
        if rule is None or (rule[1] and not windows):
            continue
        counts = text = None
        if kind == "list" and rule[1]:
            pool_stride = not exact and a.name == "stride" and kernel_size
            if not dims:
                counts, text = _AT_LEAST_ONE, "at least 1"
            elif exact:
                counts, text = {dims}, f"exactly {dims}"
            else:
                counts = {1, dims} | ({0} if pool_stride else set())
                text = ("none, 1 or " if pool_stride else "1 or ") + str(dims)
        ints.append((i, a.name, kind, rule[0], counts, text))
    trusting = name in _TRUSTING_KERNELS
    plan = None
    if not tensors or ints or trusting:
        plan = (tensors, ints, trusting, {a.name: i for i, a in enumerate(params)}, params)
    _CALL_CHECKS[op] = plan
    return plan


def _is_plain_int(v):
    return type(v) is int


def _dims_text(values):
    return "[" + ", ".join(str(v) for v in values) + "]"


def _last_offset(sizes, strides):
    """The highest element offset a view reaches (negative strides count
    nothing), or None if it has no elements or the offset passes 64 bits."""
    last = 0
    for size, stride in zip(sizes, strides):
        if size == 0:
            return None
        if stride > 0:
            last += (size - 1) * stride
    return last if last <= _INT64_MAX else None


def _check_call(op, target, args, kwargs, shape_of):
    """'' if a call of `op` passes the rule; otherwise the C++ loader's message.
    shape_of(node) is (sizes, strides) as recorded, or None."""
    plan = _call_checks(op)
    if plan is None:
        return ""
    tensors, ints, trusting, index_of, params = plan
    if not tensors:
        return (f"{target} computes on plain numbers, not tensors; graphs do not record such "
                "operators")
    given = [None] * len(params)
    present = [False] * len(params)
    for i, a in enumerate(args[:len(params)]):
        given[i], present[i] = a, True
    for k, v in kwargs.items():
        if k in index_of:
            given[index_of[k]], present[index_of[k]] = v, True
    for i, pname, kind, lowest, counts, text in ints:
        v = given[i]
        if kind == "int":
            if not _is_plain_int(v):
                continue  # none, or of a type the schema refuses (the C++ loader says so)
            values, shown = [v], str(v)
        else:
            if not isinstance(v, (list, tuple)) or not all(_is_plain_int(e) for e in v):
                continue
            values, shown = list(v), _dims_text(v)
        what = f"argument '{pname}' of {target} is {shown}"
        if lowest == "mode":
            if any(not 0 <= e <= 2 for e in values):
                return f"{what}; it must be 0 (sum), 1 (mean) or 2 (max)"
            continue
        if any(not lowest <= e <= _MAX_FACTOR for e in values):
            each = "each value must be" if kind == "list" else "it must be"
            return f"{what}; {each} between {lowest} and {_MAX_FACTOR}"
        if counts is not None and len(values) not in counts:
            n = len(values)
            return (f"argument '{pname}' of {target} has {n} value{'' if n == 1 else 's'}; "
                    f"{target} takes {text}")
    check = _TRUSTING_KERNELS.get(op._schema.name) if trusting else None
    if check is None:
        return ""
    try:
        return check(_TrustingCall(target, given, present, params, shape_of))
    except _Unrecorded as e:
        return str(e)


class _Unrecorded(Exception):
    """The file records no shape for an input a kernel's check needs (or the
    argument is of a type the schema refuses: the message is then empty, and
    the C++ loader names the type)."""


class _TrustingCall:
    """A call of one of the kernels Note [Kernels that trust their arguments]
    lists, as its check reads it."""

    def __init__(self, target, given, present, params, shape_of):
        self.op, self.given, self.present, self.params = target, given, present, params
        self.shape_of = shape_of

    def input(self, i):
        """(sizes, strides) of tensor argument i as recorded; raises _Unrecorded."""
        a = self.given[i]
        if isinstance(a, torch.fx.Node):
            recorded = self.shape_of(a)
            if recorded is not None:
                return recorded
        described = f"%{a.name}" if isinstance(a, torch.fx.Node) else "not a node"
        raise _Unrecorded(f"argument '{self.params[i].name}' of {self.op} is {described}, whose "
                          "shape the file does not record; the loader checks this operator's "
                          "arguments against it, as its kernel does not")

    def ref(self, i):
        return f"%{self.given[i].name}"

    def flag(self, i):
        v = self.given[i] if self.present[i] else self.params[i].default_value
        return v is True

    def ints(self, i):
        v = self.given[i] if self.present[i] else self.params[i].default_value
        v = list(v) if isinstance(v, (list, tuple)) else [] if v is None else [v]
        if not all(_is_plain_int(e) for e in v):
            raise _Unrecorded("")
        return v


def _check_reshape_alias(c):
    self_sizes, self_strides = c.input(0)
    sizes, strides = c.ints(1), c.ints(2)
    view = (f"{c.op} views {c.ref(0)} (sizes {_dims_text(self_sizes)}, strides "
            f"{_dims_text(self_strides)}) with sizes {_dims_text(sizes)} and strides "
            f"{_dims_text(strides)}")
    if len(sizes) != len(strides):
        return view + ": one stride per size is needed"
    numel = 1
    for size, stride in zip(sizes, strides):
        if size < 0 or stride < 0:
            return view + ": they cannot be negative"
        numel *= size
        if numel > _INT64_MAX:
            return view + ": more elements than 64 bits count"
    if numel == 0:
        return ""
    reach, within = _last_offset(sizes, strides), _last_offset(self_sizes, self_strides)
    if reach is None or within is None or reach > within:
        return view + ", which reach past its elements"
    return ""


def _check_mkldnn_convolution(c):
    weight, _ = c.input(1)
    if len(weight) < 3:
        return (f"argument 'weight' of {c.op} is {c.ref(1)}, of sizes {_dims_text(weight)}; a "
                "convolution's weight has at least 3 dimensions")
    spatial = len(weight) - 2
    for i in (3, 4, 5):  # padding, stride, dilation
        n = len(c.ints(i))
        if n != spatial:
            return (f"argument '{c.params[i].name}' of {c.op} has {n} value"
                    f"{'' if n == 1 else 's'}; its weight {c.ref(1)} (sizes {_dims_text(weight)}) "
                    f"has {spatial} spatial dimensions")
    return ""


def _check_mkldnn_transpose(c):
    rank = len(c.input(0)[0])
    for i in (1, 2):
        d = c.ints(i)[0]
        if not -rank <= d < rank:
            return (f"argument '{c.params[i].name}' of {c.op} is {d}; {c.ref(0)} has {rank} "
                    "dimensions")
    return ""


def _check_channel_shuffle(c):
    sizes, _ = c.input(0)
    groups = c.ints(1)[0]
    if len(sizes) < 2 or sizes[0] == 0 or sizes[1] == 0 or sizes[1] % groups:
        return (f"argument 'groups' of {c.op} is {groups}; its kernel needs {c.ref(0)} (sizes "
                f"{_dims_text(sizes)}) to have a batch and a positive multiple of it as channels")
    return ""


def _check_unfold_backward(c):
    """The gradient of unfold(input, dim, size, step) for an input of sizes
    input_sizes: the kernel writes where that unfold would have read."""
    grad, _ = c.input(0)
    input_sizes = c.ints(1)
    dim, size, step = c.ints(2)[0], c.ints(3)[0], c.ints(4)[0]
    rank = len(input_sizes)
    expected = None  # what unfold gives (a 0-dim input unfolds as [1])
    if -max(rank, 1) <= dim < max(rank, 1) and size >= 0:
        d = 0 if rank == 0 else (dim + rank) % rank
        expected = list(input_sizes) if rank else [1]
        length = expected[d]
        expected[d] = (length - size) // step + 1 if length >= size else -1
        expected.append(size)
        if rank == 0:
            del expected[0]
    if expected is None or expected != list(grad):
        return (f"argument 'grad_in' of {c.op} is {c.ref(0)} (sizes {_dims_text(grad)}), which is "
                f"not the gradient of unfold(dimension {dim}, size {size}, step {step}) of sizes "
                f"{_dims_text(input_sizes)}; its kernel writes where that unfold would have read")
    return ""


def _check_rescale_qkv(c):
    qkv, _ = c.input(0)
    bias, _ = c.input(1)
    if len(qkv) != 3 or qkv[0] == 0 or len(bias) != 1 or bias[0] != qkv[2]:
        return (f"arguments 'qkv' and 'qkv_bias' of {c.op} are {c.ref(0)} (sizes "
                f"{_dims_text(qkv)}) and {c.ref(1)} (sizes {_dims_text(bias)}); its kernel takes "
                "[batch of at least 1, tokens, 3 * embedding] and [3 * embedding]")
    return ""


def _check_embedding_bag(c):
    """(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
    per_sample_weights, include_last_offset, ...): 2-D indices (with offsets)
    abort; in mode max, no bag at all is a SIGSEGV."""
    indices, _ = c.input(1)
    offsets, _ = c.input(2)
    bags = (offsets[0] if offsets else 0) - (1 if c.flag(7) else 0)
    if len(indices) != 1 or len(offsets) != 1 or (c.ints(4)[0] == 2 and bags < 1):
        return (f"arguments 'indices' and 'offsets' of {c.op} are {c.ref(1)} (sizes "
                f"{_dims_text(indices)}) and {c.ref(2)} (sizes {_dims_text(offsets)}); its kernel "
                "takes 1-D indices and offsets, and in mode 2 (max) at least one bag")
    return ""


# Note [Kernels that trust their arguments]: each kernel's check.
_TRUSTING_KERNELS = {
    "aten::_reshape_alias": _check_reshape_alias,
    "aten::mkldnn_convolution": _check_mkldnn_convolution,
    "aten::_mkldnn_transpose": _check_mkldnn_transpose,
    "aten::_mkldnn_transpose_": _check_mkldnn_transpose,
    "aten::native_channel_shuffle": _check_channel_shuffle,
    "aten::unfold_backward": _check_unfold_backward,
    "aten::_transform_bias_rescale_qkv": _check_rescale_qkv,
    "aten::embedding_bag": _check_embedding_bag,
    "aten::_embedding_bag": _check_embedding_bag,
    "aten::_embedding_bag_forward_only": _check_embedding_bag,
}


def _plain_dims(dims, lowest):
    """Whether `dims` is a list of at most _MAX_DIMS ints in [lowest, int64 max]."""
    if type(dims) is not list or len(dims) > _MAX_DIMS:
        return False
    for d in dims:
        if type(d) is not int or not lowest <= d <= _INT64_MAX:
            return False
    return True


class _Lazy:
    """The byte offset of a table entry, computed only if an error needs it."""

    def __init__(self, compute):
        self._compute = compute
        self._value = None

    def __call__(self):
        if self._value is None:
            self._value = self._compute()
        return self._value


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _json_type(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _tensor_metadata(dtype, sizes, strides):
    return _TensorMetadata(shape=torch.Size(sizes), dtype=dtype, requires_grad=False,
                          stride=tuple(strides), memory_format=None, is_quantized=False,
                          qparams={})


def _set_attribute(root, path, kind, tensor, fail, made):
    """Registers `tensor` at dotted `path` below `root`, making submodules on the way.

    `made` maps id(tensor) to the Parameter made for it, so that attributes
    sharing a tensor share one Parameter, as tied weights in torch.nn do."""
    *parents, leaf = path.split(".")
    owner = root
    for i, part in enumerate(parents):
        child = owner._modules.get(part)
        if child is None:
            if hasattr(owner, part):
                fail(f"'{'.'.join(parents[:i + 1])}' is already taken by "
                     + ("another attribute" if part in owner._parameters or part in owner._buffers
                        else "torch.nn.Module") + "; Python cannot hold this attribute")
            child = torch.nn.Module()
            owner.add_module(part, child)
        owner = child
    if hasattr(owner, leaf):
        fail(f"'{leaf}' is already taken by "
             + ("a submodule" if leaf in owner._modules else "torch.nn.Module")
             + "; Python cannot hold this attribute")
    if kind == "parameter":
        param = None
        if tensor is not None:
            param = made.get(id(tensor))
            if param is None:
                param = made[id(tensor)] = torch.nn.Parameter(tensor, requires_grad=False)
        owner.register_parameter(leaf, param)
    else:
        owner.register_buffer(leaf, tensor)


# Short dtype names, as the C++ printer writes them (src/graph/meta.cpp), for
# messages that read like the C++ loader's.
_SHORT_DTYPE_NAMES = {
    "float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64",
    "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "b8",
    "complex32": "c32", "complex64": "c64", "complex128": "c128"}


def _describe(t):
    """f32[16, 8]; the device only when it is known and neither the CPU nor meta."""
    name = str(t.dtype).replace("torch.", "")
    text = f"{_SHORT_DTYPE_NAMES.get(name, name)}[{', '.join(str(s) for s in t.shape)}]"
    device = t.device
    return text if device is None or device.type in ("cpu", "meta") else f"{text}@{device}"


# Note [Inputs of the traced shapes]
# A graph holds the shapes its trace saw: a view to [2, -1] stays a view to
# [2, -1] whatever the input. Called on inputs of other shapes, such a graph
# computes something else without a word (a [5, 3, 4] input viewed as
# [2, 30]). The C++ Interpreter refuses inputs whose dtype, shape or device
# differ from the placeholders' (InputError); the Python modules torchcap
# makes (traced, exported, loaded) refuse them the same way. A placeholder
# recorded on the meta device takes an input on any device (a model traced
# on meta tensors, then bound to weights), and a meta input goes anywhere.
# What is no tensor at all (None, a NumPy array, a Python number) is refused
# too: an operator would fail on it with an error of its own, or compute
# with a number in place of the tensor. Messages name each input as the C++
# Interpreter does, "input 1 (ph_1)", and for a traced module where the
# call passed it, "input 1 (ph_1, kwargs['scale'])". The check runs on every
# call: the usual case is one pass over the inputs, building nothing; the
# message is made only when something is wrong.
class _InputMeta(collections.namedtuple("_InputMeta", "dtype shape device stride written")):
    """What a graph input was traced with; device None: not recorded (files).
    stride: the traced strides when they are dense, else None; written:
    whether the graph writes the input (Note [Inputs in the traced layout]
    in src/runtime/interpreter.cpp)."""

    @staticmethod
    def of(t, written=False):
        return _InputMeta(t.dtype, tuple(t.shape), t.device,
                          t.stride() if t.layout == torch.strided and _dense(t) else None, written)


_InputMeta.__new__.__defaults__ = (None, False)

# A tensor input whose dtype and shape the file does not record.
_ANY_TENSOR = _InputMeta(None, None, None)


def _check_inputs(expected, leaves, labels=None, module=None):
    """InputError unless each of `leaves` is a tensor that matches its
    `expected` _InputMeta (None: not a tensor input; _ANY_TENSOR: any tensor).
    labels(module): each tensor input's name, for the message.
    Note [Inputs of the traced shapes].

    Returns None, or `leaves` as a list with each input of other strides than
    traced copied into the traced layout (Note [Inputs in the traced layout]
    in src/runtime/interpreter.cpp); an input the graph writes must come in
    that layout."""
    relaid = None
    for i, (want, got) in enumerate(zip(expected, leaves)):
        if want is None:
            continue
        # _fits_input, inlined: this runs on every call.
        if isinstance(got, torch.Tensor):
            if want.dtype is None:
                continue
            if got.dtype == want.dtype and got.shape == want.shape:
                device = want.device
                if device is None or got.device == device or device.type == "meta" or got.is_meta:
                    stride = want.stride
                    if stride is None or got.stride() == stride or _has_layout(got, stride):
                        continue
                    if want.written:
                        _refuse_layout(expected, i, got, labels(module) if labels else None)
                    if relaid is None:
                        relaid = list(leaves)
                    relaid[i] = torch.empty_strided(got.shape, stride, dtype=got.dtype,
                                                    device=got.device).copy_(got)
                    continue
        _refuse_inputs(expected, leaves, labels(module) if labels is not None else None)
    return relaid


def _has_layout(t, stride):
    """Whether `t` has strides `stride` where they matter (dimensions of size > 1)."""
    return t.is_meta or all(a == b for a, b, s in zip(t.stride(), stride, t.shape) if s > 1)


def _refuse_layout(expected, index, got, labels):
    k = sum(1 for want in expected[:index] if want is not None)
    where = f"input {k}" + (f" ({labels[k]})" if labels is not None and k < len(labels) else "")
    raise InputError(f"{where} is written by the graph and must have the strides it was traced "
                     f"with, {list(expected[index].stride)}; got {list(got.stride())}. Pass it in "
                     f"that layout (contiguous())")


def _written_placeholders(graph):
    """The names of the placeholders a torch.fx graph of aten operators writes
    in place, directly or through views (its signature's input writes are
    the caller's to add)."""
    written, root = set(), {}
    for node in graph.nodes:
        if node.op == "placeholder":
            root[node] = node
            continue
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        schema = target._schema
        given = dict(zip((a.name for a in schema.arguments), node.args))
        given.update(node.kwargs)
        for argument in schema.arguments:
            info = argument.alias_info
            value = given.get(argument.name)
            if info is not None and info.is_write and isinstance(value, torch.fx.Node) and \
                    root.get(value) is not None:
                written.add(root[value].name)
        # The result's memory is an argument's (a view, or a write returned).
        if schema.returns and schema.returns[0].alias_info is not None:
            sets = schema.returns[0].alias_info.before_set
            for argument in schema.arguments:
                value = given.get(argument.name)
                if argument.alias_info is not None and argument.alias_info.before_set == sets and \
                        isinstance(value, torch.fx.Node) and root.get(value) is not None:
                    root[node] = root[value]
                    break
    return written


def _fits_input(want, got):
    """Whether `got` is a tensor as `want`, an _InputMeta, describes."""
    if not isinstance(got, torch.Tensor):
        return False
    if want.dtype is None:
        return True
    device = want.device
    return (got.dtype == want.dtype and got.shape == want.shape and
            (device is None or got.device == device or device.type == "meta" or got.is_meta))


def _refuse_inputs(expected, leaves, labels):
    """The InputError of _check_inputs, naming every input that does not fit."""
    problems, not_tensors, k = [], False, -1
    for want, got in zip(expected, leaves):
        if want is None:
            continue
        k += 1  # the tensor inputs are numbered as the graph's placeholders
        where = f"input {k}" + (f" ({labels[k]})" if labels is not None and k < len(labels)
                                else "")
        wanted = "" if want.dtype is None else " " + _describe(want)
        if not isinstance(got, torch.Tensor):
            not_tensors = True
            problems.append(f"\n  {where}: expected a tensor{wanted}, got {_describe_value(got)}")
        elif not _fits_input(want, got):
            problems.append(f"\n  {where}: expected{wanted}, got {_describe(got)}")
    advice = ("\nA graph runs on tensors of the dtypes and shapes it was traced with; trace "
              "again for others")
    if not_tensors:
        advice += " (torch.as_tensor makes a tensor of a number or a NumPy array)"
    raise InputError("inputs do not match the graph:" + "".join(problems) + advice)


def _describe_value(v):
    """None, "a float (2.0)", "a numpy.ndarray": what was given for a tensor."""
    if v is None:
        return "None"
    kind = type(v)
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")
    article = "an" if name[0] in "aeiouAEIOU" else "a"
    if kind in (bool, int, float, complex):
        return f"{article} {name} ({v!r})"
    return f"{article} {name}"


def _placeholder_names(gm):
    """The names of a module's placeholders, in order (labels for _check_inputs)."""
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def _file_input_meta(meta, written):
    """The _InputMeta of a placeholder from its recorded metadata (no device)."""
    stride = tuple(meta.stride)
    expected = 1
    for st, size in sorted((st, s) for s, st in zip(meta.shape, stride) if s != 1):
        if st != expected:
            stride = None
            break
        expected *= size
    return _InputMeta(meta.dtype, tuple(meta.shape), None, stride, written)


def _check_loaded_inputs(gm, args):
    """Forward pre-hook of a loaded module: Note [Inputs of the traced shapes].
    Arguments of another structure are left to forward, which fails on them.
    Returns the arguments with inputs in the traced layout when some were not."""
    codegen = gm.graph._codegen
    if not isinstance(codegen, TorchcapCodeGen):  # a graph set by the user since
        return None
    try:
        leaves = codegen.process_inputs(*args)
    except (IndexError, KeyError, TypeError):
        return None
    relaid = _check_inputs(gm._torchcap_inputs, leaves, _placeholder_names, gm)
    if relaid is None:
        return None
    value = _spec_unflatten(codegen.in_spec, list(relaid))
    return value if codegen.in_spec.kind == "tuple" else (value,)


def _dense(t):
    """Whether `t`'s strides lay its elements out without gaps or overlap."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _in_recorded_layout(w, recorded):
    """`w`, copied into `recorded`'s strides when they differ where it matters
    (as load_state_dict copies into a parameter); the graph then sees the
    layout it was traced with."""
    if all(s <= 1 or a == b for s, a, b in zip(w.shape, w.stride(), recorded.stride())):
        return w
    if not _dense(recorded):
        return w
    with torch.no_grad():
        out = torch.empty_strided(recorded.shape, recorded.stride(), dtype=w.dtype,
                                  device=w.device)
        out.copy_(w)
    return out


def _bind(attributes, weights, strict):
    """(name, kind, tensor) of each attribute with `weights` bound, by name.

    The rules of the C++ GraphModule::bind_weights: every weightless (meta)
    attribute needs a weight; a stored one keeps its tensor unless `weights`
    names it; attributes that share a tensor take the weight of the first of
    their names that `weights` has; each weight must hold values, be dense
    and have its attribute's dtype and shape. Raises WeightError listing
    every problem.
    """
    if not hasattr(weights, "items"):
        raise WeightError(f"weights must be a dict of tensors by name (a state dict), not a "
                          f"{type(weights).__name__}")
    groups = {}  # id(tensor) -> attribute indices; an undefined attribute stands alone
    for i, (_, _, tensor) in enumerate(attributes):
        groups.setdefault(id(tensor) if tensor is not None else ("none", i), []).append(i)
    missing, problems, bound = [], [], {}  # missing weights are listed first
    for members in groups.values():
        name0, kind, current = attributes[members[0]]
        given = next(((attributes[i][0], weights[attributes[i][0]]) for i in members
                      if attributes[i][0] in weights), None)
        if given is None:
            if current is not None and current.is_meta:
                missing.append(f"missing: {kind} '{name0}' ({_describe(current)})")
            continue
        name, w = given
        where = f"weight '{name}' ({kind}): "
        if current is None:
            problems.append(where + "the module's attribute is undefined (None), so it takes "
                                    "no tensor")
        elif not isinstance(w, torch.Tensor):
            problems.append(where + f"expected {_describe(current)}, got a "
                                    f"{type(w).__name__}")
        elif w.is_meta:
            problems.append(where + "the tensor is on the meta device: it has no values to bind")
        elif w.layout != torch.strided:
            # The graph's operators, and the copy into the recorded layout,
            # take dense tensors only.
            layout = str(w.layout).replace("torch.", "").lstrip("_")
            problems.append(where + f"expected a dense tensor {_describe(current)}, got a "
                                    f"{layout} tensor; pass the dense one (to_dense())")
        elif w.dtype != current.dtype or w.shape != current.shape:
            problems.append(where + f"expected {_describe(current)}, got {_describe(w)}")
        else:
            w = _in_recorded_layout(w.detach(), current)
            for i in members:
                bound[i] = w
    problems = missing + problems
    if strict:
        names = {a[0] for a in attributes}
        for name in sorted(weights):
            if name not in names:
                problems.append(f"extra: weight '{name}' is not an attribute of the module "
                                f"(strict=False ignores such weights)")
    if problems:
        shown = problems[:20]
        more = [f"... and {len(problems) - 20} more"] if len(problems) > 20 else []
        raise WeightError("the weights do not fit the module's attributes:\n  "
                          + "\n  ".join(shown + more))
    return [(name, kind, bound.get(i, tensor)) for i, (name, kind, tensor) in
            enumerate(attributes)]


def _unbound(module):
    """'parameter 'fc.weight' (f32[4, 8])' for each attribute of a loaded module
    that holds no values."""
    out = []
    for name, kind in getattr(module, "_torchcap_attributes", ()):
        owner_path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        t = getattr(owner, leaf, None)
        if isinstance(t, torch.Tensor) and t.is_meta:
            out.append(f"{kind} '{name}' ({_describe(t)})")
    return out


def _refuse_unbound_weights(module, args):
    """A forward pre-hook of modules loaded with weightless attributes
    (Note [Runs with unbound weights] in src/runtime/interpreter.cpp): a call
    on real inputs is refused, naming them, instead of failing inside an
    operator or returning meta tensors. Calls on meta inputs only compute
    shapes and go ahead. Once every attribute holds values (given to it by
    to_empty and load_state_dict, say) the hook removes itself."""
    unbound = _unbound(module)
    if not unbound:
        for key, hook in list(module._forward_pre_hooks.items()):
            if hook is _refuse_unbound_weights:
                del module._forward_pre_hooks[key]
        return None
    leaves = _pytree.tree_flatten(args)[0]
    tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
    if tensors and all(t.is_meta for t in tensors):
        return None
    shown = ", ".join(unbound[:5]) + (f" and {len(unbound) - 5} more" if len(unbound) > 5 else "")
    raise WeightError(f"the module's weights are not bound: {len(unbound)} attribute(s) hold no "
                      f"values (the module was traced on the meta device or loaded from a "
                      f"weightless file): {shown}. Bind them first: torchcap.load(path, "
                      f"weights=state_dict)")


def _scan_json(text):
    """Offsets of the top-level values and of the elements of top-level arrays.

    A flat pass that mirrors the C++ reader's scan; only used for messages.
    """
    text = bytes(text)
    values, elements = {}, {}
    depth, in_string, escaped, in_key, expect_key, want_value = 0, False, False, False, False, False
    key, array, want_element = bytearray(), None, False
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
                if in_key:
                    key.append(c)
            elif c == 0x5C:  # backslash
                escaped = True
                if in_key:
                    key.append(c)
            elif c == 0x22:  # quote
                in_string = in_key = False
            elif in_key:
                key.append(c)
            continue
        if c in b" \t\r\n":
            continue
        if want_element:
            want_element = False
            if c != 0x5D:
                array.append(i)
        if want_value:
            want_value = False
            k = key.decode("utf-8", "replace")
            values[k] = i
            if c == 0x5B:
                array = elements[k] = []
                want_element = True
        if c == 0x22:
            in_string = True
            if depth == 1 and expect_key:
                in_key, expect_key = True, False
                key = bytearray()
        elif c in b"{[":
            depth += 1
            if depth == 1:
                expect_key = c == 0x7B
        elif c in b"}]":
            if array is not None and depth == 2:
                array = None
            depth -= 1
        elif c == 0x2C:
            if depth == 1:
                expect_key = True
            if array is not None and depth == 2:
                want_element = True
        elif c == 0x3A and depth == 1:
            want_value = True
    return values, elements


_NUMBER = re.compile(rb'"(?:[^"\\]|\\.)*"|(-?[0-9][0-9.eE+-]*)')
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def _first_big_integer(text):
    """(offset, literal) of the first integer literal outside int64's range; (0, None) if none."""
    for m in _NUMBER.finditer(text):
        token = m.group(1)
        if token is not None and not any(c in token for c in b".eE"):
            if not -(1 << 63) <= int(token) <= _INT64_MAX:
                return m.start(1), token.decode()
    return 0, None


def load(path, verify_checksums=True, weights=None, strict=True):
    """Reads a `.tcg` file written by torchcap::save into a torch.fx.GraphModule.

    Parameters become nn.Parameters (requires_grad=False), buffers and
    constants become buffers, at their dotted paths; all are views of the
    file's bytes. forward() takes and returns the nested structures the
    program was captured with. Raises ValueError naming the first problem in
    a damaged file, and OSError if the file cannot be opened.

    verify_checksums: check the CRC-32s of a version 1.1 file (header, JSON,
    each tensor's bytes), which reads the whole file once; off, damage to
    tensor bytes goes unnoticed.

    weights: tensors for the module's attributes by name, such as a model's
    state_dict(). A weightless file (saved from a model on the meta device)
    needs one for each of its weightless tensors; without weights it loads
    with meta tensors, and calling the module on real inputs raises
    torchcap.WeightError naming them. Weights for attributes the file stores
    replace them. Each weight must be a dense tensor of its attribute's dtype
    and shape; it is used as given (not copied) unless its strides differ from
    the recorded ones. Problems raise torchcap.WeightError listing every
    missing, extra and mismatched weight.
    strict: refuse weights that name no attribute of the module (a state
    dict's num_batches_tracked, say); False ignores them.
    """
    path = os.fspath(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file")
    with _cyclic_gc_paused():  # Note [No collections]
        return _load(path, st, weights, strict, verify_checksums)


def _load(path, st, weights, strict, verify_checksums):
    try:
        graph = None
        with open(path, "rb") as f:
            if st.st_size < _HEADER_SIZE:
                buf = f.read()  # an empty file cannot be mapped
            else:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
                # Note [The graph read in C++]: with the compiled part, the
                # C++ reader reads the nodes (in one pass, checking what the
                # C++ loader checks, which is more than this module does) and
                # gives them as tuples; Python's json then reads only the rest
                # of the document. At anything unusual, and at any problem,
                # the file is read again here alone, which says what is wrong
                # in its own words. The C++ reader reads the file opened
                # here, whatever may have replaced it at `path` since.
                if _read_graph_in_cpp is not None:
                    graph = _read_graph_in_cpp(f"/proc/self/fd/{f.fileno()}")
        if graph is not None:
            try:
                return _Reader(path, buf, verify_checksums, graph).read(weights, strict)
            except Exception:  # noqa: BLE001 - read again, the careful way
                pass
        return _Reader(path, buf, verify_checksums).read(weights, strict)
    except RecursionError:
        raise ValueError(f"{path}: the JSON nests too deeply") from None


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Note [No collections]: Python's cyclic garbage collector runs every few
    hundred new objects and, now and then, walks every live object. Loading,
    tracing and making a torch.fx graph make many objects that all stay
    alive, so those walks free nothing: they took a large share of
    torchcap.load's time on big graphs, and of torchcap.trace's on small
    operators. These run without them.

    The collector is one switch for the whole process, and pauses overlap
    when threads trace or load at once. Each pause saving and restoring the
    switch on its own let them undo one another: a pause that began while
    another held the collector off saw it off, and left it off for good
    once the other had switched it back on in between. So pauses are
    counted, under a lock: the first switches the collector off (if it was
    on) and the last switches it back on; none ends while another runs."""
    global _gc_pauses, _gc_was_enabled
    with _GC_PAUSES_LOCK:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _GC_PAUSES_LOCK:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


# The pauses of _cyclic_gc_paused under way, in every thread, and whether the
# collector was on when the first of them began.
_GC_PAUSES_LOCK = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False
