// Graph passes: free functions that take a graph and return whether they
// changed it (STYLE.md 10).
#pragma once

#include <torchcap/graph.h>

namespace torchcap {

// Removes nodes whose values are never used and that have no side effects
// (see Node::has_side_effects). Placeholders and the output always stay.
bool eliminate_dead_code(Graph& g);

}  // namespace torchcap
