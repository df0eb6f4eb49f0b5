// Note [Shapes that depend on values] (data_dependence.h).
#include "graph/data_dependence.h"

#include <torchcap/graph.h>
#include <torchcap/node.h>

#include "graph/ivalue_conversion.h"


namespace torchcap {
namespace detail {
namespace {

enum class Kind { None, Always, BoolIndices, RepeatsWithoutSize };

Kind kind_of(const c10::FunctionSchema& s) {
  // Every overload of these (out= forms included).
  static const char* const kAlways[] = {
      "aten::nonzero",     "aten::masked_select",          "aten::_unique",
      "aten::_unique2",    "aten::unique_dim",             "aten::unique_consecutive",
      "aten::unique_dim_consecutive", "aten::bincount",    "aten::nonzero_numpy",
      "aten::argwhere",
      // Its second result, log_alpha, is sized by the largest target length.
      "aten::_ctc_loss"};
  for (const char* name : kAlways) {
    if (s.name() == name) return Kind::Always;
  }
  if (s.name() == "aten::index") return Kind::BoolIndices;
  if (s.name() == "aten::repeat_interleave") {
    for (const c10::Argument& a : s.arguments()) {
      if (a.name() == "repeats" && a.type()->kind() == c10::TypeKind::TensorType) {
        return Kind::RepeatsWithoutSize;
      }
    }
  }
  return Kind::None;
}

bool is_mask_dtype(c10::ScalarType t) { return t == c10::kBool || t == c10::kByte; }

int argument_index(const c10::FunctionSchema& s, const char* name) {
  const auto& args = s.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == name) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

bool may_have_data_dependent_shape(const c10::FunctionSchema& s) { return kind_of(s) != Kind::None; }

bool has_data_dependent_shape(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const c10::FunctionSchema& s = op.schema();
  switch (kind_of(s)) {
    case Kind::None:
      return false;
    case Kind::Always:
      return true;
    case Kind::BoolIndices: {
      int i = argument_index(s, "indices");
      if (i < 0 || !args[i].isList()) return false;
      for (const c10::IValue& e : args[i].toListRef()) {
        if (e.isTensor() && e.toTensor().defined() && is_mask_dtype(e.toTensor().scalar_type())) {
          return true;
        }
      }
      return false;
    }
    case Kind::RepeatsWithoutSize: {
      int i = argument_index(s, "output_size");
      return i < 0 || args[i].isNone();
    }
  }
  return false;
}

bool has_data_dependent_shape(const Node& n) {
  if (!n.is_operator()) return false;
  const c10::FunctionSchema& s = n.schema();
  Kind kind = kind_of(s);
  if (kind == Kind::None) return false;
  if (kind == Kind::Always) return true;
  std::vector<const Argument*> given = given_arguments(n);
  if (kind == Kind::RepeatsWithoutSize) {
    int i = argument_index(s, "output_size");
    return i < 0 || given[i] == nullptr || given[i]->is_none();
  }
  int i = argument_index(s, "indices");
  if (i < 0 || given[i] == nullptr) return false;
  bool mask = false;
  given[i]->for_each_node([&mask](Node* m) {
    const ValueMeta& val = m->meta().val;
    // Unknown metadata: assume the worst.
    mask = mask || val.tensors.empty() || is_mask_dtype(val.tensors[0].dtype);
  });
  return mask;
}

std::unordered_set<const Node*> nodes_of_data_dependent_shape(const Graph& g) {
  std::unordered_set<const Node*> found;
  for (const Node* n : g) {  // in topological order: inputs come first
    bool dependent = has_data_dependent_shape(*n);
    for (const Node* in : n->inputs()) dependent = dependent || found.count(in) != 0;
    if (dependent) found.insert(n);
  }
  return found;
}

}  // namespace detail
}  // namespace torchcap
