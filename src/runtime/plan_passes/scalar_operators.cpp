// use_tensor_forms_of_scalar_operators (plan_passes.h).
#include "runtime/plan_passes.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <optional>
#include <string>

namespace torchcap {
namespace detail {

// Note [Scalar operators as Tensor operators]
// LibTorch 1.13's kernels of `add.Scalar`, `sub.Scalar`, `mul.Scalar` and
// `div.Scalar` wrap the Scalar in a 0-dim tensor marked as a wrapped
// number and call the `.Tensor` overload. With a constant Scalar the
// interpreter makes that tensor once, here, and calls the `.Tensor`
// overload itself: the same kernel on the same operands, without a tensor
// made per call, and with an out variant of its own (the `.Scalar` ones
// are composites that compute into a new tensor and copy it). A floating
// Scalar with a float32 or float64 result is made in the result's dtype:
// type promotion takes a wrapped number's floating dtype for the default
// one whichever it is, and TensorIterator converts the operand to the
// result's dtype before computing, which it then need not do per call.
// (Kernels of float16 and bfloat16 read the operand as it was before
// that conversion, so for them it stays float64.)
// Not for a planned interpreter, whose plan calls the node's own out
// variant.
bool use_tensor_forms_of_scalar_operators(InterpreterPlan& plan) {
  static const char* const kScalarOperators[] = {"add", "sub", "mul", "div"};
  if (plan.memory) return false;
  std::map<std::string, std::optional<c10::OperatorHandle>> tensor_ops;  // "aten::add" -> add.Tensor
  bool changed = false;
  for (Instruction& ins : plan.instructions) {
    const c10::FunctionSchema& schema = ins.op.schema();
    if (schema.overload_name() != "Scalar" || ins.args.size() < 2 ||
        ins.args[1].kind != Slot::Kind::Constant || !ins.args[1].constant.isScalar()) {
      continue;
    }
    const std::string& name = schema.name();
    bool known = false;
    for (const char* op : kScalarOperators) known = known || name == std::string("aten::") + op;
    if (!known) continue;
    auto it = tensor_ops.find(name);
    if (it == tensor_ops.end()) {
      c10::optional<c10::OperatorHandle> handle = c10::Dispatcher::singleton().findSchema({name, "Tensor"});
      std::optional<c10::OperatorHandle> found;
      if (handle) found = *handle;
      it = tensor_ops.emplace(name, std::move(found)).first;
    }
    if (!it->second) continue;
    const c10::Scalar scalar = ins.args[1].constant.toScalar();
    const std::optional<TensorMeta>& result = plan.node_infos[ins.node_info].result;
    // Made without the dispatcher: an interpreter built while a trace
    // records would otherwise record it.
    at::Tensor wrapped =
        scalar.isFloatingPoint() && result && (result->dtype == at::kFloat || result->dtype == at::kDouble)
            ? at::detail::scalar_tensor_static(scalar, result->dtype, at::kCPU)
            : c10::scalar_to_tensor(scalar);
    wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
    ins.op = *it->second;
    ins.args[1].constant = std::move(wrapped);
    changed = true;
  }
  return changed;
}

}  // namespace detail
}  // namespace torchcap
