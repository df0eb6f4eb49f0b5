// is_elementwise and writes_in_place (plan_passes.h): what the two passes
// that write a result into an existing tensor (updates_in_place.cpp,
// overwrites.cpp) ask of an operator.
#include "runtime/plan_passes.h"

#include <string>

namespace torchcap {
namespace detail {

bool is_elementwise(const c10::OperatorHandle& op) {
  static const char* const kElementwise[] = {
      "aten::add.Tensor", "aten::add.Scalar", "aten::sub.Tensor", "aten::sub.Scalar",
      "aten::mul.Tensor", "aten::mul.Scalar", "aten::div.Tensor", "aten::div.Scalar",
      "aten::addcmul",    "aten::addcdiv",    "aten::where.self", "aten::maximum",
      "aten::max.other",  "aten::clamp_min",  "aten::lerp.Scalar", "aten::neg",
      "aten::sqrt",       "aten::rsub.Tensor", "aten::relu",       "aten::threshold_backward",
      "aten::sigmoid",    "aten::tanh",       "aten::sigmoid_backward", "aten::tanh_backward",
  };
  const c10::FunctionSchema& schema = op.schema();
  std::string name = schema.overload_name().empty() ? schema.name()
                                                    : schema.name() + "." + schema.overload_name();
  for (const char* e : kElementwise) {
    if (name == e) return true;
  }
  return false;
}

bool writes_in_place(const OutForm& form) {
  return form.op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
}

}  // namespace detail
}  // namespace torchcap
