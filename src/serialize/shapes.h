// The loader's check of a file's shapes (Note [Checking a file's shapes] in
// shapes.cpp). Internal.
#pragma once

#include <torchcap/graph_module.h>

#include <optional>
#include <string>

namespace torchcap::detail {

struct ShapeProblem {
  const Node* node;
  std::string what;  // the problem, without the node's name
};

// Runs each operator node of `gm` (which passes lint) on meta tensors made
// from the recorded metadata of its inputs, and compares the results with
// the node's recorded metadata. The first problem in graph order, or nullopt.
std::optional<ShapeProblem> check_shapes(const GraphModule& gm);

}  // namespace torchcap::detail
