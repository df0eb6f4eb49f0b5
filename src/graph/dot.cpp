// The graph as Graphviz source: nodes grouped by module into nested clusters,
// a training step's parts as regions, and above a budget one box per module.
#include <torchcap/graph_module.h>
#include <torchcap/printer.h>
#include <torchcap/training.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchcap {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();
// Module stacks are bounded by the program's own call depth; clusters nested
// deeper than this are not drawn (their nodes go to the 32nd level), so that
// no input makes a picture Graphviz cannot draw.
constexpr size_t kMaxNesting = 32;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// 1922 -> "1,922".
std::string with_commas(size_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string plural(size_t n, const char* one, const char* many) {
  return with_commas(n) + " " + (n == 1 ? one : many);
}

// "torch.nn.modules.conv.Conv2d" -> "Conv2d".
std::string short_class(const std::string& type) {
  size_t dot = type.rfind('.');
  return dot == std::string::npos ? type : type.substr(dot + 1);
}

// The module that owns attribute `target`: "layer1.0.conv1.weight" ->
// "layer1.0.conv1"; a training step's optimizer state is its parameter's
// ("optimizer.exp_avg.0.weight" -> "0", training.h's optimizer_state_name).
std::string owner_of(const std::string& target) {
  std::string path = target;
  const std::string optimizer = "optimizer.";
  if (path.rfind(optimizer, 0) == 0) {
    size_t state_end = path.find('.', optimizer.size());
    path = state_end == std::string::npos ? "" : path.substr(state_end + 1);
  }
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

bool is_prefix_path(const std::string& module, const std::string& path) {
  return !module.empty() && path.size() > module.size() && path.compare(0, module.size(), module) == 0 &&
         path[module.size()] == '.';
}

// One cluster of the picture: a region of a training step, or one call of a
// module (a module called twice, as torchvision's BasicBlock calls its relu,
// makes two groups with one label).
struct Group {
  std::string label;  // "layer1.0 (BasicBlock)", "forward"
  std::string path;   // the module's path; empty for a region
  size_t parent = kNone;
  int depth = 0;  // 0 for a region, 1 for the outermost modules
  bool region = false;
  StepPhase phase = StepPhase::Forward;  // a region's
  std::vector<size_t> children;
  size_t operators = 0;  // call_function nodes in it and below
};

const char* const kRegionColour[] = {"#eff6ff", "#fef2f2", "#f0fdf4"};  // by StepPhase
const char* const kClusterColour[] = {"#f8fafc", "#eef2f7"};           // alternating by depth

// Note [Modules of nodes without a module stack]
// A node traced from TorchScript or Python records the module calls around
// it; a node made by a torch::nn model in C++, by autograd's backward pass or
// by an optimizer update records none. Such a node is placed by the
// attributes it reads: an attribute's owner is its path without the last
// name ("layer1.0.conv1.weight" is layer1.0.conv1's), and so is the owner of
// a node that reads attributes of one module only, directly or through
// values made of them alone (the convolution reading that weight; the mm
// reading a Linear's t(weight); a backward convolution reading it; an
// optimizer update of it). A getitem stays with what it unpacks. A node
// that reads no attribute goes where its latest input was computed, or to
// the innermost module holding that and its users placed so far; one level
// up from a module that owns attributes, since such a module (Conv2d,
// BatchNorm2d) is made of the operators that read them: the relu between
// two convolutions of a block lands in the block, and so does the block's
// residual add. Inputs and outputs, drawn outside every module, do not
// count. An attribute goes to the module of its first reader that holds its
// path, else to its owner's. This is a guess from the data flow: an
// operator at the start of a module without attributes (a pooling before
// the classifier) is counted with the module before it.
class Layout {
 public:
  Layout(const Graph& g, const std::unordered_map<const Node*, StepPhase>& phases)
      : g_(g), phases_(phases) {
    size_t i = 0;
    for (const Node* n : g) position_[n] = i++;
    for (const Node* n : g) {
      for (const ModuleFrame& f : n->meta().module_stack.frames()) {
        if (!f.path.empty()) type_of_path_.emplace(f.path, f.type);
      }
    }
    for (const Node* n : g) {
      if (n->op() == OpCode::Placeholder || n->op() == OpCode::Output) {
        group_of_[n] = kNone;
      } else if (n->op() == OpCode::CallFunction && !n->meta().module_stack.empty()) {
        place_by_stack(n);
      }
    }
    // Without a module stack: by the attributes read, directly or through
    // values made of attributes only (a Linear's t(weight)), in order, so
    // that inputs are placed before their users.
    std::vector<const Node*> free_nodes;
    std::unordered_map<const Node*, std::string> made_of_attributes;  // of one module's
    for (const Node* n : g) {
      if (n->op() != OpCode::CallFunction || !n->meta().module_stack.empty()) continue;
      std::string owner;
      bool one_owner = true;
      bool only_attributes = !n->inputs().empty();
      for (const Node* in : n->inputs()) {
        auto made = made_of_attributes.find(in);
        if (in->op() != OpCode::GetAttr && made == made_of_attributes.end()) {
          only_attributes = false;
          continue;
        }
        std::string o = in->op() == OpCode::GetAttr ? owner_of(in->target()) : made->second;
        if (owner.empty() && one_owner) {
          owner = o;
        } else if (o != owner) {
          one_owner = false;
        }
      }
      if (!owner.empty() && one_owner && only_attributes) made_of_attributes[n] = owner;
      if (!owner.empty() && one_owner) {
        group_of_[n] = group_for_path(base_of(n), owner);
        owns_attributes_.insert(group_of_[n]);
      } else {
        free_nodes.push_back(n);
      }
    }
    for (const Node* n : g) {
      if (n->op() == OpCode::GetAttr) place_attribute(n);
    }
    for (const Node* n : free_nodes) {
      if (n->is_getitem() && !n->inputs().empty()) {
        group_of_[n] = group_of_.at(n->inputs()[0]);
      } else {
        place_by_neighbours(n);
      }
    }
    for (const Node* n : g) {
      if (n->op() != OpCode::CallFunction) continue;
      for (size_t at = group_of_.at(n); at != kNone; at = groups_[at].parent) ++groups_[at].operators;
    }
  }

  const Graph& graph() const { return g_; }
  const std::vector<Group>& groups() const { return groups_; }
  const std::vector<size_t>& top() const { return top_; }
  size_t group_of(const Node* n) const { return group_of_.at(n); }
  bool has_regions() const { return !phases_.empty(); }
  int max_depth() const {
    int d = 0;
    for (const Group& grp : groups_) d = std::max(d, grp.depth);
    return d;
  }
  size_t module_count() const {
    size_t m = 0;
    for (const Group& grp : groups_) m += grp.region ? 0 : 1;
    return m;
  }
  // The region a node is drawn in, or kNone.
  size_t region_of(const Node* n) const { return region_of_group(group_of_.at(n)); }

 private:
  size_t add_group(Group grp) {
    size_t index = groups_.size();
    if (grp.parent == kNone) {
      top_.push_back(index);
      grp.depth = grp.region ? 0 : 1;
    } else {
      groups_[grp.parent].children.push_back(index);
      grp.depth = groups_[grp.parent].depth + 1;
    }
    groups_.push_back(std::move(grp));
    return index;
  }

  std::string label_of(const std::string& path) const {
    auto it = type_of_path_.find(path);
    std::string cls = it == type_of_path_.end() ? "" : short_class(it->second);
    return cls.empty() ? path : path + " (" + cls + ")";
  }

  // The region group of a node's phase, made when first needed.
  size_t base_of(const Node* n) {
    auto it = phases_.find(n);
    if (it == phases_.end()) return kNone;
    size_t& region = region_group_[static_cast<size_t>(it->second)];
    if (region == kNone) {
      Group grp;
      grp.label = step_phase_name(it->second);
      grp.region = true;
      grp.phase = it->second;
      region = add_group(std::move(grp));
    }
    return region;
  }

  // The node's module calls, outermost first, as groups: those of the
  // previous node with a module stack in the same region continue while the
  // paths agree (the same calls); the rest are new calls.
  void place_by_stack(const Node* n) {
    const size_t base = base_of(n);
    std::vector<size_t>& open = open_[base];
    std::vector<size_t> chain;
    for (const ModuleFrame& f : n->meta().module_stack.frames()) {
      if (f.path.empty()) continue;  // the root module: the whole picture
      if (chain.size() == kMaxNesting) break;
      const size_t level = chain.size();
      if (level < open.size() && groups_[open[level]].path == f.path &&
          (level == 0 || groups_[open[level]].parent == chain.back())) {
        chain.push_back(open[level]);
        continue;
      }
      Group grp;
      grp.label = label_of(f.path);
      grp.path = f.path;
      grp.parent = chain.empty() ? base : chain.back();
      chain.push_back(add_group(std::move(grp)));
      by_path_[{base, f.path}] = chain.back();
    }
    open = chain;
    group_of_[n] = chain.empty() ? base : chain.back();
  }

  // The group of module `path` in region `base` (its latest call), made with
  // its enclosing modules when there is none.
  size_t group_for_path(size_t base, const std::string& path) {
    auto it = by_path_.find({base, path});
    if (it != by_path_.end()) return it->second;
    size_t parent = base;
    size_t start = 0;
    int level = 0;
    // Walk the dotted prefixes: "layer1", "layer1.0", "layer1.0.conv1".
    while (true) {
      size_t dot = path.find('.', start);
      std::string prefix = path.substr(0, dot);
      auto found = by_path_.find({base, prefix});
      if (found != by_path_.end()) {
        parent = found->second;
      } else if (++level <= static_cast<int>(kMaxNesting)) {
        Group grp;
        grp.label = label_of(prefix);
        grp.path = prefix;
        grp.parent = parent;
        parent = add_group(std::move(grp));
        by_path_[{base, prefix}] = parent;
      }
      if (dot == std::string::npos) return parent;
      start = dot + 1;
    }
  }

  void place_attribute(const Node* n) {
    const size_t base = base_of(n);
    const std::string& target = n->target();
    for (const Node* user : n->users()) {
      auto it = group_of_.find(user);
      if (it == group_of_.end()) continue;
      for (size_t at = it->second; at != kNone && !groups_[at].region; at = groups_[at].parent) {
        if (is_prefix_path(groups_[at].path, target)) {
          group_of_[n] = at;
          return;
        }
      }
      break;  // the first placed reader decides
    }
    std::string owner = owner_of(target);
    group_of_[n] = owner.empty() ? base : group_for_path(base, owner);
  }

  // Note [Modules of nodes without a module stack]: where its latest input
  // was computed, within the modules of the users already placed; one level
  // up from groups that own attributes. Neighbours in other regions (the
  // forward values a backward operator reads) do not count.
  void place_by_neighbours(const Node* n) {
    const size_t base = base_of(n);
    auto around = [&](const Node* m, size_t* at) {
      auto it = group_of_.find(m);
      if (it == group_of_.end() || m->op() != OpCode::CallFunction || region_of_group(it->second) != base) {
        return false;
      }
      *at = it->second;
      if (*at != kNone && owns_attributes_.count(*at) != 0) *at = groups_[*at].parent;
      return true;
    };
    size_t at = base;
    const Node* latest = nullptr;
    for (const Node* in : n->inputs()) {
      size_t g;
      if ((latest == nullptr || position_.at(in) > position_.at(latest)) && around(in, &g)) {
        latest = in;
        at = g;
      }
    }
    for (const Node* user : n->users()) {
      size_t g;
      if (around(user, &g)) at = latest == nullptr ? g : common_ancestor(at, g);
      latest = latest == nullptr ? user : latest;
    }
    group_of_[n] = at;
  }

  size_t region_of_group(size_t g) const {
    while (g != kNone && !groups_[g].region) g = groups_[g].parent;
    return g;
  }

  // Depths grow by one from parent to child, from -1 for the top.
  size_t common_ancestor(size_t a, size_t b) const {
    auto depth = [&](size_t g) { return g == kNone ? -1 : groups_[g].depth; };
    while (a != b) {
      if (depth(a) >= depth(b)) {
        a = groups_[a].parent;
      } else {
        b = groups_[b].parent;
      }
    }
    return a;
  }

  const Graph& g_;
  const std::unordered_map<const Node*, StepPhase>& phases_;
  std::vector<Group> groups_;
  std::vector<size_t> top_;
  std::unordered_map<const Node*, size_t> group_of_;
  std::unordered_map<std::string, std::string> type_of_path_;
  std::map<std::pair<size_t, std::string>, size_t> by_path_;
  std::unordered_map<size_t, std::vector<size_t>> open_;
  std::set<size_t> owns_attributes_;
  std::unordered_map<const Node*, size_t> position_;  // in the graph's order
  size_t region_group_[3] = {kNone, kNone, kNone};
};

// Note [Attributes in their reader's box]
// At node level an attribute read by one operator is drawn inside that
// operator's box, as a line naming it (relative to the operator's module:
// "reads: weight, bias, running_mean, running_var"), not as a box of its own. A box
// without inputs is a source, which Graphviz ranks and orders with the
// others, out of its module's column: ResNet-18's 102 parameters and
// buffers turned its column of blocks into a staircase many times as wide.
// An attribute read by several operators (tied weights; a training step's
// parameters, read by the forward pass, the backward pass and the
// optimizer) keeps its box.
bool folded(const Node* n) {
  return n->op() == OpCode::GetAttr && n->users().size() == 1 && n->users()[0]->op() == OpCode::CallFunction;
}

// A node's box; `attributes` names those folded into it.
std::string node_statement(const Node* n, const std::string& attributes = "") {
  std::string label = n->name();
  std::string attrs;
  switch (n->op()) {
    case OpCode::Placeholder:
      label += "\ninput";
      attrs = ", shape=ellipse, fillcolor=\"#dbeafe\"";
      break;
    case OpCode::GetAttr:
      label += "\n" + n->target();
      attrs = ", fillcolor=\"#f3f4f6\"";
      break;
    case OpCode::CallFunction:
      label += "\n" + n->target();
      break;
    case OpCode::Output:
      label = "output";
      attrs = ", shape=ellipse, fillcolor=\"#dcfce7\"";
      break;
  }
  std::string type = n->meta().val.str();
  if (!type.empty()) label += "\n" + type;
  if (!attributes.empty()) label += "\nreads: " + attributes;
  return "\"" + escape(n->name()) + "\" [label=\"" + escape(label) + "\"" + attrs + "];";
}

std::string cluster_attributes(const Group& grp) {
  std::string colour = grp.region ? kRegionColour[static_cast<size_t>(grp.phase)]
                                  : kClusterColour[static_cast<size_t>(grp.depth) % 2];
  return "label=\"" + escape(grp.label) + "\"; style=\"rounded,filled\"; fillcolor=\"" + colour +
         "\"; color=\"" + (grp.region ? "#64748b" : "#94a3b8") + "\"; fontname=\"monospace\"; fontsize=" +
         (grp.region ? "14" : "11") + "; labeljust=l;";
}

// Which picture to draw: every node (depth 0), or the modules at `depth` as
// boxes (with `collapse`, the backward and optimizer regions as one box each).
struct Cut {
  int depth = 0;
  bool collapse = false;
};

// What Graphviz has to lay out (Note [What makes a picture slow to draw]).
struct Size {
  size_t boxes = 0;
  size_t width = 0;
};

// Note [What makes a picture slow to draw]
// dot ranks the boxes top to bottom and orders each rank to reduce edge
// crossings; an edge that spans several ranks becomes a chain of virtual
// nodes, one per rank it crosses, ordered with the rest. The time therefore
// follows the width of the widest rank (its boxes and the edges passing
// through it) much more than the number of boxes: a narrow graph of two
// thousand nodes lays out in seconds, while a DenseNet block, where every
// layer reads the outputs of all layers before it, or a training step,
// whose backward pass reads activations saved all along the forward, keeps
// dot busy for minutes with a few hundred boxes (docs/benchmarks.md). A
// picture is measured before it is drawn: ranks by longest path in the
// graph's order, a box without inputs moved down next to its first user (as
// dot places attribute reads), then the widest rank counted. It is an
// estimate of dot's own ranking, which is why the width budget keeps a
// margin below the widths that were measured slow.
class Drawing {
 public:
  explicit Drawing(const Layout& layout) : layout_(layout) {
    size_t i = 0;
    for (const Node* n : layout.graph()) position_[n] = i++;
  }

  // The box a node is drawn in at module level (kNone: drawn as itself, or
  // for an attribute, not at all: its module's box stands for it).
  size_t box_of(const Node* n, const Cut& cut) const {
    size_t g = layout_.group_of(n);
    if (n->op() == OpCode::Placeholder || n->op() == OpCode::Output || g == kNone) return kNone;
    const std::vector<Group>& groups = layout_.groups();
    if (cut.collapse) {
      size_t region = layout_.region_of(n);
      if (region != kNone && groups[region].phase != StepPhase::Forward) return region;
    }
    while (groups[g].depth > cut.depth) g = groups[g].parent;
    if (groups[g].region) return kNone;
    if (groups[g].depth == cut.depth || groups[g].children.empty()) return g;
    return kNone;
  }

  // What a node is drawn as: a box (its group's index), itself (the number
  // of groups plus its position) or nothing (kNone).
  size_t vertex_of(const Node* n, const Cut& cut) const {
    if (cut.depth == 0) return folded(n) ? kNone : layout_.groups().size() + position_.at(n);
    size_t box = box_of(n, cut);
    if (box != kNone) return box;
    return n->op() == OpCode::GetAttr ? kNone : layout_.groups().size() + position_.at(n);
  }

  // Each distinct edge between drawn vertices, in the order of the graph.
  std::vector<std::pair<size_t, size_t>> edges(const Cut& cut) const {
    std::vector<std::pair<size_t, size_t>> out;
    std::set<std::pair<size_t, size_t>> seen;
    for (const Node* n : layout_.graph()) {
      size_t to = vertex_of(n, cut);
      if (to == kNone) continue;
      for (const Node* in : n->inputs()) {
        size_t from = vertex_of(in, cut);
        if (from == kNone || from == to || (cut.depth > 0 && !seen.insert({from, to}).second)) continue;
        out.push_back({from, to});
      }
    }
    return out;
  }

  // Note [What makes a picture slow to draw].
  Size measure(const Cut& cut) const {
    const size_t count = layout_.groups().size() + layout_.graph().size();
    std::vector<bool> drawn(count, false);
    std::vector<bool> has_input(count, false);
    std::vector<long> rank(count, 0);
    Size size;
    for (const Node* n : layout_.graph()) {
      size_t v = vertex_of(n, cut);
      if (v == kNone) continue;
      if (!drawn[v]) ++size.boxes;
      drawn[v] = true;
      for (const Node* in : n->inputs()) {
        size_t w = vertex_of(in, cut);
        if (w == kNone || w == v) continue;
        rank[v] = std::max(rank[v], rank[w] + 1);
        has_input[v] = true;
      }
    }
    const std::vector<std::pair<size_t, size_t>> all = edges(cut);
    std::vector<long> first_user(count, std::numeric_limits<long>::max());
    for (const auto& [from, to] : all) first_user[from] = std::min(first_user[from], rank[to]);
    for (size_t v = 0; v < count; ++v) {
      if (drawn[v] && !has_input[v] && first_user[v] != std::numeric_limits<long>::max()) {
        rank[v] = std::max(0L, first_user[v] - 1);
      }
    }
    long top = 0;
    for (size_t v = 0; v < count; ++v) top = std::max(top, rank[v]);
    std::vector<long> change(static_cast<size_t>(top) + 2, 0);  // differences by rank
    for (size_t v = 0; v < count; ++v) {
      if (!drawn[v]) continue;
      ++change[static_cast<size_t>(rank[v])];
      --change[static_cast<size_t>(rank[v]) + 1];
    }
    for (const auto& [from, to] : all) {
      long lo = std::min(rank[from], rank[to]), hi = std::max(rank[from], rank[to]);
      if (hi - lo < 2) continue;
      ++change[static_cast<size_t>(lo + 1)];
      --change[static_cast<size_t>(hi)];
    }
    long running = 0;
    for (long c : change) {
      running += c;
      size.width = std::max(size.width, static_cast<size_t>(running));
    }
    return size;
  }

  // Every node, attributes read once inside their reader's box (Note
  // [Attributes in their reader's box]).
  DotPicture node_level() const {
    const std::vector<Group>& groups = layout_.groups();
    DotPicture p;
    std::vector<std::vector<std::string>> items(groups.size());
    std::vector<std::string> top;
    std::string edges;
    for (const Node* n : layout_.graph()) {
      if (folded(n)) {
        ++p.folded;
        continue;
      }
      size_t g = layout_.group_of(n);
      const std::string path = g == kNone ? "" : groups[g].path;
      std::string attributes;
      for (const Node* in : n->inputs()) {
        if (folded(in)) {
          const std::string& target = in->target();
          attributes += (attributes.empty() ? "" : ", ") +
                        (is_prefix_path(path, target) ? target.substr(path.size() + 1) : target);
        } else {
          edges += "  \"" + escape(in->name()) + "\" -> \"" + escape(n->name()) + "\";\n";
        }
      }
      (g == kNone ? top : items[g]).push_back(node_statement(n, attributes));
    }
    p.source = emit(items, top, [](size_t) { return true; }, edges);
    p.nodes = layout_.graph().size();
    p.drawn = p.nodes - p.folded;
    p.modules = layout_.module_count();
    return p;
  }

  DotPicture module_level(const Cut& cut) const {
    const std::vector<Group>& groups = layout_.groups();
    DotPicture p;
    std::vector<std::vector<std::string>> items(groups.size());
    std::vector<std::string> top;
    std::vector<bool> used(groups.size(), false);  // a cluster with something drawn in it
    std::vector<std::string> id(groups.size() + layout_.graph().size());
    std::set<size_t> boxes;
    auto mark = [&](size_t g) {
      for (; g != kNone && !used[g]; g = groups[g].parent) used[g] = true;
    };
    for (const Node* n : layout_.graph()) {
      size_t v = vertex_of(n, cut);
      if (v == kNone) continue;
      if (v >= groups.size()) {
        id[v] = n->name();
        size_t g = layout_.group_of(n);
        (g == kNone ? top : items[g]).push_back(node_statement(n));
        mark(g);
        ++p.others;
        continue;
      }
      if (!boxes.insert(v).second) continue;
      const Group& grp = groups[v];
      id[v] = "group:" + std::to_string(v);
      std::string label = grp.label + "\n" + plural(grp.operators, "operator", "operators");
      std::string colour = grp.region ? kRegionColour[static_cast<size_t>(grp.phase)] : "#e0e7ff";
      std::string statement = "\"" + id[v] + "\" [label=\"" + escape(label) + "\", " +
                              (grp.region ? "shape=box3d, " : "") + "fillcolor=\"" + colour + "\"];";
      // A collapsed region is a box at the top; a module's box is drawn in
      // its parent's cluster.
      size_t parent = grp.region ? kNone : grp.parent;
      (parent == kNone ? top : items[parent]).push_back(statement);
      mark(parent);
      p.modules += grp.region ? 0 : 1;
    }
    p.drawn = boxes.size() + p.others;
    std::string edges;
    for (const auto& [from, to] : this->edges(cut)) {
      edges += "  \"" + escape(id[from]) + "\" -> \"" + escape(id[to]) + "\";\n";
    }
    p.source = emit(items, top, [&](size_t g) { return used[g] && boxes.count(g) == 0; }, edges);
    p.nodes = layout_.graph().size();
    p.depth = cut.depth;
    p.collapsed = cut.collapse;
    return p;
  }

 private:
  // The source: the top's statements, then each drawn cluster (iteratively,
  // docs/STYLE.md 13) with its statements and its clusters, then the edges.
  template <typename Drawn>
  std::string emit(const std::vector<std::vector<std::string>>& items, const std::vector<std::string>& top,
                   const Drawn& drawn, const std::string& edges) const {
    const std::vector<Group>& groups = layout_.groups();
    std::string out =
        "digraph torchcap {\n"
        "  rankdir=TB;\n"
        "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", fontname=\"monospace\", "
        "fontsize=10];\n"
        "  edge [color=\"#555555\"];\n";
    for (const std::string& s : top) out += "  " + s + "\n";
    // (group, closing) pairs; children pushed in reverse so they come out in order.
    std::vector<std::pair<size_t, bool>> stack;
    for (auto it = layout_.top().rbegin(); it != layout_.top().rend(); ++it) stack.push_back({*it, false});
    std::vector<int> indent_of(groups.size(), 1);
    while (!stack.empty()) {
      auto [g, closing] = stack.back();
      stack.pop_back();
      std::string indent(static_cast<size_t>(2 * indent_of[g]), ' ');
      if (closing) {
        out += indent + "}\n";
        continue;
      }
      if (!drawn(g)) continue;
      out += indent + "subgraph \"cluster_" + std::to_string(g) + "\" {\n";
      out += indent + "  " + cluster_attributes(groups[g]) + "\n";
      for (const std::string& s : items[g]) out += indent + "  " + s + "\n";
      stack.push_back({g, true});
      const std::vector<size_t>& children = groups[g].children;
      for (auto it = children.rbegin(); it != children.rend(); ++it) {
        indent_of[*it] = indent_of[g] + 1;
        stack.push_back({*it, false});
      }
    }
    return out + edges + "}\n";
  }

  const Layout& layout_;
  std::unordered_map<const Node*, size_t> position_;
};

bool fits(const Size& size, const DotOptions& options) {
  return (options.budget == 0 || size.boxes <= options.budget) &&
         (options.max_width == 0 || size.width <= options.max_width);
}

DotPicture draw(const Graph& g, const std::unordered_map<const Node*, StepPhase>& phases,
                const DotOptions& options) {
  Layout layout(g, phases);
  Drawing drawing(layout);
  const int max_depth = layout.max_depth();
  DotPicture p;
  Size size;
  if (options.all_nodes || max_depth == 0 || options.depth == 0) {
    size = drawing.measure(Cut{});
  }
  if (options.all_nodes || max_depth == 0 || (options.depth == 0 && fits(size, options))) {
    p = drawing.node_level();
  } else {
    // The deepest cut that fits, first with every region drawn out.
    std::vector<Cut> tries;
    for (bool collapse : {false, true}) {
      if (collapse && !layout.has_regions()) continue;
      if (options.depth > 0) {
        tries.push_back({std::min(options.depth, max_depth), collapse});
      } else {
        for (int d = max_depth; d >= 1; --d) tries.push_back({d, collapse});
      }
    }
    Cut chosen = tries.back();
    for (const Cut& cut : tries) {
      size = drawing.measure(cut);
      if (fits(size, options)) {
        chosen = cut;
        break;
      }
    }
    size = drawing.measure(chosen);
    p = drawing.module_level(chosen);
  }
  p.width = size.width;
  p.over_budget = !fits(size, options);
  p.regions = layout.has_regions();
  return p;
}

}  // namespace

std::string DotPicture::summary() const {
  std::string s;
  if (module_level()) {
    s = plural(modules, "module", "modules");
    if (others > 0) s += " and " + plural(others, "other node", "other nodes");
    s += " of " + plural(nodes, "node", "nodes") + " at module depth " + std::to_string(depth);
    if (collapsed) s += ", the backward pass and the optimizer as one box each";
  } else {
    s = "all " + plural(nodes, "node", "nodes");
    s += modules > 0 ? " in " + plural(modules, "module cluster", "module clusters") : " (no modules to group them by)";
    if (folded > 0) s += ", " + plural(folded, "attribute", "attributes") + " inside the box of their reader";
  }
  if (regions) s += ", a training step's forward, backward and optimizer as regions";
  return s;
}

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::Forward: return "forward";
    case StepPhase::Backward: return "backward";
    case StepPhase::Optimizer: return "optimizer";
  }
  return "?";
}

// Note [The parts of a training step]
// A step's graph records no phase: export_training traces forward and loss,
// then autograd's backward pass, then the optimizer's update, and the file
// keeps the nodes and the roles of the outputs (Note [Roles of a training
// step's outputs]). The parts follow from those:
// - forward: the loss and everything it depends on; what the forward-side
//   outputs (buffer and input updates, other user outputs) depend on without
//   depending on the loss (BatchNorm's running statistics); and what was
//   recorded before the first node that depends on the loss (values the
//   forward saved for the backward pass, such as a loss's total weight).
// - optimizer: what starts from the optimizer's state (attributes named
//   "optimizer.<state>.<parameter>", "optimizer.step") or reads parameter P
//   itself to make a value of P's shape that feeds only P's updates (plain
//   SGD's p - lr * g, weight decay, AdamW's p * (1 - lr * wd)), then
//   everything computed from those, and the constants only they use. A
//   backward operator that reads a weight (convolution_backward) returns a
//   tuple or feeds other parameters' gradients, so it is not mistaken for one.
// - backward: the rest: what depends on the loss, and what only it uses.
std::unordered_map<const Node*, StepPhase> step_phases(const GraphModule& gm) {
  std::unordered_map<const Node*, StepPhase> phases;
  if (!is_training_step(gm)) return phases;
  const Graph& g = gm.graph();
  const Node* out = g.output_node();
  if (out == nullptr) return phases;
  const TrainingSignature sig = training_signature(gm);
  // The output's one argument lists its flattened values (Graph::output).
  if (out->args().size() != 1 || !out->args()[0].is_list()) return phases;
  const ArgumentList& results = out->args()[0].to_list();
  auto value = [&](size_t i) -> const Node* {
    return i < results.size() && results[i].is_node() ? results[i].to_node() : nullptr;
  };
  const Node* loss = value(sig.loss);
  if (loss == nullptr) return phases;

  std::vector<const Node*> order;
  for (const Node* n : g) order.push_back(n);
  std::unordered_map<const Node*, size_t> position;
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;

  // What depends on the loss.
  std::vector<bool> after_loss(order.size(), false);
  size_t first_after_loss = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    const Node* n = order[i];
    if (n == out) continue;
    for (const Node* in : n->inputs()) {
      if (in == loss || after_loss[position[in]]) {
        after_loss[i] = true;
        first_after_loss = std::min(first_after_loss, i);
        break;
      }
    }
  }
  // Forward: the ancestors of the loss and of the forward-side outputs.
  std::vector<bool> forward(order.size(), false);
  std::vector<const Node*> work{loss};
  for (size_t i = 0; i < sig.outputs.size(); ++i) {
    StepRole role = sig.outputs[i].role;
    const Node* v = value(i);
    if (v != nullptr && (role == StepRole::BufferUpdate || role == StepRole::InputUpdate || role == StepRole::Output)) {
      work.push_back(v);
    }
  }
  while (!work.empty()) {
    const Node* n = work.back();
    work.pop_back();
    size_t at = position[n];
    if (forward[at] || (after_loss[at] && n != loss)) continue;
    forward[at] = true;
    for (const Node* in : n->inputs()) work.push_back(in);
  }
  // The parameter whose updates alone a node feeds: "" for none yet, kMany
  // for several or for other outputs.
  const std::string kMany = "\n";
  std::vector<std::string> feeds(order.size());
  auto join = [&](std::string& into, const std::string& p) {
    if (into.empty()) {
      into = p;
    } else if (into != p) {
      into = kMany;
    }
  };
  for (size_t i = order.size(); i-- > 0;) {
    const Node* n = order[i];
    if (n == out) continue;
    for (const Node* user : n->users()) {
      if (user != out) {
        if (!feeds[position[user]].empty()) join(feeds[i], feeds[position[user]]);
        continue;
      }
      for (size_t k = 0; k < sig.outputs.size(); ++k) {
        if (value(k) != n) continue;
        const StepOutput& o = sig.outputs[k];
        bool update = (o.role == StepRole::ParameterUpdate || o.role == StepRole::OptimizerState) &&
                      !o.parameter.empty();
        join(feeds[i], update ? o.parameter : kMany);
      }
    }
  }
  std::vector<bool> optimizer(order.size(), false);
  for (size_t i = 0; i < order.size(); ++i) {
    const Node* n = order[i];
    if (forward[i] || n == out || n->op() == OpCode::Placeholder) continue;
    bool seed = false;
    if (n->op() == OpCode::GetAttr) {
      seed = n->target().rfind("optimizer.", 0) == 0;
    } else if (feeds[i] != kMany && !feeds[i].empty() && n->meta().val.kind == ValueKind::Tensor) {
      for (const Node* in : n->inputs()) {
        if (in->op() == OpCode::GetAttr && in->target() == feeds[i] && in->meta().val.kind == ValueKind::Tensor &&
            in->meta().val.tensors[0].sizes == n->meta().val.tensors[0].sizes) {
          seed = true;
        }
      }
    }
    for (const Node* in : n->inputs()) seed = seed || optimizer[position[in]];
    optimizer[i] = seed;
  }
  // Constants and other values only the optimizer uses (the learning rate's `full`).
  for (size_t i = order.size(); i-- > 0;) {
    const Node* n = order[i];
    if (forward[i] || optimizer[i] || after_loss[i] || n == out || n->op() == OpCode::Placeholder) continue;
    bool only = !n->users().empty();
    for (const Node* user : n->users()) only = only && user != out && optimizer[position[user]];
    optimizer[i] = only;
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const Node* n = order[i];
    if (n == out || n->op() == OpCode::Placeholder) continue;
    if (forward[i] || (i < first_after_loss && !optimizer[i])) {
      phases[n] = StepPhase::Forward;
    } else if (optimizer[i]) {
      phases[n] = StepPhase::Optimizer;
    } else {
      phases[n] = StepPhase::Backward;
    }
  }
  return phases;
}

DotPicture graphviz_picture(const Graph& g, const DotOptions& options) { return draw(g, {}, options); }

DotPicture graphviz_picture(const GraphModule& gm, const DotOptions& options) {
  return draw(gm.graph(), step_phases(gm), options);
}

std::string graphviz_dot(const Graph& g, const DotOptions& options) { return graphviz_picture(g, options).source; }

}  // namespace torchcap
