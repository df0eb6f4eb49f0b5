// A GraphModule: a graph, the tensors its get_attr nodes name, and the specs
// that turn the graph's flat inputs and outputs into the nested structures of
// the program it was captured from.
#pragma once

#include <torchcap/graph.h>
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

  // The structure of the program's arguments (a tuple of them) and result.
  TreeSpec in_spec;
  TreeSpec out_spec;
  // One per value the output node returns (see export.h): user outputs
  // first, which are the leaves of out_spec, then buffer and input
  // mutations. lint() checks there is one per output value.
  std::vector<OutputSpec> output_specs;

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
  // existing buffers and placeholders.
  void lint() const;

  // A deep copy of the graph; tensors are shared, not copied.
  GraphModule clone() const;

  // The graph listing (printer.h) preceded by the attributes and specs, and,
  // when some outputs are mutations, the signature. `with_source` adds each
  // node's module and source line (PrintOptions::source).
  std::string str(bool with_source = false) const;

 private:
  std::unique_ptr<Graph> graph_;
  std::vector<Attribute> attributes_;
  std::map<std::string, size_t> attribute_index_;
};

}  // namespace torchcap
