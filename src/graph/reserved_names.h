// Names a node cannot take, because the generated Python code would break:
// keywords, builtins, and the names the code itself uses. The graph refuses
// them (is_valid_node_name); the `format_tables` tool prints them for the
// Python loader, which refuses the same names in files.
#pragma once

namespace torchcap::detail {

inline constexpr const char* kReservedNodeNames[] = {
    // keywords
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
    "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
    "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise",
    "return", "try", "while", "with", "yield",
    // builtins
    "abs", "all", "any", "ascii", "bin", "bool", "breakpoint", "bytearray", "bytes",
    "callable", "chr", "classmethod", "compile", "complex", "delattr", "dict", "dir",
    "divmod", "enumerate", "eval", "exec", "exit", "filter", "float", "format",
    "frozenset", "getattr", "globals", "hasattr", "hash", "help", "hex", "id", "input",
    "int", "isinstance", "issubclass", "iter", "len", "list", "locals", "map", "max",
    "memoryview", "min", "next", "object", "oct", "open", "ord", "pow", "print",
    "property", "quit", "range", "repr", "reversed", "round", "set", "setattr", "slice",
    "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "vars", "zip",
    // used by generated code
    "self", "torch", "operator", "device", "inf", "nan", "math",
};

}  // namespace torchcap::detail
