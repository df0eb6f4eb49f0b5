// Shape and dtype propagation on meta tensors.
#include <torchcap/error.h>
#include <torchcap/passes.h>
#include <torchcap/printer.h>

#include "passes/meta_kernels.h"
#include "runtime/ivalues.h"
#include "trace/dispatch_key.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <unordered_map>

namespace torchcap {
namespace {

at::Tensor meta_tensor(const TensorMeta& m) {
  return at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(c10::kMeta));
}

// The real device a node's results live on: its tensor arguments', else a
// device argument's (factories), else the CPU.
c10::Device result_device(const Node& n, const std::unordered_map<const Node*, c10::Device>& devices) {
  for (const Node* in : n.inputs()) {
    auto it = devices.find(in);
    if (it != devices.end()) return it->second;
  }
  for (const auto& kv : n.kwargs()) {
    if (kv.second.is_device()) return kv.second.to_device();
  }
  for (const Argument& a : n.args()) {
    if (a.is_device()) return a.to_device();
  }
  return c10::Device(c10::kCPU);
}

TensorMeta meta_of(const at::Tensor& t, c10::Device device) {
  TensorMeta m = TensorMeta::of(t);
  m.device = device;
  return m;
}

}  // namespace

bool propagate_shapes(GraphModule& gm) {
  detail::ensure_meta_kernels();  // Note [Meta kernels LibTorch 1.13 lacks]
  std::unordered_map<const Node*, c10::IValue> env;
  std::unordered_map<const Node*, c10::Device> devices;
  auto value_of = [&](const Node* n) { return env.at(n); };
  // Meta kernels only: no autograd, no tracer.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_tracer(detail::kTracerKey);
  bool changed = false;

  for (Node* n : gm.graph()) {
    ValueMeta val;
    switch (n->op()) {
      case OpCode::Output:
        continue;
      case OpCode::Placeholder: {
        const ValueMeta& recorded = n->meta().val;
        if (recorded.kind != ValueKind::Tensor || recorded.tensors.empty()) {
          throw Error("propagate_shapes: placeholder %" + n->name() +
                      " has no recorded dtype and shape to start from");
        }
        env[n] = meta_tensor(recorded.tensors[0]);
        devices.emplace(n, recorded.tensors[0].device);
        continue;  // inputs are where shapes come from
      }
      case OpCode::GetAttr: {
        const at::Tensor& t = gm.attribute(n->target()).value;
        env[n] = meta_tensor(TensorMeta::of(t));
        devices.emplace(n, t.device());
        val = ValueMeta::tensor(TensorMeta::of(t));
        break;
      }
      case OpCode::CallFunction: {
        c10::Device device = result_device(*n, devices);
        if (n->is_getitem()) {
          c10::IValue src = env.at(n->args()[0].to_node());
          int64_t i = n->args()[1].to_int();
          env[n] = src.isTuple() ? src.toTupleRef().elements().at(i) : src.toListRef().at(i);
          val = ValueMeta::tensor(meta_of(env[n].toTensor(), device));
          devices.emplace(n, device);
          break;
        }
        std::vector<c10::IValue> stack = detail::call_stack(*n, value_of);
        // Factories make meta tensors: a given device, or the default one
        // when none is given, becomes the meta device.
        const auto& params = n->schema().arguments();
        for (size_t i = 0; i < params.size(); ++i) {
          const c10::Type& t = detail::unwrap_optional(*params[i].real_type());
          if (t.kind() == c10::TypeKind::DeviceObjType) stack[i] = c10::IValue(c10::Device(c10::kMeta));
        }
        try {
          n->op_handle().callBoxed(&stack);
        } catch (const std::exception& e) {
          throw Error("propagate_shapes: while computing %" + n->name() + " (" + n->target() +
                      ") on meta tensors: " + e.what());
        }
        const auto& returns = n->schema().returns();
        if (returns.empty()) {
          val.kind = ValueKind::None;
        } else if (returns.size() == 1 && stack.at(0).isTensorList()) {
          val.kind = ValueKind::List;
          for (const at::Tensor& t : stack[0].toTensorList()) val.tensors.push_back(meta_of(t, device));
          env[n] = stack[0];
        } else if (returns.size() == 1 && stack.at(0).isTensor()) {
          val = ValueMeta::tensor(meta_of(stack[0].toTensor(), device));
          env[n] = stack[0];
        } else if (returns.size() > 1) {
          val.kind = ValueKind::Tuple;
          for (const c10::IValue& v : stack) val.tensors.push_back(meta_of(v.toTensor(), device));
          env[n] = c10::ivalue::Tuple::create(std::move(stack));
        } else {
          env[n] = stack.at(0);  // a scalar result
        }
        devices.emplace(n, device);
        break;
      }
    }
    if (n->meta().val != val) {
      n->meta().val = std::move(val);
      changed = true;
    }
  }
  return changed;
}

}  // namespace torchcap
