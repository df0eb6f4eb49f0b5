// Note [Checking a file's shapes]
// The argument rules close what crashes (Note [Integers kernels divide by],
// Note [Kernels that trust their arguments], in graph/schema_check.cpp); this
// check makes sure that the rest of a file agrees with itself before anything
// runs it. Each operator node is run on meta tensors (no memory and no data,
// as shape propagation does) made from the metadata of its inputs: a
// placeholder's recorded metadata (which the interpreter and the Python module
// hold their inputs to), an attribute's own, and for every other node what its
// kernel computed. Then:
// - a kernel's error is the file's problem, named by its node: arguments that
//   do not fit the shapes they are given;
// - so is a result that differs from the node's recorded metadata in kind,
//   number of tensors, dtype or sizes (strides are not compared: LibTorch
//   1.13's meta kernels do not lay out every result as its CPU kernel does);
// - and so is a result that views more memory than its storage has (a
//   kernel that trusted its arguments), and a value the output writes into a
//   buffer or an input (the signature's mutations) of another dtype or shape
//   than its target's.
// Where a kernel cannot run on meta tensors — it has none for the meta
// device, an input's shape is unknown (a placeholder without metadata), or it
// takes neither a tensor nor a device, so it would allocate on the CPU — the
// node's recorded metadata, unverified, stands for its value, and checking
// goes on from there.
//
// It runs once per file, after lint, in every loader: this one (the command,
// C++ load, torchcap.load with its compiled part) and the Python reader
// without it (python/torchcap/_file_shapes.py), which follows it step by step.
// docs/FORMAT.md says what it costs.
#include "serialize/shapes.h"

#include <torchcap/evaluator.h>
#include <torchcap/passes.h>
#include <torchcap/tracer.h>

#include "graph/ivalue_conversion.h"
#include "kernels/meta_kernels.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <unordered_map>
#include <vector>


namespace torchcap::detail {
namespace {

at::Tensor meta_tensor(const TensorMeta& m) {
  return at::empty_strided(m.sizes, m.strides,
                           at::TensorOptions().dtype(m.dtype).device(c10::kMeta));
}

// The recorded value of `n` as meta tensors, or a None IValue if there is
// none (or it describes no tensor LibTorch can make).
c10::IValue recorded_value(const Node& n) {
  const ValueMeta& v = n.meta().val;
  try {
    switch (v.kind) {
      case ValueKind::Tensor:
        return meta_tensor(v.tensors[0]);
      case ValueKind::Tuple: {
        std::vector<c10::IValue> elements;
        for (const TensorMeta& m : v.tensors) elements.emplace_back(meta_tensor(m));
        return c10::ivalue::Tuple::create(std::move(elements));
      }
      case ValueKind::List: {
        c10::List<at::Tensor> list;
        for (const TensorMeta& m : v.tensors) list.push_back(meta_tensor(m));
        return list;
      }
      case ValueKind::None:
      case ValueKind::Unknown:
        break;
    }
  } catch (const c10::Error&) {
  }
  return c10::IValue();
}

std::atomic<PythonErrorReader> python_error_reader{nullptr};

// What a kernel's exception says (Note [Kernels written in Python]).
KernelError kernel_error(std::exception& e) {
  KernelError error;
  const PythonErrorReader reader = python_error_reader.load();
  if (reader == nullptr || !reader(e, error)) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    error.message = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  }
  std::string& what = error.message;
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return error;
}

// Empty if every element `t` views lies inside its storage; otherwise why not.
std::string check_view(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.layout() != c10::kStrided || t.numel() == 0) return "";
  int64_t lowest = t.storage_offset(), highest = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    int64_t step = 0;
    int64_t& end = t.stride(d) < 0 ? lowest : highest;
    if (__builtin_mul_overflow(t.size(d) - 1, t.stride(d), &step) ||
        __builtin_add_overflow(end, step, &end)) {
      lowest = -1;
    }
  }
  int64_t bytes = 0;
  if (lowest >= 0 &&
      !__builtin_mul_overflow(highest + 1, static_cast<int64_t>(t.itemsize()), &bytes) &&
      static_cast<uint64_t>(bytes) <= t.storage().nbytes()) {
    return "";
  }
  return "gives a view of sizes " + TensorMeta::of(t).str() + " with strides " +
         c10::str(t.strides()) + " and offset " + std::to_string(t.storage_offset()) +
         ", which reaches past the " + std::to_string(t.storage().nbytes()) +
         " bytes of memory it views";
}

// Note [Meta kernels that disagree with the CPU's]
// torch's Python meta kernels (which replace LibTorch's in a Python process,
// Note [Kernels written in Python] in shapes.h) give other sizes than the
// CPU kernels for a few operators, which the check would then refuse in
// good files. Found over PyTorch's operator samples (`make sweep`, every
// sample loaded in Python): aminmax of a 0-dim tensor with keepdim (the
// decomposition gives [], the CPU kernel [1]), and the auxiliary results of
// the embedding_bag kernels (offset2bag, max_indices), whose sizes the CPU
// kernel picks by mode, weights and padding. Where they disagree, the file's
// record stands: for aminmax whole, for embedding_bag but for its first
// result, the bags, which is checked. tests/python/op_sweep.py finds any
// other such operator as an error in its "+save+load" modes.
enum class MetaTrust { All, FirstResult, None };

MetaTrust meta_trust(const c10::OperatorName& op) {
  if (op.name == "aten::aminmax") return MetaTrust::None;
  if (op.name == "aten::_embedding_bag" || op.name == "aten::_embedding_bag_forward_only") {
    return MetaTrust::FirstResult;
  }
  return MetaTrust::All;
}

class ShapeChecker {
 public:
  explicit ShapeChecker(const GraphModule& gm) : gm_(gm) { values_.reserve(gm.graph().size()); }

  std::optional<ShapeProblem> run() {
    for (const Node* n : gm_.graph()) {
      if (n->op() == OpCode::Output) return check_writes(*n);
      std::string problem;
      c10::IValue v = value(*n, problem);
      if (!problem.empty()) return ShapeProblem{n, std::move(problem)};
      for (const Node* in : n->inputs()) release(in);
      const auto users = static_cast<uint32_t>(n->users().size());
      if (users > 0 && !v.isNone()) values_.emplace(n, Slot{std::move(v), users});
    }
    return std::nullopt;
  }

 private:
  struct Slot {
    c10::IValue value;   // None: unknown
    uint32_t remaining;  // users still to read it
  };

  // None if unknown.
  const c10::IValue* value_of(const Node* n) const {
    auto it = values_.find(n);
    return it == values_.end() ? nullptr : &it->second.value;
  }

  void release(const Node* n) {
    auto it = values_.find(n);
    if (it != values_.end() && --it->second.remaining == 0) values_.erase(it);
  }

  c10::IValue value(const Node& n, std::string& problem) {
    switch (n.op()) {
      case OpCode::Placeholder:
        return recorded_value(n);
      case OpCode::GetAttr: {
        const at::Tensor& t = gm_.attribute(n.target()).value;
        return t.defined() ? c10::IValue(meta_tensor(TensorMeta::of(t))) : c10::IValue();
      }
      case OpCode::CallFunction:
        break;
      case OpCode::Output:
        return c10::IValue();
    }
    if (n.is_getitem()) {
      const c10::IValue* source = value_of(n.args()[0].to_node());
      const auto index = static_cast<size_t>(n.args()[1].to_int());
      if (source != nullptr && source->isTuple() &&
          index < source->toTupleRef().elements().size()) {
        return source->toTupleRef().elements()[index];
      }
      if (source != nullptr && source->isTensorList() && index < source->toTensorList().size()) {
        return source->toTensorList().get(index);
      }
      return recorded_value(n);
    }
    return call(n, problem);
  }

  c10::IValue call(const Node& n, std::string& problem) {
    const std::vector<BoundArgument> args = bind_arguments(n);
    bool known = true, tensors = false;
    for (const BoundArgument& a : args) {
      if (a.kind == BoundArgument::Kind::Node) {
        tensors = true;
        known = known && value_of(a.node) != nullptr;
      }
      for (const Node* e : a.elements) {
        tensors = tensors || e != nullptr;
        known = known && (e == nullptr || value_of(e) != nullptr);
      }
    }
    const auto& params = n.schema().arguments();
    bool device = false, strided = true;
    for (size_t i = 0; i < params.size(); ++i) {
      const c10::TypeKind kind = unwrap_optional(*params[i].real_type()).kind();
      device = device || kind == c10::TypeKind::DeviceObjType;
      // Meta tensors are strided: a sparse or MKLDNN factory has no meta kernel.
      if (kind == c10::TypeKind::LayoutType && args[i].kind == BoundArgument::Kind::Constant &&
          args[i].constant.isInt()) {
        strided = strided && args[i].constant.toInt() == static_cast<int64_t>(c10::kStrided);
      }
    }
    const MetaTrust trust = meta_trust(n.schema().operator_name());
    if (!known || !strided || (!tensors && !device) || trust == MetaTrust::None) {
      return recorded_value(n);
    }

    std::vector<c10::IValue> stack =
        make_stack(args, [this](const Node* in) { return *value_of(in); });
    // Factories make meta tensors: a given device, or the default one when
    // none is given, becomes the meta device.
    for (size_t i = 0; i < params.size(); ++i) {
      if (unwrap_optional(*params[i].real_type()).kind() == c10::TypeKind::DeviceObjType) {
        stack[i] = c10::IValue(c10::Device(c10::kMeta));
      }
    }
    try {
      n.op_handle().callBoxed(&stack);
    } catch (const c10::NotImplementedError&) {
      return recorded_value(n);  // no meta kernel
    } catch (std::exception& e) {
      const KernelError error = kernel_error(e);
      if (error.not_implemented) return recorded_value(n);
      // A node that records nothing claims nothing (a graph built by hand,
      // without metadata): running it will fail, and say so with the node,
      // but the file does not contradict itself.
      if (!n.meta().val.known()) return c10::IValue();
      problem = n.target() + " fails on the recorded shapes: " + error.message;
      return c10::IValue();
    }
    try {
      for (const c10::IValue& r : stack) {
        if (r.isTensor()) problem = check_view(r.toTensor());
        if (r.isTensorList()) {
          for (const at::Tensor& t : r.toTensorList()) {
            if (problem.empty()) problem = check_view(t);
          }
        }
        if (!problem.empty()) {
          problem = n.target() + " " + problem;
          return c10::IValue();
        }
      }
      const ValueMeta& recorded = n.meta().val;
      if (trust == MetaTrust::FirstResult) {
        // The rest as recorded, for the nodes that read them.
        c10::IValue rest = recorded_value(n);
        if (!rest.isTuple() || rest.toTupleRef().elements().size() != stack.size()) {
          return c10::IValue();
        }
        for (size_t i = 1; i < stack.size(); ++i) stack[i] = rest.toTupleRef().elements()[i];
      }
      if (recorded.kind != ValueKind::Unknown && recorded.kind != ValueKind::None) {
        ValueMeta computed = result_meta(n.schema(), stack);
        if (computed.known() && !same_shapes(recorded, computed)) {
          // Shown on the recorded devices, not the meta device.
          for (size_t i = 0; i < computed.tensors.size(); ++i) {
            computed.tensors[i].device =
                i < recorded.tensors.size() ? recorded.tensors[i].device : c10::Device(c10::kCPU);
          }
          problem = n.target() + " gives " + computed.str() +
                    " on the recorded shapes, but the file records " + recorded.str();
          return c10::IValue();
        }
      }
    } catch (c10::Error& e) {
      problem = n.target() + " gives a result that is not a strided tensor: " + kernel_error(e).message;
      return c10::IValue();
    }
    if (stack.empty()) return c10::IValue();
    if (stack.size() == 1) return std::move(stack[0]);
    return c10::ivalue::Tuple::create(std::move(stack));
  }

  // The values a graph's output writes into buffers and inputs (its
  // signature's mutations) have their targets' dtype and sizes: the
  // interpreter and the Python module copy them there.
  std::optional<ShapeProblem> check_writes(const Node& output) const {
    const ArgumentList& results = output.args()[0].to_list();
    for (size_t i = gm_.num_user_outputs(); i < gm_.output_specs.size() && i < results.size();
         ++i) {
      const OutputSpec& spec = gm_.output_specs[i];
      const c10::IValue* value = results[i].is_node() ? value_of(results[i].to_node()) : nullptr;
      if (value == nullptr || !value->isTensor()) continue;
      std::optional<TensorMeta> target;
      if (spec.kind == OutputKind::BufferMutation) {
        const at::Tensor& t = gm_.attribute(spec.target).value;
        if (t.defined()) target = TensorMeta::of(t);
      } else if (spec.kind == OutputKind::InputMutation) {
        for (const Node* p : gm_.graph().placeholders()) {
          if (p->name() == spec.target && p->meta().val.kind == ValueKind::Tensor) {
            target = p->meta().val.tensors[0];
          }
        }
      }
      TensorMeta written = TensorMeta::of(value->toTensor());
      if (!target || (written.dtype == target->dtype && written.sizes == target->sizes)) continue;
      written.device = target->device;
      return ShapeProblem{
          &output, "output " + std::to_string(i) + " writes %" + results[i].to_node()->name() +
                       " (" + written.str() + " on the recorded shapes) into " +
                       (spec.kind == OutputKind::BufferMutation ? "buffer '" : "input '") +
                       spec.target + "' (" + target->str() + ")"};
    }
    return std::nullopt;
  }

  static bool same_shapes(const ValueMeta& a, const ValueMeta& b) {
    if (a.kind != b.kind || a.tensors.size() != b.tensors.size()) return false;
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      if (a.tensors[i].dtype != b.tensors[i].dtype || a.tensors[i].sizes != b.tensors[i].sizes) {
        return false;
      }
    }
    return true;
  }

  const GraphModule& gm_;
  std::unordered_map<const Node*, Slot> values_;
};

}  // namespace

std::optional<ShapeProblem> check_shapes(const GraphModule& gm) {
  ensure_meta_kernels();                         // Note [Meta kernels LibTorch 1.13 lacks]
  // Meta kernels only: no autograd, and an active trace records nothing.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  PauseTracing not_recorded;
  if (!gm.is_dynamic()) return ShapeChecker(gm).run();
  // A dynamic graph is checked at the sizes it was traced with (its
  // placeholders' recorded sizes): what runs at any size is that graph
  // specialized (Note [Dynamic graphs run specialized] in interpreter.cpp).
  GraphModule fixed;
  try {
    fixed = specialize(gm, traced_symbol_values(gm));
  } catch (const Error& e) {
    return ShapeProblem{gm.graph().first(),
                        std::string("at its traced sizes, the dynamic graph does not hold together: ") +
                            e.what()};
  }
  std::optional<ShapeProblem> problem = ShapeChecker(fixed).run();
  if (problem) problem->node = gm.graph().find(problem->node->name());
  return problem;
}

void set_python_error_reader(PythonErrorReader reader) { python_error_reader.store(reader); }

}  // namespace torchcap::detail
