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
  // Sets the specs for a flat signature: the placeholders are the arguments, in
  // order, and the result is the tuple of the output node's values (a none
  // among them moves from the output node into the spec).
  void set_flat_specs();

  // Graph lint plus: every get_attr names an attribute; the number of
  // placeholders and output values match the specs.
  void lint() const;

  // A deep copy of the graph; tensors are shared, not copied.
  GraphModule clone() const;

  // The graph listing (printer.h) preceded by the attributes.
  std::string str() const;

 private:
  std::unique_ptr<Graph> graph_;
  std::vector<Attribute> attributes_;
  std::map<std::string, size_t> attribute_index_;
};

}  // namespace torchcap
