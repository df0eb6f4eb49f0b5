#include <torchcap/error.h>
#include <torchcap/printer.h>
#include <torchcap/tree_spec.h>

#include "graph/python_literals.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

namespace torchcap {
namespace {

std::string describe(const c10::IValue& v) {
  if (v.isTensor()) return "a tensor";
  if (v.isNone()) return "None";
  if (v.isTuple()) return "a tuple of " + std::to_string(v.toTupleRef().elements().size());
  if (v.isList()) return "a list of " + std::to_string(v.toListRef().size());
  if (v.isGenericDict()) return "a dict of " + std::to_string(v.toGenericDict().size());
  if (v.isInt()) return "int " + std::to_string(v.toInt());
  if (v.isDouble()) return "float " + detail::python_float_repr(v.toDouble());
  if (v.isBool()) return std::string("bool ") + (v.toBool() ? "True" : "False");
  if (v.isString()) return "str " + detail::python_string_literal(v.toStringRef());
  return "a value of type " + v.type()->str();
}

std::string key_str(const c10::IValue& k) {
  return k.isString() ? detail::python_string_literal(k.toStringRef()) : std::to_string(k.toInt());
}

size_t count_leaves(const std::vector<TreeSpec>& children) {
  size_t n = 0;
  for (const TreeSpec& c : children) n += c.num_leaves();
  return n;
}

void flatten_into(const c10::IValue& v, const std::string& path, std::vector<at::Tensor>& leaves,
                  TreeSpec& spec) {
  if (v.isTensor()) {
    leaves.push_back(v.toTensor());
    spec = TreeSpec::leaf();
  } else if (v.isNone()) {
    spec = TreeSpec::none();
  } else if (v.isInt() || v.isDouble() || v.isBool() || v.isString()) {
    spec = TreeSpec::constant(v);
  } else if (v.isTuple() || v.isList()) {
    std::vector<c10::IValue> elems = v.isTuple() ? v.toTupleRef().elements().vec()
                                                 : v.toListRef().vec();
    std::vector<TreeSpec> children(elems.size());
    for (size_t i = 0; i < elems.size(); ++i) {
      flatten_into(elems[i], path + "[" + std::to_string(i) + "]", leaves, children[i]);
    }
    spec = v.isTuple() ? TreeSpec::tuple(std::move(children)) : TreeSpec::list(std::move(children));
  } else if (v.isGenericDict()) {
    std::vector<c10::IValue> keys;
    std::vector<TreeSpec> children;
    for (const auto& entry : v.toGenericDict()) {
      const c10::IValue& k = entry.key();
      if (!k.isString() && !k.isInt()) {
        throw TypeError(path + ": dict keys must be strings or ints, got " + describe(k));
      }
      keys.push_back(k);
      children.emplace_back();
      flatten_into(entry.value(), path + "[" + key_str(k) + "]", leaves, children.back());
    }
    spec = TreeSpec::dict(std::move(keys), std::move(children));
  } else {
    throw TypeError(path + ": unsupported value, " + describe(v) +
                    "; expected tensors, tuples, lists, dicts, None, or int/float/bool/str");
  }
}

// The element type of a rebuilt list or dict: the one all values share
// (Tensor, int, float, bool, so that a TorchScript List[int] parameter
// accepts it), Any otherwise.
c10::TypePtr element_type(const std::vector<c10::IValue>& values) {
  if (values.empty()) return c10::TensorType::get();
  auto all = [&](bool (c10::IValue::*is)() const) {
    for (const c10::IValue& v : values) {
      if (!(v.*is)()) return false;
    }
    return true;
  };
  if (all(&c10::IValue::isTensor)) return c10::TensorType::get();
  if (all(&c10::IValue::isInt)) return c10::IntType::get();
  if (all(&c10::IValue::isDouble)) return c10::FloatType::get();
  if (all(&c10::IValue::isBool)) return c10::BoolType::get();
  return c10::AnyType::get();
}

}  // namespace

TreeSpec TreeSpec::constant(c10::IValue value) {
  TreeSpec s(Kind::Constant);
  s.constant_ = std::move(value);
  return s;
}

TreeSpec TreeSpec::tuple(std::vector<TreeSpec> children) {
  TreeSpec s(Kind::Tuple);
  s.num_leaves_ = count_leaves(children);
  s.children_ = std::move(children);
  return s;
}

TreeSpec TreeSpec::list(std::vector<TreeSpec> children) {
  TreeSpec s(Kind::List);
  s.num_leaves_ = count_leaves(children);
  s.children_ = std::move(children);
  return s;
}

TreeSpec TreeSpec::dict(std::vector<c10::IValue> keys, std::vector<TreeSpec> children) {
  if (keys.size() != children.size()) {
    throw Error("TreeSpec::dict: " + std::to_string(keys.size()) + " keys for " +
                std::to_string(children.size()) + " values");
  }
  TreeSpec s(Kind::Dict);
  s.num_leaves_ = count_leaves(children);
  s.keys_ = std::move(keys);
  s.children_ = std::move(children);
  return s;
}

std::pair<std::vector<at::Tensor>, TreeSpec> tree_flatten(const c10::IValue& value,
                                                          const std::string& root) {
  std::pair<std::vector<at::Tensor>, TreeSpec> out;
  flatten_into(value, root, out.first, out.second);
  return out;
}

namespace {

c10::IValue unflatten_from(const TreeSpec& s, const std::vector<c10::IValue>& leaves, size_t& next) {
  switch (s.kind()) {
    case TreeSpec::Kind::Leaf:
      return leaves[next++];
    case TreeSpec::Kind::None:
      return c10::IValue();
    case TreeSpec::Kind::Constant:
      return s.constant_value();
    case TreeSpec::Kind::Tuple:
    case TreeSpec::Kind::List: {
      std::vector<c10::IValue> elems;
      elems.reserve(s.children().size());
      for (const TreeSpec& c : s.children()) elems.push_back(unflatten_from(c, leaves, next));
      if (s.kind() == TreeSpec::Kind::Tuple) return c10::ivalue::Tuple::create(std::move(elems));
      c10::impl::GenericList list(element_type(elems));
      for (auto& e : elems) list.push_back(std::move(e));
      return list;
    }
    case TreeSpec::Kind::Dict: {
      std::vector<c10::IValue> values;
      for (const TreeSpec& c : s.children()) values.push_back(unflatten_from(c, leaves, next));
      c10::TypePtr key_type = !s.keys().empty() && s.keys()[0].isInt()
                                  ? c10::TypePtr(c10::IntType::get())
                                  : c10::TypePtr(c10::StringType::get());
      c10::impl::GenericDict dict(key_type, element_type(values));
      for (size_t i = 0; i < values.size(); ++i) dict.insert(s.keys()[i], values[i]);
      return dict;
    }
  }
  return c10::IValue();
}

void flatten_like_into(const TreeSpec& s, const c10::IValue& v, const std::string& path,
                       std::vector<c10::IValue>& out) {
  auto mismatch = [&](const std::string& expected) {
    throw InputError(path + ": expected " + expected + ", got " + describe(v));
  };
  switch (s.kind()) {
    case TreeSpec::Kind::Leaf:
      if (!v.isTensor()) mismatch("a tensor");
      out.push_back(v);
      return;
    case TreeSpec::Kind::None:
      if (!v.isNone()) mismatch("None");
      return;
    case TreeSpec::Kind::Constant: {
      const c10::IValue& c = s.constant_value();
      bool same = c.tagKind() == v.tagKind() && c == v;
      if (!same) {
        mismatch(describe(c) + " (the value the graph was captured with; it is not an input)");
      }
      return;
    }
    case TreeSpec::Kind::Tuple:
    case TreeSpec::Kind::List: {
      bool tuple = s.kind() == TreeSpec::Kind::Tuple;
      std::string expected =
          std::string(tuple ? "a tuple of " : "a list of ") + std::to_string(s.children().size());
      if (tuple ? !v.isTuple() : !v.isList()) mismatch(expected);
      std::vector<c10::IValue> elems = tuple ? v.toTupleRef().elements().vec() : v.toListRef().vec();
      if (elems.size() != s.children().size()) mismatch(expected);
      for (size_t i = 0; i < elems.size(); ++i) {
        flatten_like_into(s.children()[i], elems[i], path + "[" + std::to_string(i) + "]", out);
      }
      return;
    }
    case TreeSpec::Kind::Dict: {
      std::string expected = "a dict with keys " + s.str();
      if (!v.isGenericDict()) mismatch("a dict of " + std::to_string(s.children().size()));
      auto dict = v.toGenericDict();
      if (dict.size() != s.keys().size()) mismatch("a dict of " + std::to_string(s.keys().size()));
      for (size_t i = 0; i < s.keys().size(); ++i) {
        auto it = dict.find(s.keys()[i]);
        if (it == dict.end()) {
          throw InputError(path + ": missing key " + key_str(s.keys()[i]));
        }
        flatten_like_into(s.children()[i], it->value(), path + "[" + key_str(s.keys()[i]) + "]",
                          out);
      }
      return;
    }
  }
}

}  // namespace

c10::IValue TreeSpec::unflatten(const std::vector<c10::IValue>& leaves) const {
  if (leaves.size() != num_leaves_) {
    throw InputError("unflatten: the spec " + str() + " has " + std::to_string(num_leaves_) +
                     " leaves, got " + std::to_string(leaves.size()) + " values");
  }
  size_t next = 0;
  return unflatten_from(*this, leaves, next);
}

std::vector<c10::IValue> TreeSpec::flatten_like(const c10::IValue& value,
                                                const std::string& root) const {
  std::vector<c10::IValue> out;
  out.reserve(num_leaves_);
  flatten_like_into(*this, value, root, out);
  return out;
}

std::string TreeSpec::str() const {
  switch (kind_) {
    case Kind::Leaf:
      return "*";
    case Kind::None:
      return "None";
    case Kind::Constant: {
      const c10::IValue& c = constant_;
      if (c.isInt()) return std::to_string(c.toInt());
      if (c.isDouble()) return detail::python_float_repr(c.toDouble());
      if (c.isBool()) return c.toBool() ? "True" : "False";
      if (c.isString()) return detail::python_string_literal(c.toStringRef());
      return "?";
    }
    case Kind::Tuple:
    case Kind::List: {
      std::string s(1, kind_ == Kind::Tuple ? '(' : '[');
      for (size_t i = 0; i < children_.size(); ++i) s += (i ? ", " : "") + children_[i].str();
      if (kind_ == Kind::Tuple && children_.size() == 1) s += ',';
      return s + (kind_ == Kind::Tuple ? ')' : ']');
    }
    case Kind::Dict: {
      std::string s = "{";
      for (size_t i = 0; i < children_.size(); ++i) {
        s += (i ? ", " : "") + key_str(keys_[i]) + ": " + children_[i].str();
      }
      return s + "}";
    }
  }
  return "?";
}

bool operator==(const TreeSpec& a, const TreeSpec& b) {
  if (a.kind_ != b.kind_ || a.children_.size() != b.children_.size() ||
      a.keys_.size() != b.keys_.size()) {
    return false;
  }
  if (a.kind_ == TreeSpec::Kind::Constant &&
      (a.constant_.tagKind() != b.constant_.tagKind() || !(a.constant_ == b.constant_))) {
    return false;
  }
  for (size_t i = 0; i < a.keys_.size(); ++i) {
    if (a.keys_[i].tagKind() != b.keys_[i].tagKind() || !(a.keys_[i] == b.keys_[i])) return false;
  }
  for (size_t i = 0; i < a.children_.size(); ++i) {
    if (a.children_[i] != b.children_[i]) return false;
  }
  return true;
}

}  // namespace torchcap
