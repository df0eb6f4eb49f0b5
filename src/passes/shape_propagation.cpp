// Shape and dtype propagation on meta tensors.
#include <torchcap/error.h>
#include <torchcap/evaluator.h>
#include <torchcap/passes.h>
#include <torchcap/tracer.h>

#include "graph/ivalue_conversion.h"
#include "kernels/meta_kernels.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty_strided.h>

#include <unordered_map>

namespace torchcap {
namespace {

at::Tensor meta_tensor(const TensorMeta& m) {
  return at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(c10::kMeta));
}

// Runs the graph on meta tensors and records each node's metadata. Devices
// are carried beside the values: a result lives where its tensor arguments
// do, else on a device argument's device (factories), else on the CPU.
class ShapePropagator : public Evaluator {
 public:
  explicit ShapePropagator(const GraphModule& gm) : Evaluator(gm) {}

  std::unordered_map<const Node*, ValueMeta> metas;

 protected:
  c10::IValue placeholder(const Node& n, size_t) override {
    const ValueMeta& recorded = n.meta().val;
    if (recorded.kind != ValueKind::Tensor || recorded.tensors.empty()) {
      throw Error("propagate_shapes: placeholder %" + n.name() +
                  " has no recorded dtype and shape to start from");
    }
    devices_.emplace(&n, recorded.tensors[0].device);
    metas[&n] = recorded;  // inputs are where shapes come from
    return meta_tensor(recorded.tensors[0]);
  }

  c10::IValue get_attr(const Node& n) override {
    const at::Tensor& t = module().attribute(n.target()).value;
    devices_.emplace(&n, t.device());
    metas[&n] = ValueMeta::tensor(TensorMeta::of(t));
    return meta_tensor(TensorMeta::of(t));
  }

  c10::IValue getitem(const Node& n, const c10::IValue& source, int64_t index) override {
    c10::IValue v = Evaluator::getitem(n, source, index);
    c10::Device device = device_of(n);
    devices_.emplace(&n, device);
    metas[&n] = with_device(ValueMeta::tensor(TensorMeta::of(v.toTensor())), device);
    return v;
  }

  void run_kernel(const Node& n, std::vector<c10::IValue>& stack) override {
    // Factories make meta tensors: a given device, or the default one when
    // none is given, becomes the meta device.
    const auto& params = n.schema().arguments();
    for (size_t i = 0; i < params.size(); ++i) {
      const c10::Type& t = detail::unwrap_optional(*params[i].real_type());
      if (t.kind() == c10::TypeKind::DeviceObjType) stack[i] = c10::IValue(c10::Device(c10::kMeta));
    }
    try {
      n.op_handle().callBoxed(&stack);
    } catch (const std::exception& e) {
      throw Error("propagate_shapes: while computing %" + n.name() + " (" + n.target() +
                  ") on meta tensors: " + e.what());
    }
    c10::Device device = device_of(n);
    devices_.emplace(&n, device);
    metas[&n] = with_device(detail::result_meta(n.schema(), stack), device);
  }

 private:
  c10::Device device_of(const Node& n) const {
    for (const Node* in : n.inputs()) {
      auto it = devices_.find(in);
      if (it != devices_.end()) return it->second;
    }
    for (const auto& kv : n.kwargs()) {
      if (kv.second.is_device()) return kv.second.to_device();
    }
    for (const Argument& a : n.args()) {
      if (a.is_device()) return a.to_device();
    }
    return c10::Device(c10::kCPU);
  }

  static ValueMeta with_device(ValueMeta v, c10::Device device) {
    for (TensorMeta& t : v.tensors) t.device = device;
    return v;
  }

  std::unordered_map<const Node*, c10::Device> devices_;
};

}  // namespace

bool propagate_shapes(GraphModule& gm) {
  detail::ensure_meta_kernels();  // Note [Meta kernels LibTorch 1.13 lacks]
  // Meta kernels only: no autograd, and an active trace records nothing.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  PauseTracing not_recorded;
  ShapePropagator propagator(gm);
  std::vector<c10::IValue> inputs(gm.graph().placeholders().size());
  propagator.run(std::move(inputs));
  bool changed = false;
  for (Node* n : gm.graph()) {
    if (n->op() == OpCode::Output) continue;
    auto it = propagator.metas.find(n);
    ValueMeta val = it == propagator.metas.end() ? ValueMeta{} : std::move(it->second);
    if (n->meta().val != val) {
      n->meta().val = std::move(val);
      changed = true;
    }
  }
  return changed;
}

}  // namespace torchcap
