#include <torchcap/error.h>
#include <torchcap/graph_module.h>
#include <torchcap/printer.h>

#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>

#include <unordered_map>
#include <unordered_set>

namespace torchcap {

const char* attribute_kind_name(AttributeKind k) {
  switch (k) {
    case AttributeKind::Parameter:
      return "parameter";
    case AttributeKind::Buffer:
      return "buffer";
    case AttributeKind::Constant:
      return "constant";
  }
  return "?";
}

const char* output_kind_name(OutputKind k) {
  switch (k) {
    case OutputKind::User:
      return "user";
    case OutputKind::BufferMutation:
      return "buffer mutation";
    case OutputKind::InputMutation:
      return "input mutation";
  }
  return "?";
}

GraphModule::GraphModule() : graph_(std::make_unique<Graph>()) {}
GraphModule::GraphModule(std::unique_ptr<Graph> graph) : graph_(std::move(graph)) {
  if (!graph_) throw Error("GraphModule: the graph is null");
}
GraphModule::GraphModule(GraphModule&&) noexcept = default;
GraphModule& GraphModule::operator=(GraphModule&&) noexcept = default;
GraphModule::~GraphModule() = default;

void GraphModule::set_graph(std::unique_ptr<Graph> g) {
  if (!g) throw Error("GraphModule::set_graph: the graph is null");
  graph_ = std::move(g);
}

void GraphModule::set_attribute(const std::string& name, at::Tensor value, AttributeKind kind) {
  if (name.empty()) throw Error("set_attribute: the attribute name is empty");
  auto it = attribute_index_.find(name);
  if (it != attribute_index_.end()) {
    // The name stays, and with it the key that views it.
    Attribute& a = attributes_[it->second];
    a.value = std::move(value);
    a.kind = kind;
    return;
  }
  if (attributes_.size() == attributes_.capacity()) {
    // Grow with room to spare, moving the attributes and re-pointing the keys
    // at their new places; nothing below allocates after the reservations.
    std::vector<Attribute> grown;
    grown.reserve(2 * attributes_.size() + 8);
    AttributeIndex index;
    index.reserve(grown.capacity());
    for (Attribute& a : attributes_) grown.push_back(std::move(a));
    for (size_t i = 0; i < grown.size(); ++i) index.emplace(grown[i].name, i);
    attributes_ = std::move(grown);  // the elements stay where the keys view them
    attribute_index_ = std::move(index);
  }
  attribute_index_.reserve(attributes_.size() + 1);
  attributes_.push_back(Attribute{name, std::move(value), kind});
  attribute_index_.emplace(attributes_.back().name, attributes_.size() - 1);
}

GraphModule::AttributeIndex GraphModule::index_of(const std::vector<Attribute>& attributes) {
  AttributeIndex index;
  index.reserve(attributes.size());
  for (size_t i = 0; i < attributes.size(); ++i) index.emplace(attributes[i].name, i);
  return index;
}

bool GraphModule::has_attribute(const std::string& name) const {
  return attribute_index_.count(name) != 0;
}

const Attribute& GraphModule::attribute(const std::string& name) const {
  auto it = attribute_index_.find(name);
  if (it == attribute_index_.end()) throw Error("the GraphModule has no attribute '" + name + "'");
  return attributes_[it->second];
}

size_t GraphModule::remove_unused_attributes() {
  std::unordered_set<std::string> used;
  for (const Node* n : *graph_) {
    if (n->op() == OpCode::GetAttr) used.insert(n->target());
  }
  std::vector<Attribute> kept;
  for (Attribute& a : attributes_) {
    if (used.count(a.name)) kept.push_back(std::move(a));
  }
  size_t removed = attributes_.size() - kept.size();
  AttributeIndex index = index_of(kept);
  attributes_ = std::move(kept);
  attribute_index_ = std::move(index);
  return removed;
}

GraphSignature GraphModule::signature() const {
  GraphSignature sig;
  for (const Node* n : *graph_) {
    if (n->op() == OpCode::Placeholder) sig.user_inputs.push_back(n->name());
  }
  for (const Attribute& a : attributes_) {
    switch (a.kind) {
      case AttributeKind::Parameter:
        sig.parameters.push_back(a.name);
        break;
      case AttributeKind::Buffer:
        sig.buffers.push_back(a.name);
        break;
      case AttributeKind::Constant:
        sig.constants.push_back(a.name);
        break;
    }
  }
  sig.outputs = output_specs;
  return sig;
}

size_t GraphModule::num_user_outputs() const {
  size_t n = 0;
  for (const OutputSpec& s : output_specs) n += s.kind == OutputKind::User ? 1 : 0;
  return n;
}

void GraphModule::set_flat_specs() {
  std::vector<TreeSpec> ins(graph_->placeholders().size(), TreeSpec::leaf());
  in_spec = TreeSpec::tuple(std::move(ins));
  std::vector<TreeSpec> outs;
  if (Node* out = graph_->output_node()) {
    // Nones move from the output node into the spec: the output lists tensors only.
    ArgumentList tensors;
    for (const Argument& a : out->args()[0].to_list()) {
      outs.push_back(a.is_none() ? TreeSpec::none() : TreeSpec::leaf());
      if (!a.is_none()) tensors.push_back(a);
    }
    out->set_args({Argument(std::move(tensors))});
    output_specs.assign(out->args()[0].to_list().size(), OutputSpec{});
  }
  out_spec = TreeSpec::tuple(std::move(outs));
}

void GraphModule::set_specs(TreeSpec in, TreeSpec out) {
  in_spec = std::move(in);
  out_spec = std::move(out);
  const Node* node = graph_->output_node();
  output_specs.assign(node == nullptr ? 0 : node->args()[0].to_list().size(), OutputSpec{});
}

std::vector<const Attribute*> GraphModule::unbound_attributes() const {
  std::vector<const Attribute*> out;
  for (const Attribute& a : attributes_) {
    if (a.value.defined() && a.value.is_meta()) out.push_back(&a);
  }
  return out;
}

bool GraphModule::has_unbound_weights() const {
  for (const Attribute& a : attributes_) {
    if (a.value.defined() && a.value.is_meta()) return true;
  }
  return false;
}

namespace {

// "f32[16, 8]"; the device only when it is neither the CPU nor meta (a
// weightless attribute's dtype and sizes are what matter).
std::string describe_weight(const at::Tensor& t) {
  TensorMeta m = TensorMeta::of(t);
  if (m.device.is_meta()) m.device = c10::Device(c10::kCPU);
  return m.str();
}

// `w` in the strides `recorded` has, when they differ in a dimension that
// matters (size above 1) and `recorded` is a dense layout a copy can take.
at::Tensor in_recorded_layout(const at::Tensor& w, const at::Tensor& recorded) {
  bool same = true;
  for (int64_t d = 0; d < w.dim(); ++d) {
    if (w.size(d) > 1 && w.stride(d) != recorded.stride(d)) same = false;
  }
  if (same || !recorded.unsafeGetTensorImpl()->is_non_overlapping_and_dense()) return w;
  c10::AutoGradMode no_grad(false);
  at::Tensor out = at::empty_strided(recorded.sizes(), recorded.strides(), w.options());
  out.copy_(w);
  return out;
}


// "# s0 = batch in [1, 64]: ph_0 dim 0, ph_1 dim 0" per symbol.
std::string symbols_str(const std::vector<Symbol>& symbols) {
  std::string out;
  for (size_t i = 0; i < symbols.size(); ++i) {
    const Symbol& s = symbols[i];
    out += "# " + symbol_name(i) + (s.label == symbol_name(i) ? "" : " (" + s.label + ")") + " in [" +
           std::to_string(s.min) + ", " + (s.max == kNoMaxSize ? "inf" : std::to_string(s.max)) +
           "]: ";
    for (size_t k = 0; k < s.dims.size(); ++k) {
      out += (k ? ", " : "") + std::string("input ") + std::to_string(s.dims[k].input) + " dim " +
             std::to_string(s.dims[k].dim);
    }
    out += "\n";
  }
  return out;
}

void lint_symbolic_meta(const Node& n, size_t num_symbols) {
  for (const TensorMeta& m : n.meta().val.tensors) {
    if (m.symbolic == nullptr) continue;
    const SymbolicShape& s = *m.symbolic;
    if (s.sizes.size() != m.sizes.size() || s.strides.size() != m.strides.size()) {
      throw LintError("lint: %" + n.name() + " has " + std::to_string(s.sizes.size()) +
                      " size expressions for " + std::to_string(m.sizes.size()) + " dimensions");
    }
    for (const std::vector<SizeExpr>* exprs : {&s.sizes, &s.strides}) {
      for (const SizeExpr& e : *exprs) {
        if (e.num_symbols_used() > num_symbols) {
          throw LintError("lint: %" + n.name() + "'s size " + e.str() + " uses a symbol the module has not (" +
                          std::to_string(num_symbols) + " symbols)");
        }
      }
    }
  }
}

void lint_symbols(const std::vector<Symbol>& symbols, const std::vector<const Node*>& inputs) {
  for (size_t i = 0; i < symbols.size(); ++i) {
    const Symbol& s = symbols[i];
    std::string where = "lint: symbol " + symbol_name(i) + " (" + s.label + ")";
    if (s.dims.empty()) throw LintError(where + " names no input dimension");
    if (s.min < 0 || s.min > s.max) {
      throw LintError(where + " has the empty or negative range [" + std::to_string(s.min) + ", " +
                      std::to_string(s.max) + "]");
    }
    for (const InputDim& d : s.dims) {
      if (d.input >= inputs.size()) {
        throw LintError(where + " names input " + std::to_string(d.input) + " of " +
                        std::to_string(inputs.size()));
      }
      const ValueMeta& val = inputs[d.input]->meta().val;
      if (val.kind != ValueKind::Tensor || val.tensors.empty() || d.dim < 0 ||
          d.dim >= static_cast<int64_t>(val.tensors[0].sizes.size())) {
        throw LintError(where + " names dimension " + std::to_string(d.dim) + " of %" +
                        inputs[d.input]->name() + ", which has no such recorded dimension");
      }
    }
  }
}
}  // namespace

void GraphModule::bind_weights(const NamedTensors& weights, const BindOptions& options) {
  // Attributes that share one tensor (tied weights) form one group, bound together.
  std::vector<std::vector<size_t>> groups;
  std::unordered_map<const c10::TensorImpl*, size_t> group_of;
  for (size_t i = 0; i < attributes_.size(); ++i) {
    const at::Tensor& v = attributes_[i].value;
    if (!v.defined()) {
      groups.push_back({i});
      continue;
    }
    auto [it, inserted] = group_of.emplace(v.unsafeGetTensorImpl(), groups.size());
    if (inserted) {
      groups.push_back({i});
    } else {
      groups[it->second].push_back(i);
    }
  }

  // Missing weights first, then mismatched ones, then extra ones.
  std::vector<std::string> missing, problems;
  std::vector<at::Tensor> bound(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const Attribute& a = attributes_[groups[g][0]];
    const std::string kind = attribute_kind_name(a.kind);
    const at::Tensor* given = nullptr;
    std::string name;
    for (size_t i : groups[g]) {
      auto it = weights.find(attributes_[i].name);
      if (it != weights.end()) {
        given = &it->second;
        name = it->first;
        break;
      }
    }
    if (given == nullptr) {
      if (a.value.defined() && a.value.is_meta()) {
        missing.push_back("missing: " + kind + " '" + a.name + "' (" + describe_weight(a.value) +
                          ")");
      }
      continue;
    }
    const at::Tensor& w = *given;
    const std::string where = "weight '" + name + "' (" + kind + "): ";
    if (!a.value.defined()) {
      problems.push_back(where + "the module's attribute is undefined (None), so it takes no "
                                 "tensor");
    } else if (!w.defined()) {
      problems.push_back(where + "expected " + describe_weight(a.value) +
                         ", got an undefined tensor");
    } else if (w.is_meta()) {
      problems.push_back(where + "the tensor is on the meta device: it has no values to bind");
    } else if (w.layout() != c10::kStrided) {
      problems.push_back(where + "expected a dense tensor " + describe_weight(a.value) + ", got a " +
                         c10::str(w.layout()) + " tensor; pass the dense one (to_dense())");
    } else if (w.scalar_type() != a.value.scalar_type() || w.sizes() != a.value.sizes()) {
      problems.push_back(where + "expected " + describe_weight(a.value) + ", got " +
                         describe_weight(w));
    } else {
      bound[g] = in_recorded_layout(w, a.value);
    }
  }
  problems.insert(problems.begin(), missing.begin(), missing.end());
  if (options.strict) {
    for (const auto& [name, t] : weights) {
      if (!has_attribute(name)) {
        problems.push_back("extra: weight '" + name + "' is not an attribute of the module "
                           "(BindOptions::strict = false ignores such weights)");
      }
    }
  }
  if (!problems.empty()) {
    constexpr size_t kShown = 20;
    std::string message = "the weights do not fit the module's attributes:";
    for (size_t i = 0; i < problems.size() && i < kShown; ++i) message += "\n  " + problems[i];
    if (problems.size() > kShown) {
      message += "\n  ... and " + std::to_string(problems.size() - kShown) + " more";
    }
    throw WeightError(message);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!bound[g].defined()) continue;
    for (size_t i : groups[g]) attributes_[i].value = bound[g];
  }
}

void GraphModule::lint() const {
  graph_->lint();
  size_t placeholders = 0;
  std::vector<const Node*> inputs;
  for (const Node* n : *graph_) {
    if (n->op() == OpCode::Placeholder) {
      ++placeholders;
      inputs.push_back(n);
    }
    lint_symbolic_meta(*n, symbols.size());
    if (n->op() == OpCode::GetAttr && !has_attribute(n->target())) {
      throw LintError("lint: get_attr %" + n->name() + " reads attribute '" + n->target() +
                      "', which the GraphModule does not have");
    }
  }
  lint_symbols(symbols, inputs);
  if (std::string problem = call.mismatch(in_spec); !problem.empty()) {
    throw LintError("lint: the call convention does not match: " + problem);
  }
  if (placeholders != in_spec.num_leaves()) {
    throw LintError("lint: the graph has " + std::to_string(placeholders) +
                    " placeholders but the input spec " + in_spec.str() + " has " +
                    std::to_string(in_spec.num_leaves()) + " tensors");
  }
  const ArgumentList& results = graph_->output_node()->args()[0].to_list();
  size_t tensors = 0;
  for (const Argument& a : results) tensors += a.is_node() ? 1 : 0;
  if (output_specs.size() != results.size()) {
    throw LintError("lint: the output returns " + std::to_string(results.size()) +
                    " values but there are " + std::to_string(output_specs.size()) +
                    " output specs (one per output value: OutputKind::User for the program's "
                    "results)");
  }
  {
    std::unordered_set<std::string> placeholders_by_name;
    for (const Node* n : *graph_) {
      if (n->op() == OpCode::Placeholder) placeholders_by_name.insert(n->name());
    }
    bool seen_mutation = false;
    std::unordered_set<std::string> targets;
    for (size_t i = 0; i < output_specs.size(); ++i) {
      const OutputSpec& spec = output_specs[i];
      std::string where = "lint: output " + std::to_string(i) + " (" + output_kind_name(spec.kind) +
                          (spec.target.empty() ? "" : " of '" + spec.target + "'") + ")";
      if (spec.kind == OutputKind::User) {
        if (seen_mutation) throw LintError(where + " comes after a mutation output");
        continue;
      }
      seen_mutation = true;
      if (!targets.insert(spec.target).second) throw LintError(where + " updates its target twice");
      if (spec.kind == OutputKind::BufferMutation &&
          (!has_attribute(spec.target) || attribute(spec.target).kind == AttributeKind::Constant)) {
        throw LintError(where + " names no parameter or buffer");
      }
      if (spec.kind == OutputKind::InputMutation && placeholders_by_name.count(spec.target) == 0) {
        throw LintError(where + " names no placeholder");
      }
    }
  }
  size_t user = num_user_outputs();
  if (tensors != results.size() || user != out_spec.num_leaves()) {
    throw LintError("lint: the output returns " + std::to_string(tensors) + " tensors and " +
                    std::to_string(results.size() - tensors) + " none(s); the output spec " +
                    out_spec.str() + " expects " + std::to_string(out_spec.num_leaves()) +
                    " tensors");
  }
}

GraphModule GraphModule::clone() const {
  GraphModule gm(graph_->copy());
  gm.attributes_ = attributes_;
  gm.attribute_index_ = index_of(gm.attributes_);
  gm.in_spec = in_spec;
  gm.out_spec = out_spec;
  gm.call = call;
  gm.output_specs = output_specs;
  gm.symbols = symbols;
  return gm;
}

std::string GraphModule::str(bool with_source) const {
  std::string out;
  for (const Attribute& a : attributes_) {
    out += "# " + std::string(attribute_kind_name(a.kind)) + " " + a.name + ": " +
           (a.value.defined() ? TensorMeta::of(a.value).str() : std::string("undefined")) + "\n";
  }
  out += "# inputs: " + in_spec.str() + "\n# outputs: " + out_spec.str() + "\n";
  if (!call.empty()) out += "# call: forward" + call.str(in_spec) + "\n";
  out += symbols_str(symbols);
  if (has_mutation_outputs()) {
    const ArgumentList& results = graph_->output_node()->args()[0].to_list();
    out += "# signature:\n";
    for (size_t i = 0; i < output_specs.size() && i < results.size(); ++i) {
      const OutputSpec& s = output_specs[i];
      out += "#   output " + std::to_string(i) + " " +
             (results[i].is_node() ? "%" + results[i].to_node()->name() : std::string("None")) +
             ": " + output_kind_name(s.kind) + (s.target.empty() ? "" : " -> " + s.target) + "\n";
    }
  }
  PrintOptions print;
  print.source = with_source;
  return out + format_graph(*graph_, print);
}

}  // namespace torchcap
