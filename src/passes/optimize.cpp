// optimize_for_inference (passes.h): the "optimize" pipeline, for graphs
// that are inference graphs.
#include <torchcap/passes.h>

#include "passes/inference.h"

namespace torchcap {

bool optimize_for_inference(GraphModule& gm) {
  auto refuse = [](const std::string& why) {
    throw Error("optimize_for_inference: " + why +
                "; it optimizes inference graphs (a model traced or exported in eval mode, "
                "docs/optimize.md)");
  };
  for (const OutputSpec& s : gm.output_specs) {
    if (s.kind != OutputKind::User) {
      refuse("the graph updates " + std::string(s.kind == OutputKind::BufferMutation ? "the buffer '" : "the input '") +
             s.target + "' at each run");
    }
  }
  if (const Node* n = detail::writes_an_attribute(gm.graph())) {
    refuse("%" + n->name() + " (" + n->target() + ") writes one of the graph's attributes");
  }
  return passes_by_name({"optimize"}).run(gm);
}

}  // namespace torchcap
