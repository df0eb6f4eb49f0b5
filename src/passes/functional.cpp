// is_functional and find_mutation_or_view (passes.h): a graph analysis, which
// export's tests and the interpreter's plan both ask.
#include <torchcap/passes.h>

#include "graph/operator_facts.h"

namespace torchcap {

bool is_functional(const Graph& g) { return !find_mutation_or_view(g).has_value(); }

std::optional<std::string> find_mutation_or_view(const Graph& g) {
  auto fail = [&](const Node* n, const std::string& why) {
    return "%" + n->name() + " (" + n->target() + ") " + why;
  };
  for (const Node* n : g) {
    if (!n->is_operator()) continue;
    const c10::FunctionSchema& s = n->schema();
    const detail::OperatorFacts& f = n->facts();
    for (size_t i = 0; i < f.writes.size(); ++i) {
      if (f.writes[i]) return fail(n, "writes its argument '" + s.arguments()[i].name() + "'");
    }
    if (f.hidden != nullptr && n->has_side_effects()) {
      return fail(n, "updates running statistics in place");
    }
    if (f.returns_alias) return fail(n, "returns a view of its argument");
  }
  return std::nullopt;
}

}  // namespace torchcap
