#include "graph/hidden_writes.h"

#include <string>
#include <unordered_map>

namespace torchcap {
namespace detail {

const HiddenWrites* hidden_writes(const c10::OperatorName& op) {
  // (input, weight, bias, running_mean, running_var, training, ...): the
  // running stats are arguments 3 and 4, `training` is argument 5.
  static const HiddenWrites kBatchNorm{{3, 4}, 5};
  static const std::unordered_map<std::string, const HiddenWrites*> kTable = {
      {"aten::native_batch_norm", &kBatchNorm},
      {"aten::native_batch_norm.out", &kBatchNorm},
      {"aten::batch_norm", &kBatchNorm},
      {"aten::_batch_norm_impl_index", &kBatchNorm},
      {"aten::cudnn_batch_norm", &kBatchNorm},
      {"aten::miopen_batch_norm", &kBatchNorm},
      {"aten::instance_norm", &kBatchNorm},
  };
  std::string key = op.overload_name.empty() ? op.name : op.name + "." + op.overload_name;
  auto it = kTable.find(key);
  return it == kTable.end() ? nullptr : it->second;
}

}  // namespace detail
}  // namespace torchcap
