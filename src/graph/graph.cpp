#include <torchcap/error.h>
#include <torchcap/graph.h>
#include <torchcap/printer.h>

#include "graph/operator_name.h"
#include "graph/reserved_names.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iterator>
#include <mutex>
#include <new>
#include <string_view>
#include <vector>

namespace torchcap {
namespace {

constexpr bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

constexpr bool reserved_names_are_short_words() {
  for (const char* name : detail::kReservedNodeNames) {
    size_t length = 0;
    for (; name[length] != '\0'; ++length) {
      if (!is_letter(name[length])) return false;
    }
    if (length < 2 || length > 12) return false;
  }
  return true;
}
static_assert(reserved_names_are_short_words(),
              "is_reserved's filter assumes every reserved name is 2 to 12 letters");

// Whether `s` is a name a node cannot take (graph/reserved_names.h). Every
// reserved name is 2 to 12 letters, so a name with a digit or an underscore,
// as most node names have, is decided without a lookup; the rest are looked
// up in a sorted table. The hash set this replaces was a visible part of a
// trace from Python: a trace asks between kernels that have
// flushed the caches, and a lookup there reads several cold cache lines.
bool is_reserved(std::string_view s) {
  if (s.size() < 2 || s.size() > 12) return false;
  for (char c : s) {
    if (!is_letter(c)) return false;
  }
  static const std::vector<std::string_view> sorted = [] {
    std::vector<std::string_view> names(std::begin(detail::kReservedNodeNames),
                                        std::end(detail::kReservedNodeNames));
    std::sort(names.begin(), names.end());
    return names;
  }();
  return std::binary_search(sorted.begin(), sorted.end(), s);
}

// ASCII only, whatever the C locale says: a name must be an identifier to
// Python and to the file format on every machine. Every node's hint is
// checked, so this is not std::isalnum (a locale lookup per character).
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word_char(char c) { return is_letter(c) || is_digit(c) || c == '_'; }

bool is_identifier(const std::string& s) {
  if (s.empty() || is_digit(s[0])) return false;
  return std::all_of(s.begin(), s.end(), is_word_char);
}

std::string sanitize(const std::string& hint) {
  std::string s;
  s.reserve(hint.size() + 1);
  for (char c : hint) s += is_word_char(c) ? c : '_';
  if (s.empty() || is_digit(s[0])) s.insert(s.begin(), '_');
  return s;
}

// Note [Node memory]
// A trace creates a node per operator the program calls, and destroying a
// graph frees all of them at once: through the general allocator that is a
// malloc and a free per node, and the frees, thousands in a row, make glibc
// consolidate and return memory that the next graph asks for again. Nodes
// therefore come from a process-wide cache of node-sized blocks: destroyed
// nodes go back to it, new ones are taken from it, up to a bound (beyond
// it, blocks go back to the allocator). Under AddressSanitizer the cache is
// off, so that a use after erase is still caught.
#if defined(__SANITIZE_ADDRESS__)
#define TORCHCAP_NODE_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TORCHCAP_NODE_CACHE 0
#endif
#endif
#ifndef TORCHCAP_NODE_CACHE
#define TORCHCAP_NODE_CACHE 1
#endif

class NodeCache {
 public:
  static NodeCache& get() {
    static NodeCache* cache = new NodeCache();  // used until exit, reachable
    return *cache;
  }

  void* allocate() {
    if (TORCHCAP_NODE_CACHE) {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_ != nullptr) {
        Block* b = free_;
        free_ = b->next;
        --size_;
        return b;
      }
    }
    return ::operator new(sizeof(Node));
  }

  void release(void* p) {
    if (TORCHCAP_NODE_CACHE) {
      std::lock_guard<std::mutex> lock(mu_);
      if (size_ < kMaxBlocks) {
        free_ = new (p) Block{free_};
        ++size_;
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  struct Block {
    Block* next;
  };
  static_assert(sizeof(Block) <= sizeof(Node) && alignof(Block) <= alignof(Node),
                "a node's block holds the free list's link");
  // About 5 MB of nodes: the graphs of a few models traced one after another.
  static constexpr size_t kMaxBlocks = 16384;
  std::mutex mu_;
  Block* free_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

bool is_valid_node_name(const std::string& s) {
  return is_identifier(s) && !is_reserved(s);
}

void destroy_node(Node* n) {
  n->~Node();
  NodeCache::get().release(n);
}

// Nodes are made in the constructor and in create, and destroyed through
// destroy_node (Note [Node memory]).
Graph::Graph() {
  void* p = NodeCache::get().allocate();
  root_ = new (p) Node(this, OpCode::Output, "", "", std::nullopt, nullptr);
  root_->prev_ = root_;
  root_->next_ = root_;
}

Graph::~Graph() {
  // A loop, not recursion: any number of nodes is safe to destroy.
  Node* n = root_->next_;
  while (n != root_) {
    Node* next = n->next_;
    // The next node's memory is fetched while this one is destroyed: a
    // graph is often destroyed long after it was made, its nodes out of
    // the caches, and each would otherwise be waited for in turn.
    for (size_t line = 0; line < sizeof(Node); line += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(next) + line);
    }
    destroy_node(n);
    n = next;
  }
  destroy_node(root_);
}

Node* Graph::first() const { return root_->next_ == root_ ? nullptr : root_->next_; }
Node* Graph::last() const { return root_->prev_ == root_ ? nullptr : root_->prev_; }

Node* Graph::output_node() const {
  Node* l = last();
  return (l != nullptr && l->op() == OpCode::Output) ? l : nullptr;
}

std::vector<Node*> Graph::placeholders() const {
  std::vector<Node*> out;
  for (Node* n : *this) {
    if (n->op() == OpCode::Placeholder) out.push_back(n);
  }
  return out;
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(size_);
  for (Node* n : *this) out.push_back(n);
  return out;
}

Node* Graph::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void Graph::set_insert_point(InsertPoint p) {
  if (p.anchor != nullptr && p.anchor->graph_ != this) {
    throw Error("insertion point: %" + p.anchor->name() + " belongs to a different graph");
  }
  insert_point_ = p;
}

// Note [Naming a node with one lookup]
// A node is made under its hint, and register_name enters it in the name
// table under that name if it is free, checking and inserting in one lookup;
// if not, the node is renamed along the hint's series until an insertion
// succeeds. Checking first and inserting later looked every name up twice,
// and a trace or a load makes one name per node. The keys always view the
// node's own name.
void Graph::register_name(Node* n) {
  if (by_name_.emplace(n->name_, n).second) {
    if (!is_reserved(n->name_)) return;
    by_name_.erase(n->name_);
  }
  // Strip a numeric suffix so that "add_1" taken again continues as "add_2".
  std::string& name = n->name_;
  size_t length = name.size();
  size_t us = name.find_last_of('_');
  if (us != std::string::npos && us + 1 < name.size() && us > 0 &&
      name.find_first_not_of("0123456789", us + 1) == std::string::npos) {
    length = us;
  }
  name.resize(length);
  auto counter = name_counters_.find(name);
  if (counter == name_counters_.end()) counter = name_counters_.emplace(name, 0).first;
  // An identifier followed by _<digits> is an identifier, and no reserved
  // name ends that way.
  for (;;) {
    name.resize(length);
    name += '_';
    name += std::to_string(++counter->second);
    if (by_name_.emplace(name, n).second) return;
  }
}

void Graph::link(Node* n) {
  Node* before;  // n goes just before this node
  if (insert_point_.anchor == nullptr) {
    Node* out = output_node();
    before = (out != nullptr && n->op() != OpCode::Output) ? out : root_;
  } else if (insert_point_.before) {
    before = insert_point_.anchor;
  } else {
    before = insert_point_.anchor->next_;
    // Successive insertions after an anchor keep their creation order.
    insert_point_.anchor = n;
  }
  n->prev_ = before->prev_;
  n->next_ = before;
  before->prev_->next_ = n;
  before->prev_ = n;
  ++size_;
}

void Graph::unlink(Node* n) {
  n->prev_->next_ = n->next_;
  n->next_->prev_ = n->prev_;
  n->prev_ = n->next_ = nullptr;
  --size_;
}

Node* Graph::create(OpCode op, const std::string& name_hint, std::string target,
                    std::optional<c10::OperatorHandle> handle,
                    const detail::OperatorIdentity* identity, ArgumentList args, Kwargs kwargs) {
  // Hints are mostly identifiers already (operator stems): no copy to check.
  std::string name = is_identifier(name_hint) ? name_hint : sanitize(name_hint);
  void* p = NodeCache::get().allocate();
  Node* n;
  try {
    n = new (p) Node(this, op, std::move(name), std::move(target), std::move(handle), identity);
  } catch (...) {
    NodeCache::get().release(p);
    throw;
  }
  bool named = false;
  try {
    register_name(n);
    named = true;
    auto inputs = n->collect_inputs(args, kwargs);
    n->args_ = std::move(args);
    n->kwargs_ = std::move(kwargs);
    n->commit_inputs(std::move(inputs));
  } catch (...) {
    if (named) by_name_.erase(n->name_);
    destroy_node(n);
    throw;
  }
  link(n);
  return n;
}

Node* Graph::placeholder(const std::string& target, const std::string& name) {
  return create(OpCode::Placeholder, name.empty() ? target : name, target, std::nullopt, nullptr,
                {}, {});
}

Node* Graph::get_attr(const std::string& path, const std::string& name) {
  if (path.empty()) throw Error("get_attr: the attribute path is empty");
  return create(OpCode::GetAttr, name.empty() ? path : name, path, std::nullopt, nullptr, {}, {});
}

Node* Graph::call_function(const std::string& op, ArgumentList args, Kwargs kwargs,
                           const std::string& name) {
  auto handle = c10::Dispatcher::singleton().findSchema(detail::parse_operator_name(op));
  if (!handle) throw Error("call_function: no operator " + op + " is registered");
  return call_function(*handle, std::move(args), std::move(kwargs), name);
}

Node* Graph::call_function(const c10::OperatorHandle& op, ArgumentList args, Kwargs kwargs,
                           const std::string& name) {
  // The node's target is the identity's: no string of its own.
  const detail::OperatorIdentity& identity = detail::operator_identity(op.operator_name());
  return create(OpCode::CallFunction, name.empty() ? identity.stem : name, std::string(), op,
                &identity, std::move(args), std::move(kwargs));
}

Node* Graph::call_function(const c10::OperatorHandle& op, const detail::OperatorIdentity& identity,
                           ArgumentList args, Kwargs kwargs) {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(identity.name == op.operator_name());
  return create(OpCode::CallFunction, identity.stem, std::string(), op, &identity,
                std::move(args), std::move(kwargs));
}

Node* Graph::getitem(Node* value, int64_t index, const std::string& name) {
  return create(OpCode::CallFunction, name.empty() ? std::string(kGetItem) : name, kGetItem,
                std::nullopt, nullptr, {value, index}, {});
}

Node* Graph::size_computation(const std::string& target, ArgumentList args, const std::string& name) {
  if (!is_size_target(target)) {
    throw Error("size_computation: '" + target + "' is not one (sym_size, add, sub, mul, floordiv)");
  }
  return create(OpCode::CallFunction, name.empty() ? target : name, target, std::nullopt, nullptr,
                std::move(args), {});
}

Node* Graph::output(ArgumentList results) {
  if (output_node() != nullptr) throw Error("output: the graph already has an output node");
  InsertPointGuard at_end(*this, InsertPoint::at_end());
  return create(OpCode::Output, "output", "output", std::nullopt, nullptr,
                {Argument(std::move(results))}, {});
}

Node* Graph::copy_node(const Node& n, const std::function<Node*(Node*)>& map_arg) {
  ArgumentList args;
  args.reserve(n.args().size());
  for (const Argument& a : n.args()) args.push_back(a.map_nodes(map_arg));
  Kwargs kwargs;
  kwargs.reserve(n.kwargs().size());
  for (const auto& kv : n.kwargs()) kwargs.emplace_back(kv.first, kv.second.map_nodes(map_arg));
  if (n.op() == OpCode::Output && output_node() != nullptr) {
    throw Error("copy_node: the graph already has an output node");
  }
  Node* copy = create(n.op(), n.name(), n.target_, n.handle_, n.operator_, std::move(args),
                      std::move(kwargs));
  copy->meta_ = n.meta_;
  return copy;
}

std::unique_ptr<Graph> Graph::copy(std::unordered_map<const Node*, Node*>* map) const {
  auto g = std::make_unique<Graph>();
  std::unordered_map<const Node*, Node*> local;
  std::unordered_map<const Node*, Node*>& m = map != nullptr ? *map : local;
  auto lookup = [&](Node* old) -> Node* {
    auto it = m.find(old);
    if (it == m.end()) {
      throw Error("copy: %" + old->name() + " is used before it is defined; lint the graph");
    }
    return it->second;
  };
  for (const Node* n : *this) m[n] = g->copy_node(*n, lookup);
  return g;
}

void Graph::erase(Node* n) {
  if (n == nullptr || n->graph_ != this) throw Error("erase: the node does not belong to this graph");
  if (!n->users_.empty()) {
    std::string names;
    for (Node* u : n->users_) names += (names.empty() ? "%" : ", %") + u->name();
    throw Error("erase: cannot erase %" + n->name() + " because it still has " +
                std::to_string(n->users_.size()) + " user(s): " + names +
                "; replace its uses first (replace_all_uses_with)");
  }
  if (insert_point_.anchor == n) {
    Node* next = n->next();
    insert_point_ = next != nullptr && insert_point_.before ? InsertPoint::before_node(next)
                    : insert_point_.before                  ? InsertPoint::at_end()
                    : n->prev() != nullptr                  ? InsertPoint::after_node(n->prev())
                                                            : InsertPoint::at_end();
  }
  n->commit_inputs({});
  by_name_.erase(n->name_);
  unlink(n);
  destroy_node(n);
}

void Graph::move_before(Node* n, Node* anchor) {
  if (n == nullptr || anchor == nullptr || n->graph_ != this || anchor->graph_ != this) {
    throw Error("move_before: both nodes must belong to this graph");
  }
  if (n == anchor) return;
  unlink(n);
  n->prev_ = anchor->prev_;
  n->next_ = anchor;
  anchor->prev_->next_ = n;
  anchor->prev_ = n;
  ++size_;
}

std::string Graph::str() const { return format_graph(*this); }

}  // namespace torchcap
