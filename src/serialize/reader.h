// The reader's first way of reading, alone (Note [Reading the usual file in
// one pass] in reader.cpp), for tests that check what the writer writes is
// read that way.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/serialize.h>

#include <cstddef>
#include <optional>

namespace torchcap::detail {

// The file in `data` read in the text's order, in one pass, without binding
// its weights; nullopt where load would read it again in the contract's
// order (a problem, or JSON spelled otherwise than the writer spells it).
std::optional<GraphModule> read_in_text_order(const void* data, size_t size,
                                              const LoadOptions& options = {});

}  // namespace torchcap::detail
