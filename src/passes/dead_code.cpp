#include <torchcap/passes.h>

namespace torchcap {

bool eliminate_dead_code(Graph& g) {
  // One reverse walk: by the time a node is visited, all its users have been,
  // so erasing a dead user first lets its inputs die in the same pass.
  bool changed = false;
  Node* n = g.last();
  while (n != nullptr) {
    Node* prev = n->prev();
    if (n->users().empty() && !n->has_side_effects()) {
      g.erase(n);
      changed = true;
    }
    n = prev;
  }
  return changed;
}

}  // namespace torchcap
