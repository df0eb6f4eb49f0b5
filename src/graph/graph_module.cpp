#include <torchcap/error.h>
#include <torchcap/graph_module.h>
#include <torchcap/printer.h>

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
    attributes_[it->second] = Attribute{name, std::move(value), kind};
    return;
  }
  attribute_index_.emplace(name, attributes_.size());
  attributes_.push_back(Attribute{name, std::move(value), kind});
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
  attributes_ = std::move(kept);
  attribute_index_.clear();
  for (size_t i = 0; i < attributes_.size(); ++i) attribute_index_.emplace(attributes_[i].name, i);
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

void GraphModule::lint() const {
  graph_->lint();
  size_t placeholders = 0;
  for (const Node* n : *graph_) {
    if (n->op() == OpCode::Placeholder) ++placeholders;
    if (n->op() == OpCode::GetAttr && !has_attribute(n->target())) {
      throw LintError("lint: get_attr %" + n->name() + " reads attribute '" + n->target() +
                      "', which the GraphModule does not have");
    }
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
  gm.attribute_index_ = attribute_index_;
  gm.in_spec = in_spec;
  gm.out_spec = out_spec;
  gm.output_specs = output_specs;
  return gm;
}

std::string GraphModule::str(bool with_source) const {
  std::string out;
  for (const Attribute& a : attributes_) {
    out += "# " + std::string(attribute_kind_name(a.kind)) + " " + a.name + ": " +
           (a.value.defined() ? TensorMeta::of(a.value).str() : std::string("undefined")) + "\n";
  }
  out += "# inputs: " + in_spec.str() + "\n# outputs: " + out_spec.str() + "\n";
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
