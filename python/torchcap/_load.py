"""Reading `.tcg` files (docs/FORMAT.md) into torch.fx.GraphModules.

The reader checks what it relies on, in file order, and raises FormatError
(a torchcap.Error and a ValueError) naming the first problem and, where it
has one, its byte offset:

    model.tcg: byte 8: format version 2.0 is not supported; ...

It checks what the C++ loader (torchcap::load) checks, with its messages:
the arguments some kernels would not survive (a convolution's groups of 0:
Note [Integers kernels divide by]), and the file's shapes, each operator run
on meta tensors of its inputs' recorded shapes (_file_shapes.py, Note
[Checking a file's shapes]). Of operator schemas it checks keyword names; a
call whose other arguments do not fit its schema fails the shape check, with
LibTorch's message.

With the compiled part (torchcap._C), torchcap.load reads a file with the C++
loader instead, and makes its module as a trace's is made (Note [One bridge to
torch.fx]); the reader here is what runs without it, and the reference the
C++ loader is compared with (load_in_python): both make the same GraphModule,
node for node, and the same messages for damaged files.

Tensors are not copied: the file is mapped copy-on-write (mmap.ACCESS_COPY)
and each tensor is a view of the mapping, which stays open as long as a tensor
uses it. Writing to a tensor changes this process's copy of the page only.
"""

import math
import mmap
import operator
import os
import stat
import zlib
from typing import Mapping, Optional, Union

import torch
import torch.fx
from torch.fx.passes.shape_prop import TensorMetadata as _TensorMetadata

from torchcap._bridge import _to_fx_of_file
from torchcap._errors import FormatError, WeightError
from torchcap._file_checks import _check_call
from torchcap._file_shapes import ShapeChecker as _ShapeChecker
from torchcap._operators import memory_effects, resolve_operator
from torchcap._format_tables import TABLES as _TABLES
from torchcap._tcg_file import (_ALIGNMENT, _DTYPES, _HEADER_SIZE, _INT64_MAX, _ITEM_SIZES,
                                _LAYOUTS, _MEMORY_FORMATS, _NODE_NAME, _RESERVED_NODE_NAMES,
                                _STORABLE_DTYPES,
                                _is_int, _json_type, _Lazy, _TcgFile)
from torchcap._codegen import TorchcapCodeGen, _KeywordCodeGen, _Spec, _set_output_val
from torchcap._runtime import (_ANY_TENSOR, _check_loaded_inputs, _cyclic_gc_paused,
                               _file_input_meta, _refuse_unbound_weights,
                               _set_graph_generating_code_later)
from torchcap._weights import _bind

try:
    from torchcap import _C
except ImportError:  # the package works as a loader without its compiled part
    _C = None


class _Reader(_TcgFile):
    """Reads a file's document, part by part in file order, into a
    torch.fx.GraphModule (read)."""

    def __init__(self, path, buf, verify_checksums=True):
        super().__init__(path, buf, verify_checksums)
        self.module_stacks = []
        self.recorded = {}  # node -> its recorded value (_file_shapes.py)
        self.targets = {}  # operator node -> its target as the file names it
        self.index = {}  # node -> its index in 'nodes'

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
        op, why = resolve_operator(target)
        if op is None:
            self.fail(offset, f"{label}{why}")
        return op

    def check_kwargs(self, op, target, kwargs, offset, label):
        # Keyword names end up in generated source: only the schema's own names
        # may get there (the C++ loader checks the whole schema).
        names = {a.name for a in op._schema.arguments}
        for k in kwargs:
            if k not in names:
                self.fail(offset, f"{label}{target} has no argument named '{k}'")

    def check_no_number_for_tensor(self, op, args, kwargs, offset, label):
        """Note [Numbers for tensors in files] (src/serialize/format.h): a
        number given for a Tensor parameter, in a file older than 1.6."""
        for i, param in enumerate(op._schema.arguments):
            given = args[i] if i < len(args) else kwargs.get(param.name)
            t = param.type
            if isinstance(t, torch.OptionalType):
                t = t.getElementType()
            if isinstance(t, torch.TensorType) and isinstance(given, (bool, int, float)):
                since = _TABLES["numbers_for_tensors_since"]
                self.fail(offset, f"{label}numbers given for Tensor parameters came in version "
                                  f"1.{since}; this file is version 1.{self.minor}")

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
            metas, recorded = [], []
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
                device = self.device(self.member(t, "device", offset, tl), offset,
                                     tl[:-2] + ".device: ")
                metas.append(_tensor_metadata(dtype, sizes, strides))
                recorded.append((dtype, sizes, strides, str(device)))
            self.recorded[node] = (kind, recorded)
            # As a trace's module has them (FxBuilder in src/python/module.cpp).
            if kind == "tensor":
                node.meta["val"] = node.meta["tensor_meta"] = metas[0]
            elif kind in ("tuple", "list"):
                v = tuple(metas) if kind == "tuple" else metas
                node.meta["val"] = node.meta["tensor_meta"] = v
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
                # As src/graph/stack_trace.cpp writes it for a trace's module.
                text = f'  File "{file}", line {line}, in {function or "?"}\n'
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
        nodes = self.expect(self.top("nodes"), "array", self.json_offset, "'nodes': ")
        graph = torch.fx.Graph()
        env, output, seen_other = {}, None, False
        for i, entry in enumerate(nodes):
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
                if self.minor < _TABLES["numbers_for_tensors_since"]:
                    self.check_no_number_for_tensor(fn, args, kwargs, t, label)
                node = graph.create_node("call_function", fn, tuple(args), kwargs, name=name)
                self.targets[node] = target
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
            self.index[node] = (i, name)
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

    def call(self, in_spec):
        """(positional argument names, keyword argument names) from the
        optional `call` (Note [Calling convention] in
        src/graph/call_convention.cpp), checked against the input spec as
        CallConvention::mismatch checks it."""
        if "call" not in self.doc:
            return [], []
        label = "'call': "
        at = lambda: self.top_offset("call")  # noqa: E731
        call = self.expect(self.doc["call"], "object", at, label)
        self.check_keys(call, "call", at, label)
        names = self.expect(self.member(call, "names", at, label), "array", at, label + "names: ")
        keywords = self.member(call, "keywords", at, label)
        if not isinstance(keywords, bool):
            self.fail(at, f"{label}keywords: expected a boolean, got {_json_type(keywords)}")
        if in_spec.kind != "tuple":
            self.fail(at, f"{label}the input spec is not a tuple of arguments")
        top = in_spec.children
        keyword_names = []
        if keywords:
            if not top or top[-1].kind != "dict":
                self.fail(at, f"{label}the call passes keyword arguments but the input spec "
                              f"does not end with a dict of them")
            keyword_names = list(top[-1].keys)
            if not all(isinstance(k, str) for k in keyword_names):
                self.fail(at, f"{label}keyword argument names must be strings")
        if names:
            positional = len(top) - (1 if keywords else 0)
            if len(names) != positional:
                self.fail(at, f"{label}{len(names)} argument name(s) for the {positional} "
                              f"positional argument(s) of the input spec")
            for i, n in enumerate(names):
                if not isinstance(n, str) or not n.isidentifier() or not n.isascii():
                    self.fail(at, f"{label}names[{i}]: argument name {n!r} is not an identifier")
            if len(set(names)) != len(names):
                self.fail(at, f"{label}an argument name appears twice")
        return names, keyword_names

    # --- The module -----------------------------------------------------------

    def check_shapes(self, results, num_user, mutations):
        """Note [Checking a file's shapes] in src/serialize/shapes.cpp, as the
        C++ loader checks them (_file_shapes.py)."""
        tensors = {name: t for name, _, t in self.attributes}

        def problem(node, what):
            i, name = self.index[node]
            self.fail(self.element_offset("nodes", i), f"node %{name} (nodes[{i}]): {what}")

        _ShapeChecker(self.graph, self.recorded, self.targets, tensors.get, problem).run(
            mutations, results, num_user, self.env.get)

    def read(self, weights=None, strict=True, check_shapes=True):
        self.read_header()
        self.read_json()
        if "symbols" in self.doc:
            # Note [Dynamic graphs in files] in src/serialize/format.h
            self.fail(self.top_offset("symbols"),
                      "a dynamic graph (its 'symbols', format 1.4) loads with torchcap's compiled "
                      "part, torchcap._C; this Python reader reads graphs of fixed sizes")
        self.read_tensors()
        self.read_attributes()
        self.read_module_stacks()
        self.read_nodes()
        in_spec = self.spec(self.top("in_spec"), lambda: self.top_offset("in_spec"),
                            "'in_spec': ")
        out_spec = self.spec(self.top("out_spec"), lambda: self.top_offset("out_spec"),
                             "'out_spec': ")
        mutations = self.signature()
        argument_names, keywords = self.call(in_spec)
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
        _set_output_val(self.graph, mutations)
        names = {a[0] for a in self.attributes}
        for node in self.graph.nodes:
            if node.op == "get_attr" and node.target not in names:
                self.fail(self.json_offset, f"get_attr %{node.name} reads attribute "
                                            f"'{node.target}', which the file does not have")
        if check_shapes:
            self.check_shapes(results, num_user, mutations)

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
        codegen = TorchcapCodeGen(
            in_spec, out_spec, mutations,
            {name: node.name for name, node in self.env.items() if node.op == "placeholder"},
            argument_names)
        self.graph.set_codegen(_KeywordCodeGen(codegen, keywords) if keywords else codegen)
        _set_graph_generating_code_later(gm, self.graph)
        gm._torchcap_attributes = [(name, kind) for name, kind, _ in attributes]
        if any(t is not None and t.is_meta for _, _, t in attributes):
            gm.register_forward_pre_hook(_refuse_unbound_weights)
        written = _written_placeholders(self.graph) | {
            t for kind, t in mutations if kind == "input_mutation"}
        gm._torchcap_inputs = [
            _file_input_meta(node.meta["tensor_meta"].dtype, node.meta["tensor_meta"].shape,
                             node.meta["tensor_meta"].stride, node.name in written)
            if isinstance(node.meta.get("tensor_meta"), _TensorMetadata) else _ANY_TENSOR
            for node in self.graph.nodes if node.op == "placeholder"]
        gm._torchcap_keywords = keywords
        gm.register_forward_pre_hook(_check_loaded_inputs)
        return gm


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
        writes, aliased = memory_effects(target)
        if not writes and aliased is None:
            continue
        given = dict(zip((a.name for a in target._schema.arguments), node.args))
        given.update(node.kwargs)
        for name in writes:
            value = given.get(name)
            if isinstance(value, torch.fx.Node) and root.get(value) is not None:
                written.add(root[value].name)
        value = given.get(aliased)
        if isinstance(value, torch.fx.Node) and root.get(value) is not None:
            root[node] = root[value]
    return written


def load(path: Union[str, "os.PathLike[str]"], verify_checksums: bool = True,
         weights: Optional[Mapping[str, torch.Tensor]] = None,
         strict: bool = True, check_shapes: bool = True) -> torch.fx.GraphModule:
    """Reads a `.tcg` file written by torchcap::save into a torch.fx.GraphModule.

    path: the file, a str or a path-like object.

    Parameters become nn.Parameters (requires_grad=False), buffers and
    constants become buffers, at their dotted paths; all are views of the
    file's bytes. forward() takes and returns the nested structures the
    program was captured with. Raises torchcap.FormatError (also a
    ValueError) naming the first problem in a damaged file, with its byte
    offset, as the torchcap command does; OSError if the file cannot be
    opened.

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
    check_shapes: run each operator on meta tensors of its inputs' recorded
    shapes and refuse a file whose operators fail there or give other dtypes
    or sizes than it records (docs/FORMAT.md, "Shapes": about a microsecond
    per node). Off, such a file loads and its first call fails inside an
    operator; the checks of the arguments that kernels would not survive
    run either way.
    """
    path = os.fspath(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path}: not a regular file")
    with _cyclic_gc_paused():  # Note [No collections] in _runtime.py
        if _C is None:
            return _read_in_python(path, st, weights, strict, verify_checksums, check_shapes)
        return _load_in_cpp(path, st, weights, strict, verify_checksums, check_shapes)


def _load_in_cpp(path, st, weights, strict, verify_checksums, check_shapes):
    """Note [One bridge to torch.fx]: with the compiled part, a file is read
    once, by the C++ loader, which checks more than the reader here (operator
    schemas and shapes too), and its module becomes a torch.fx module as a
    trace's does (_to_fx in _bridge.py): the graph made when first needed,
    from the C++ graph, the attributes attached when first needed, pickled
    from the C++ graph. What is Python's alone is done here: binding weights
    given as Python objects (_bind, whose messages name them), parameters
    made nn.Parameters, and the check of each call's inputs against the
    placeholders' recorded metadata."""
    try:
        module = _C.load(path, verify_checksums, check_shapes)
    except FormatError as e:
        if ": call_function: no operator " not in str(e):
            raise
        # Operators are found through torch.ops here, which knows those
        # registered from Python and says how to register the others in
        # Python's terms: its message, if it refuses the file too.
        _read_in_python(path, st, weights, strict, verify_checksums, check_shapes)
        raise
    attributes = module.attributes()
    if _python_cannot_hold(name for name, _, _ in attributes):
        # The reader here refuses such a file, and says where in it the
        # attribute is, which the C++ module no longer knows.
        return _read_in_python(path, st, weights, strict, verify_checksums, check_shapes)
    if weights is not None:
        try:
            attributes = _bind(attributes, weights, strict)
        except WeightError as e:
            raise WeightError(f"{path}: {e}") from None
    made = {}  # id(tensor) -> its Parameter: tied parameters stay one Parameter
    module.set_loaded_attributes([(name, _as_parameter(t, made) if kind == "parameter" else t)
                                  for name, kind, t in attributes])
    return _to_fx_of_file(module)


def _python_cannot_hold(names):
    """Whether a torch.nn module cannot hold attributes of these dotted names
    as _set_attribute registers them: a name one of torch.nn.Module's own, or
    a name both a submodule on some paths and an attribute on others."""
    taken = frozenset(dir(torch.nn.Module()))
    tree = {}  # submodule name -> its tree; attribute name -> None
    for name in names:
        *parents, leaf = name.split(".")
        owner = tree
        for part in parents:
            child = owner.get(part, ())
            if child == ():
                if part in taken:
                    return True
                child = owner[part] = {}
            elif child is None:
                return True
            owner = child
        if leaf in owner or leaf in taken:
            return True
        owner[leaf] = None
    return False


def _as_parameter(t, made):
    """`t` as a torch.nn.Parameter that does not require grad (a loaded
    graph is for running), one per tensor."""
    if t is None:
        return None
    p = made.get(id(t))
    if p is None:
        p = made[id(t)] = torch.nn.Parameter(t, requires_grad=False)
    return p


def _read_in_python(path, st, weights=None, strict=True, verify_checksums=True,
                    check_shapes=True):
    """The module of the file at `path` as the reader here makes it: without
    the compiled part, and as the reference the C++ loader is compared with
    (tests, fuzz/compare_loaders.py)."""
    try:
        with open(path, "rb") as f:
            if st.st_size < _HEADER_SIZE:
                buf = f.read()  # an empty file cannot be mapped
            else:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return _Reader(path, buf, verify_checksums).read(weights, strict, check_shapes)
    except RecursionError:
        raise FormatError(f"{path}: the JSON nests too deeply") from None


def load_in_python(path, verify_checksums=True, weights=None, strict=True, check_shapes=True):
    """torchcap.load, read by the Python reader alone (for tests, and for
    comparing the two loaders)."""
    path = os.fspath(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path}: not a regular file")
    with _cyclic_gc_paused():
        return _read_in_python(path, st, weights, strict, verify_checksums, check_shapes)
