// Shape and dtype propagation on meta tensors.
#include <torchcap/error.h>
#include <torchcap/evaluator.h>
#include <torchcap/passes.h>
#include <torchcap/tracer.h>

#include "graph/ivalue_conversion.h"
#include "graph/size_fit.h"
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

namespace {

// Note [Shapes of a dynamic graph]
// A dynamic graph's shapes are propagated as it was made: the graph is
// specialized at several sizes of its symbols (the same design as the
// traces', the traced sizes first), shapes are propagated through each on
// meta tensors, and every size and stride is fitted as a polynomial of the
// symbols (graph/size_fit.h). One that fits none is an Error naming the node.
bool propagate_dynamic_shapes(GraphModule& gm) {
  detail::SizeDesign design =
      detail::design_sizes(detail::candidate_sizes(gm.symbols, traced_symbol_values(gm)));
  // Per point, per node name: the metadata propagated there.
  std::vector<std::unordered_map<std::string, ValueMeta>> seen(design.points.size());
  for (size_t j = 0; j < design.points.size(); ++j) {
    GraphModule fixed = specialize(gm, design.points[j]);
    propagate_shapes(fixed);
    for (const Node* n : fixed.graph()) seen[j][n->name()] = n->meta().val;
  }
  bool changed = false;
  for (Node* n : gm.graph()) {
    if (n->op() == OpCode::Output || n->op() == OpCode::Placeholder || n->is_size_computation()) continue;
    ValueMeta val = seen[0].at(n->name());
    for (size_t t = 0; t < val.tensors.size(); ++t) {
      TensorMeta& m = val.tensors[t];
      auto shape = std::make_shared<SymbolicShape>();
      bool symbolic = false;
      for (bool strides : {false, true}) {
        for (size_t d = 0; d < m.sizes.size(); ++d) {
          std::vector<int64_t> v;
          for (size_t j = 0; j < design.points.size(); ++j) {
            const ValueMeta& at = seen[j].at(n->name());
            if (at.tensors.size() != val.tensors.size() || at.tensors[t].sizes.size() != m.sizes.size()) {
              throw Error("propagate_shapes: %" + n->name() + " has results of another rank at other "
                          "sizes of the graph's symbols");
            }
            v.push_back(strides ? at.tensors[t].strides[d] : at.tensors[t].sizes[d]);
          }
          std::optional<SizeExpr> e = detail::fit_sizes(design, v);
          if (!e) {
            throw Error("propagate_shapes: a " + std::string(strides ? "stride" : "size") + " of %" +
                        n->name() + " is no polynomial of degree 2 or less in the graph's symbols");
          }
          symbolic = symbolic || !e->is_constant();
          (strides ? shape->strides : shape->sizes).push_back(std::move(*e));
        }
      }
      if (symbolic) m.symbolic = std::move(shape);
    }
    if (n->meta().val != val) {
      n->meta().val = std::move(val);
      changed = true;
    }
  }
  return changed;
}

}  // namespace

bool propagate_shapes(GraphModule& gm) {
  if (gm.is_dynamic()) return propagate_dynamic_shapes(gm);
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
