#include "graph/hidden_writes.h"

#include "kernels/functional.h"

#include <ATen/core/jit_type.h>

#include <unordered_map>

namespace torchcap {
namespace detail {

bool is_generator_argument(const c10::Argument& a) {
  const c10::Type* t = a.real_type().get();
  if (t->kind() == c10::TypeKind::OptionalType) {
    t = t->expectRef<c10::OptionalType>().getElementType().get();
  }
  return t->kind() == c10::TypeKind::GeneratorType;
}

const HiddenWrites* hidden_writes(const c10::OperatorName& op) {
  // (input, weight, bias, running_mean, running_var, training, momentum, eps):
  // the running stats are arguments 3 and 4, `training` is argument 5.
  static const HiddenWrites kNativeBatchNorm{{3, 4}, 5, &functional_native_batch_norm};
  static const HiddenWrites kBatchNorm{{3, 4}, 5, nullptr};
  // By name and overload, so that a lookup (one per node that dead-code
  // elimination or save looks at) builds no string.
  static const std::unordered_map<c10::OperatorName, const HiddenWrites*> kTable = {
      {{"aten::native_batch_norm", ""}, &kNativeBatchNorm},
      {{"aten::native_batch_norm", "out"}, &kBatchNorm},
      {{"aten::batch_norm", ""}, &kBatchNorm},
      {{"aten::_batch_norm_impl_index", ""}, &kBatchNorm},
      {{"aten::cudnn_batch_norm", ""}, &kBatchNorm},
      {{"aten::miopen_batch_norm", ""}, &kBatchNorm},
      {{"aten::instance_norm", ""}, &kBatchNorm},
  };
  auto it = kTable.find(op);
  return it == kTable.end() ? nullptr : it->second;
}

bool hidden_writes_happen(const HiddenWrites& h, const std::vector<c10::IValue>& stack) {
  const c10::IValue& flag = stack.at(h.condition);
  if (!flag.isBool() || !flag.toBool()) return false;
  for (size_t i : h.arguments) {
    const c10::IValue& v = stack.at(i);
    if (v.isTensor() && v.toTensor().defined()) return true;
  }
  return false;
}

}  // namespace detail
}  // namespace torchcap
