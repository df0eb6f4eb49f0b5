// Reading in one pass (Note [Reading the usual file in one pass] in
// reader.cpp) for the Python loader, which reads the graph of a usual file
// through it instead of through Python's json and checks the rest itself.
#pragma once

#include <torchcap/graph_module.h>

#include <cstdint>
#include <optional>
#include <string>

namespace torchcap::detail {

struct OnePassRead {
  GraphModule module;
  // The top-level "nodes" array: its first byte and the byte after its last,
  // counted from the start of the JSON section.
  uint64_t nodes_begin = 0, nodes_end = 0;
};

// The file at `path` read in one pass, without verifying checksums; nullopt
// if it cannot be read that way, for whatever reason (the caller's own
// reader then finds and names the problem). Throws nothing.
std::optional<OnePassRead> read_in_one_pass(const std::string& path);

}  // namespace torchcap::detail
