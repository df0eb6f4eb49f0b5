"""A `.tcg` file as the Python reader sees it (docs/FORMAT.md): the format's
tables, the header and the JSON section checked, and the checks of one field
that name what is wrong and the byte where it is ("model.tcg: byte 8: ...").
_Reader in _load.py reads the document's parts with them.
"""

import json
import math
import re
import struct
import zlib

import torch

from torchcap._errors import FormatError
from torchcap._format_tables import TABLES as _TABLES

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


_NUMBER = re.compile(rb'"(?:[^"\\]|\\.)*"|(-?[0-9][0-9.eE+-]*)')
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


class _TcgFile:
    """The bytes of one file (`buf`, read as mapped) and where in them each
    section is, once read_header has run; every check fails with FormatError
    naming the file and the byte."""

    def __init__(self, path, buf, verify_checksums=True):
        self.path = path
        self.buf = buf
        self.verify = verify_checksums
        self.checksums = False
        self.strict = True
        self.minor = FORMAT_MINOR_VERSION
        self._scan = None  # _scan_json's result, made when a message needs it

    # --- Errors ---------------------------------------------------------------

    def fail(self, offset, what):
        if callable(offset):  # computed only now that it is needed
            offset = offset()
        raise FormatError(f"{self.path}: byte {offset}: {what}")

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
            raise FormatError(f"{self.path}: byte {self.json_offset}: the JSON section is not "
                              f"valid JSON: number overflow parsing '{text}'")
        return value

    def _reject_constant(self, name):
        # Python's json accepts NaN and Infinity; JSON and the format do not.
        raise FormatError(f"{self.path}: byte {self.json_offset}: the JSON section is not valid "
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


def _first_big_integer(text):
    """(offset, literal) of the first integer literal outside int64's range; (0, None) if none."""
    for m in _NUMBER.finditer(text):
        token = m.group(1)
        if token is not None and not any(c in token for c in b".eE"):
            if not -(1 << 63) <= int(token) <= _INT64_MAX:
                return m.start(1), token.decode()
    return 0, None
