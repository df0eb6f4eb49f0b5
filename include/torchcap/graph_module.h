// A GraphModule: a graph, the tensors its get_attr nodes name, and the specs
// that turn the graph's flat inputs and outputs into the nested structures of
// the program it was captured from.
#pragma once

#include <torchcap/call_convention.h>
#include <torchcap/graph.h>
#include <torchcap/symbolic.h>
#include <torchcap/tree_spec.h>

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torchcap {

enum class AttributeKind : uint8_t {
  Parameter,  // a module parameter
  Buffer,     // a module buffer (running stats, ...)
  Constant,   // a tensor lifted from the program (`_tensor_constant0`, ...)
};

// "parameter", "buffer", "constant".
const char* attribute_kind_name(AttributeKind k);

// What an output value of the graph is for (torch.export's OutputSpec).
enum class OutputKind : uint8_t {
  User,            // part of the program's result, rebuilt by out_spec
  BufferMutation,  // the new value of buffer `target`, written back after a run
  InputMutation,   // the new value of input placeholder `target`, written back
};

// "user", "buffer mutation", "input mutation".
const char* output_kind_name(OutputKind k);

struct OutputSpec {
  OutputKind kind = OutputKind::User;
  std::string target;  // the buffer's attribute name or the placeholder's name

  friend bool operator==(const OutputSpec& a, const OutputSpec& b) {
    return a.kind == b.kind && a.target == b.target;
  }
};

// The roles of a graph's inputs, attributes and outputs.
struct GraphSignature {
  std::vector<std::string> user_inputs;  // placeholder names, in order
  std::vector<std::string> parameters;   // attribute names by kind
  std::vector<std::string> buffers;
  std::vector<std::string> constants;
  std::vector<OutputSpec> outputs;  // one per output value, user outputs first
};

struct Attribute {
  std::string name;  // dotted path, as in get_attr targets
  at::Tensor value;
  AttributeKind kind = AttributeKind::Constant;
};

// Tensors by attribute name, as a state dict names them ("layer1.0.conv1.weight").
using NamedTensors = std::map<std::string, at::Tensor>;

// Note [Weightless attributes]: an attribute whose tensor is on the meta
// device has a dtype, sizes and strides but no values. A module traced from a
// model built on the meta device has such attributes, and `save` stores them
// without bytes (a weightless file, docs/FORMAT.md); `load` gives them back as
// meta tensors unless LoadOptions::weights binds them. A module with unbound
// weights can be printed, passed through passes and saved, but not run: the
// Interpreter refuses it with a WeightError naming them.
struct BindOptions {
  // Refuse a weight whose name is not an attribute of the module. Off, such
  // weights are ignored: a state dict holds entries a graph may not read
  // (BatchNorm's num_batches_tracked, a head the traced forward skips).
  bool strict = true;
};

class GraphModule {
 public:
  GraphModule();
  explicit GraphModule(std::unique_ptr<Graph> graph);
  GraphModule(GraphModule&&) noexcept;
  GraphModule& operator=(GraphModule&&) noexcept;
  ~GraphModule();

  Graph& graph() { return *graph_; }
  const Graph& graph() const { return *graph_; }
  void set_graph(std::unique_ptr<Graph> g);

  // Attributes, in the order they were added. Names are unique.
  const std::vector<Attribute>& attributes() const { return attributes_; }
  // Adds or replaces an attribute.
  void set_attribute(const std::string& name, at::Tensor value, AttributeKind kind);
  bool has_attribute(const std::string& name) const;
  // Throws Error naming the attribute if absent.
  const Attribute& attribute(const std::string& name) const;
  // Removes attributes no get_attr node names; returns how many were removed.
  size_t remove_unused_attributes();

  // The attributes without values (on the meta device), in order: Note
  // [Weightless attributes].
  std::vector<const Attribute*> unbound_attributes() const;
  bool has_unbound_weights() const;
  // Sets attributes from `weights`, by name. Every unbound attribute needs a
  // weight; a bound one keeps its tensor unless `weights` names it. Attributes
  // that share one tensor (tied weights) take the weight given for the first
  // of their names that `weights` has. Each weight must have its attribute's
  // dtype and sizes, hold values (not be a meta tensor) and may be on any
  // device. It is used as given, sharing its memory, unless its strides differ
  // from the attribute's: then it is copied into the attribute's strides (as
  // torch.nn's load_state_dict copies into a parameter), so the graph sees the
  // layout it was traced with. Checks everything before changing anything,
  // and throws one WeightError listing every problem.
  void bind_weights(const NamedTensors& weights, const BindOptions& options = {});

  // The structure of the program's arguments (a tuple of them) and result.
  TreeSpec in_spec;
  TreeSpec out_spec;
  // The arguments' names, and whether the call passed some by keyword
  // (call_convention.h); empty when the front end did not know them.
  CallConvention call;
  // One per value the output node returns (see export.h): user outputs
  // first, which are the leaves of out_spec, then buffer and input
  // mutations. lint() checks there is one per output value.
  std::vector<OutputSpec> output_specs;
  // A dynamic graph's symbols (symbolic.h): symbol i prints as `s<i>`. Empty
  // in a graph whose sizes are all fixed.
  std::vector<Symbol> symbols;
  bool is_dynamic() const { return !symbols.empty(); }

  GraphSignature signature() const;
  // Output values that are the program's result (the rest are mutations).
  size_t num_user_outputs() const;
  bool has_mutation_outputs() const { return num_user_outputs() != output_specs.size(); }
  // Sets the specs for a flat signature: the placeholders are the arguments, in
  // order, and the result is the tuple of the output node's values (a none
  // among them moves from the output node into the spec), all user outputs.
  void set_flat_specs();
  // Sets the specs of a program whose results are all user outputs (no
  // mutation outputs): output_specs gets one User entry per output value.
  void set_specs(TreeSpec in, TreeSpec out);

  // Graph lint plus: every get_attr names an attribute; the number of
  // placeholders and output values match the specs; the output specs name
  // existing buffers and placeholders; symbols name dimensions of inputs, and
  // size expressions use only the symbols there are; the call convention
  // describes in_spec.
  void lint() const;

  // A deep copy of the graph; tensors are shared, not copied.
  GraphModule clone() const;

  // The graph listing (printer.h) preceded by the attributes and specs, and,
  // when some outputs are mutations, the signature. `with_source` adds each
  // node's module and source line (PrintOptions::source).
  std::string str(bool with_source = false) const;

 private:
  std::unique_ptr<Graph> graph_;
  using AttributeIndex = ska::flat_hash_map<std::string_view, size_t>;
  // An index whose keys view the names in `attributes`: it stays valid when
  // that vector is moved, not when its elements are.
  static AttributeIndex index_of(const std::vector<Attribute>& attributes);

  std::vector<Attribute> attributes_;
  // Open addressing, as Graph's name table: a trace sets an attribute for
  // every parameter it meets. Keys view the attributes' own names (a copy of
  // each was a heap block per parameter, kept with the module), so every
  // change that moves the attributes reindexes.
  AttributeIndex attribute_index_;
};

}  // namespace torchcap
