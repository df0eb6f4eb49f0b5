// Typed arguments of graph nodes (torch.fx's `Argument`, made type-safe).
//
// An Argument is a reference to another node's value, a constant (int, double,
// bool, string, dtype, layout, device, memory format), none, or a list of those.
// Tensors are never Arguments: a tensor that a node reads is always the value
// of another node (a placeholder, a get_attr or a call_function).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace torchcap {

class Node;
class Argument;

// Note: a call whose only argument is a list must spell the element out,
// `{Argument(ArgumentList{2, 3})}`: a braced `{ArgumentList{2, 3}}` is the list
// itself under some compilers (copy-initialisation, CWG 1467) and a one-element
// list under others.
using ArgumentList = std::vector<Argument>;

class Argument {
 public:
  // Alternatives, in the order of `index()`.
  using Storage = std::variant<std::monostate, Node*, int64_t, double, bool, std::string,
                               c10::ScalarType, c10::Layout, c10::Device, c10::MemoryFormat,
                               ArgumentList>;

  Argument() = default;  // none
  Argument(std::nullptr_t) {}
  Argument(Node* node) : value_(node) {}
  Argument(int64_t v) : value_(v) {}
  Argument(int v) : value_(static_cast<int64_t>(v)) {}
  Argument(double v) : value_(v) {}
  Argument(bool v) : value_(v) {}
  Argument(std::string v) : value_(std::move(v)) {}
  Argument(const char* v) : value_(std::string(v)) {}
  Argument(c10::ScalarType v) : value_(v) {}
  Argument(c10::Layout v) : value_(v) {}
  Argument(c10::Device v) : value_(v) {}
  Argument(c10::MemoryFormat v) : value_(v) {}
  Argument(ArgumentList v) : value_(std::move(v)) {}
  Argument(std::initializer_list<Argument> v) : value_(ArgumentList(v)) {}

  bool is_none() const { return std::holds_alternative<std::monostate>(value_); }
  bool is_node() const { return std::holds_alternative<Node*>(value_); }
  bool is_int() const { return std::holds_alternative<int64_t>(value_); }
  bool is_double() const { return std::holds_alternative<double>(value_); }
  bool is_bool() const { return std::holds_alternative<bool>(value_); }
  bool is_string() const { return std::holds_alternative<std::string>(value_); }
  bool is_scalar_type() const { return std::holds_alternative<c10::ScalarType>(value_); }
  bool is_layout() const { return std::holds_alternative<c10::Layout>(value_); }
  bool is_device() const { return std::holds_alternative<c10::Device>(value_); }
  bool is_memory_format() const { return std::holds_alternative<c10::MemoryFormat>(value_); }
  bool is_list() const { return std::holds_alternative<ArgumentList>(value_); }

  Node* to_node() const { return std::get<Node*>(value_); }
  int64_t to_int() const { return std::get<int64_t>(value_); }
  double to_double() const { return std::get<double>(value_); }
  bool to_bool() const { return std::get<bool>(value_); }
  const std::string& to_string() const { return std::get<std::string>(value_); }
  c10::ScalarType to_scalar_type() const { return std::get<c10::ScalarType>(value_); }
  c10::Layout to_layout() const { return std::get<c10::Layout>(value_); }
  c10::Device to_device() const { return std::get<c10::Device>(value_); }
  c10::MemoryFormat to_memory_format() const { return std::get<c10::MemoryFormat>(value_); }
  const ArgumentList& to_list() const { return std::get<ArgumentList>(value_); }
  ArgumentList& to_list() { return std::get<ArgumentList>(value_); }

  const Storage& storage() const { return value_; }

  // A short name of the alternative held, for error messages: "node", "int", ...
  const char* kind_name() const;

  // Calls `fn(Node*)` for every node referenced, in order, including inside lists.
  template <typename Fn>
  void for_each_node(Fn&& fn) const {
    if (auto* n = std::get_if<Node*>(&value_)) {
      fn(*n);
    } else if (auto* l = std::get_if<ArgumentList>(&value_)) {
      for (const Argument& a : *l) a.for_each_node(fn);
    }
  }

  // Rewrites every node reference through `fn(Node*) -> Node*`.
  template <typename Fn>
  Argument map_nodes(Fn&& fn) const {
    if (auto* n = std::get_if<Node*>(&value_)) return Argument(fn(*n));
    if (auto* l = std::get_if<ArgumentList>(&value_)) {
      ArgumentList out;
      out.reserve(l->size());
      for (const Argument& a : *l) out.push_back(a.map_nodes(fn));
      return Argument(std::move(out));
    }
    return *this;
  }

  friend bool operator==(const Argument& a, const Argument& b);
  friend bool operator!=(const Argument& a, const Argument& b) { return !(a == b); }

 private:
  Storage value_;
};

// A keyword argument: name and value, in the order given.
using Kwargs = std::vector<std::pair<std::string, Argument>>;

}  // namespace torchcap
