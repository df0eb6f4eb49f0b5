// Tree specs: nested inputs and outputs (tuples, lists, dicts, none, scalars)
// flattened to a list of tensors and rebuilt from one (pytree's TreeSpec).
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace torchcap {

class TreeSpec {
 public:
  enum class Kind : uint8_t {
    Leaf,      // a tensor
    None,      // none; no leaf
    Constant,  // an int, double, bool or string: part of the spec, not a leaf
    Tuple,
    List,
    Dict,  // keys are strings or ints, in insertion order
  };

  TreeSpec() = default;
  static TreeSpec leaf() { return TreeSpec(Kind::Leaf); }
  static TreeSpec none() { return TreeSpec(Kind::None); }
  static TreeSpec constant(c10::IValue value);
  static TreeSpec tuple(std::vector<TreeSpec> children);
  static TreeSpec list(std::vector<TreeSpec> children);
  static TreeSpec dict(std::vector<c10::IValue> keys, std::vector<TreeSpec> children);

  Kind kind() const { return kind_; }
  const std::vector<TreeSpec>& children() const { return children_; }
  const std::vector<c10::IValue>& keys() const { return keys_; }
  const c10::IValue& constant_value() const { return constant_; }
  // Number of tensors below this spec.
  size_t num_leaves() const { return num_leaves_; }

  // Rebuilds the structure from its leaves (tensors, or none for a leaf whose
  // value is absent). Throws InputError if the count does not match.
  c10::IValue unflatten(const std::vector<c10::IValue>& leaves) const;

  // Flattens `value` if it has this structure; otherwise throws InputError
  // naming the first place that differs ("input[1]['k']: expected a tuple of 2,
  // got a list of 3"). `root` names the value in messages.
  std::vector<c10::IValue> flatten_like(const c10::IValue& value,
                                        const std::string& root = "input") const;

  // Python-like rendering: "(T, [T, T], {'a': T}, None, 3)".
  std::string str() const;

  friend bool operator==(const TreeSpec& a, const TreeSpec& b);
  friend bool operator!=(const TreeSpec& a, const TreeSpec& b) { return !(a == b); }

 private:
  explicit TreeSpec(Kind k) : kind_(k), num_leaves_(k == Kind::Leaf ? 1 : 0) {}

  Kind kind_ = Kind::None;
  std::vector<TreeSpec> children_;
  std::vector<c10::IValue> keys_;
  c10::IValue constant_;
  size_t num_leaves_ = 0;
};

// Flattens a nested value into its tensors and spec. Tensors, tuples, lists,
// dicts with string or int keys, none, ints, doubles, bools and strings are
// accepted; anything else throws TypeError naming its path under `root`.
// Scalars and strings become constants of the spec, not leaves.
std::pair<std::vector<at::Tensor>, TreeSpec> tree_flatten(const c10::IValue& value,
                                                          const std::string& root = "input");

}  // namespace torchcap
