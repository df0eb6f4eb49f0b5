// Reading the tree specs (`in_spec`, `out_spec`), the signature, the symbols and the call of a
// `.tcg` file (docs/FORMAT.md). Each throws FormatError at the first problem,
// naming the field.
#pragma once

#include <torchcap/graph_module.h>

#include "serialize/json_cursor.h"

#include <vector>

namespace torchcap::detail {

TreeSpec read_tree_spec(const format::Field& spec);
std::vector<OutputSpec> read_signature(const format::Field& signature);
std::vector<Symbol> read_symbols(const format::Field& symbols);
CallConvention read_call(const format::Field& call);

}  // namespace torchcap::detail
