// The graph: an ordered list of nodes that torch.fx would recognise
// (placeholders, get_attr, call_function, one output).
//
// Ownership: the Graph owns its nodes; it is neither copyable nor movable, since
// nodes point back at it. Use `copy()` for a deep copy.
//
// Nothing here recurses over the number of nodes: traversal, copying and
// destruction are loops, so graphs of any length are safe (docs/STYLE.md 13).
#pragma once

#include <torchcap/node.h>

#include <c10/util/flat_hash_map.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torchcap {

// Where new nodes go: before or after an anchor node, or at the end of the
// graph (before the output node, if there is one).
struct InsertPoint {
  Node* anchor = nullptr;
  bool before = true;

  static InsertPoint before_node(Node* n) { return {n, true}; }
  static InsertPoint after_node(Node* n) { return {n, false}; }
  static InsertPoint at_end() { return {nullptr, true}; }
};

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // --- Creating nodes, at the current insertion point -------------------------

  // Every node gets a unique name that is a valid identifier. `name`, when
  // given, is a suggestion: used if free, otherwise continued as a series
  // (`add_1` taken: `add_2`); else the name derives from the target.

  // `target` is the placeholder's target; its name too, unless `name` is given.
  Node* placeholder(const std::string& target, const std::string& name = {});
  // `path` is a dotted attribute path ("layer1.0.conv1.weight").
  Node* get_attr(const std::string& path, const std::string& name = {});
  // `op` is a qualified operator name with optional overload: "aten::addmm",
  // "aten::add.Tensor". Throws if no such operator is registered.
  Node* call_function(const std::string& op, ArgumentList args, Kwargs kwargs = {},
                      const std::string& name = {});
  Node* call_function(const c10::OperatorHandle& op, ArgumentList args, Kwargs kwargs = {},
                      const std::string& name = {});
  // The same, for a caller that holds the operator's identity already
  // (detail::operator_identity(op.operator_name()); the tracer keeps one per
  // operator it meets): no lookup.
  Node* call_function(const c10::OperatorHandle& op, const detail::OperatorIdentity& identity,
                      ArgumentList args, Kwargs kwargs = {});
  // Output `index` of a node that produces several values.
  Node* getitem(Node* value, int64_t index, const std::string& name = {});
  // A size computation (node.h): `target` is kSymSize, "add", "sub", "mul" or
  // "floordiv"; throws Error for another.
  Node* size_computation(const std::string& target, ArgumentList args, const std::string& name = {});
  // The graph's single output; `results` are its flattened values (nodes or none).
  Node* output(ArgumentList results);

  // --- Insertion point ------------------------------------------------------

  InsertPoint insert_point() const { return insert_point_; }
  void set_insert_point(InsertPoint p);

  // Restores the previous insertion point when it goes out of scope.
  class InsertPointGuard {
   public:
    InsertPointGuard(Graph& g, InsertPoint p) : graph_(g), saved_(g.insert_point()) {
      g.set_insert_point(p);
    }
    ~InsertPointGuard() { graph_.insert_point_ = saved_; }
    InsertPointGuard(const InsertPointGuard&) = delete;
    InsertPointGuard& operator=(const InsertPointGuard&) = delete;

   private:
    Graph& graph_;
    InsertPoint saved_;
  };
  InsertPointGuard inserting_before(Node* n) { return {*this, InsertPoint::before_node(n)}; }
  InsertPointGuard inserting_after(Node* n) { return {*this, InsertPoint::after_node(n)}; }

  // --- Editing ---------------------------------------------------------------

  // Removes and destroys `n`. Throws, naming them, if `n` still has users.
  void erase(Node* n);
  // Moves `n` to just before `anchor`.
  void move_before(Node* n, Node* anchor);

  // --- Reading ---------------------------------------------------------------

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Node* first() const;
  Node* last() const;
  // The output node, or nullptr.
  Node* output_node() const;
  std::vector<Node*> placeholders() const;
  // Nodes in order. Safe to erase the node being visited.
  std::vector<Node*> nodes() const;
  // The node named `name`, or nullptr.
  Node* find(const std::string& name) const;

  // Iteration in order without building a vector: for (Node* n : graph).
  class iterator {
   public:
    explicit iterator(Node* n) : n_(n) {}
    Node* operator*() const { return n_; }
    iterator& operator++() {
      n_ = n_->next();
      return *this;
    }
    bool operator!=(const iterator& o) const { return n_ != o.n_; }
    bool operator==(const iterator& o) const { return n_ == o.n_; }

   private:
    Node* n_;
  };
  iterator begin() const { return iterator(first()); }
  iterator end() const { return iterator(nullptr); }

  // Throws LintError on the first broken invariant: ownership, unique valid
  // names, users consistent with arguments, topological order, placeholders
  // first and one output last, every call_function target a registered
  // operator whose schema accepts the arguments given.
  void lint() const;

  // A deep copy; `map`, if given, receives old node -> new node.
  std::unique_ptr<Graph> copy(std::unordered_map<const Node*, Node*>* map = nullptr) const;

  // Copies `n` into this graph at the insertion point, its node arguments
  // mapped through `map_arg`. Keeps its name if free, its target and metadata.
  Node* copy_node(const Node& n, const std::function<Node*(Node*)>& map_arg);

  // torch.fx-style listing, one node per line (see printer.h).
  std::string str() const;

 private:
  friend struct GraphTestPeer;  // tests corrupt graphs to exercise lint
  friend class Node;
  // Operator nodes pass the handle and the operator's identity and no
  // target; other nodes a target only.
  Node* create(OpCode op, const std::string& name_hint, std::string target,
               std::optional<c10::OperatorHandle> handle,
               const detail::OperatorIdentity* identity, ArgumentList args, Kwargs kwargs);
  void link(Node* n);
  void unlink(Node* n);
  // Gives `n` (named after its hint) a free name and enters it in by_name_.
  void register_name(Node* n);

  // Sentinel of the circular list: root_.next_ is the first node.
  Node* root_;
  size_t size_ = 0;
  InsertPoint insert_point_;
  // Keys view the nodes' own names, which never change while a node lives.
  // Open addressing (LibTorch's ska::flat_hash_map): a lookup reads one slot
  // array, not a chain of separately allocated entries, and an entry costs
  // no allocation; a trace or a load looks a name up several times per node.
  ska::flat_hash_map<std::string_view, Node*> by_name_;
  ska::flat_hash_map<std::string, int64_t> name_counters_;
};

// Whether `s` can name a node: a Python identifier that is not a keyword, a
// builtin, or a name the generated code uses itself.
bool is_valid_node_name(const std::string& s);

}  // namespace torchcap
