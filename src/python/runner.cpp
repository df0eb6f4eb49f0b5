// Note [Calls run from the C++ graph]
// A traced, exported or loaded module's torch.fx code is generated and
// compiled by torch.fx, which costs a trace's time many times over
// (docs/benchmarks.md): a program that traces a model and calls it would
// wait for torch.fx to serve one call. So until someone
// needs the torch.fx code (editing the graph and recompile(), or a call this
// runner declines), the module's forward runs the C++ graph it was made
// from with the interpreter (include/torchcap/interpreter.h), built on the
// first call. The same kernels run on the same values as the generated code
// would call, so the results are the same; the plans are made again when an
// attribute's memory was replaced since (`p.data = t`, module.to()), since
// they hold views of attributes computed once (AttributeState).
//
// A call in grad mode whose inputs or attributes require grad (gm(x) with
// the model's own parameters, outside no_grad) runs on a second interpreter,
// built on the first such call, that records autograd history as the
// generated code would (InterpreterOptions::autograd). Everything else the
// interpreter would not see declines the call (None), which then runs the
// torch.fx code: a dispatch key included on this thread beyond the default
// (a torchcap trace of the module, a TorchDispatchMode, functorch's
// transforms), autocast, TorchScript's tracer, and inputs that are not
// plain tensors (a subclass, a tensor with __torch_function__, a wrapper
// such as vmap's or a trace's). Python checks what it alone knows
// (TorchFunctionMode, attributes replaced since the trace) before asking
// (_bridge.py).
#include "python/runner.h"

#include "python/fx_bridge.h"

#include <torchcap/interpreter.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/utils/disable_torch_function.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace torchcap::python {
namespace {

namespace py = pybind11;

// Whether operators called here reach the backend kernels as the generated
// code's would, with nothing above them that the interpreter would skip.
bool plain_dispatch() {
  constexpr c10::DispatchKeySet kDefaultIncluded = c10::default_included_set;
  const c10::impl::LocalDispatchKeySet tls = c10::impl::tls_local_dispatch_key_set();
  if (!(tls.included_ - kDefaultIncluded).empty()) return false;
  if (!tls.excluded_.isSupersetOf(c10::autocast_dispatch_keyset)) return false;  // autocast on
  return !torch::jit::tracer::isTracing();
}

// What a run's plan took of an attribute tensor: a tensor's data can be
// replaced without replacing the tensor (`p.data = t`, which `module.to()`
// does too), and the plan holds views of attributes computed once (Note
// [Views of attributes, computed once] in src/runtime/plan_passes/fold_views.cpp).
struct AttributeState {
  const c10::StorageImpl* storage = nullptr;
  const void* data = nullptr;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;

  static AttributeState of(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return {};
    return {t.storage().unsafeGetStorageImpl(), t.storage().data(), t.scalar_type(), t.sizes().vec(),
            t.strides().vec(), t.storage_offset()};
  }
  bool same_as(const at::Tensor& t) const {
    if (!t.defined() || !t.has_storage()) return storage == nullptr;
    return t.storage().unsafeGetStorageImpl() == storage && t.storage().data() == data &&
           t.scalar_type() == dtype && t.sizes().equals(sizes) && t.strides().equals(strides) &&
           t.storage_offset() == offset;
  }
};

class Runner {
 public:
  // `module`: a _C.GraphModule, which is never changed once made.
  explicit Runner(py::object module) : module_(std::move(module)), gm_(module_.cast<const GraphModule&>()) {
    for (const Attribute& a : gm_.attributes()) attributes_.push_back(a.value);
    py::gil_scoped_release no_gil;
    plan();
  }

  // The flat user outputs of a run on the flat input tensors, or None where
  // the torch.fx code must run the call (Note [Calls run from the C++ graph]).
  py::object run(const py::list& inputs) {
    if (!plain_dispatch()) return py::none();
    std::vector<at::Tensor> tensors;
    tensors.reserve(inputs.size());
    bool requires_grad = false;
    for (const py::handle& obj : inputs) {
      if (!THPVariable_Check(obj.ptr()) || torch::check_has_torch_function(obj.ptr())) return py::none();
      const at::Tensor& t = THPVariable_Unpack(obj.ptr());
      if (!t.defined() || typeid(*t.unsafeGetTensorImpl()) != typeid(c10::TensorImpl)) return py::none();
      requires_grad = requires_grad || t.requires_grad();
      tensors.push_back(t);
    }
    if (at::GradMode::is_enabled()) {
      for (const at::Tensor& a : attributes_) requires_grad = requires_grad || a.requires_grad();
    } else {
      requires_grad = false;
    }
    // The plans are made again if an attribute's data was replaced since,
    // holding the GIL, as every change of this runner is made (runs under
    // way, which do not hold it, keep the plan they started with).
    for (size_t i = 0; i < attributes_.size(); ++i) {
      if (!states_[i].same_as(attributes_[i])) {
        plan();
        break;
      }
    }
    std::shared_ptr<const Interpreter> interpreter = inference_;
    if (requires_grad) {
      if (!autograd_) {  // made under the GIL, so once
        InterpreterOptions options;
        options.autograd = true;
        autograd_ = std::make_shared<const Interpreter>(gm_, options);
      }
      interpreter = autograd_;
    }
    std::vector<at::Tensor> outputs;
    {
      py::gil_scoped_release no_gil;
      outputs = interpreter->run_flat(tensors);
    }
    py::list results(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      results[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(outputs[i])));
    }
    return std::move(results);
  }

  // Interpreter::profile of `runs` runs on the flat input tensors, for
  // torchcap.profile: (table, Chrome trace, [(node, target, source, seconds)]).
  py::tuple profile(const py::list& inputs, int runs) {
    std::vector<at::Tensor> tensors;
    for (const py::handle& obj : inputs) {
      if (!THPVariable_Check(obj.ptr())) throw Error("profile: the graph's inputs are tensors");
      tensors.push_back(THPVariable_Unpack(obj.ptr()));
    }
    Profile p;
    {
      py::gil_scoped_release no_gil;
      p = inference_->profile_flat(tensors, runs);
    }
    py::list nodes;
    for (const Profile::Node& n : p.nodes) nodes.append(py::make_tuple(n.name, n.target, n.source, n.seconds));
    return py::make_tuple(p.table(), p.chrome_trace(), nodes);
  }

 private:
  void plan() {
    states_.clear();
    for (const at::Tensor& a : attributes_) states_.push_back(AttributeState::of(a));
    inference_ = std::make_shared<const Interpreter>(gm_);
    autograd_.reset();
  }

  py::object module_;  // holds gm_
  const GraphModule& gm_;
  std::vector<at::Tensor> attributes_;   // the graph's, as the interpreters hold them
  std::vector<AttributeState> states_;   // theirs when the plans were made
  std::shared_ptr<const Interpreter> inference_;
  std::shared_ptr<const Interpreter> autograd_;  // the first call under autograd makes it
};

}  // namespace

void register_runner_bindings(py::module_& m, py::class_<GraphModule>& graph_module) {
  py::class_<Runner>(m, "Runner")
      .def("run", &Runner::run, py::arg("inputs"))
      .def("profile", &Runner::profile, py::arg("inputs"), py::arg("runs"));
  graph_module
      .def("runner", [](py::object self) { return std::make_unique<Runner>(std::move(self)); })
      .def("fx_specs", &fx_specs, py::arg("spec_class"))
      // The parameters of the generated forward are named after them.
      .def("placeholder_names", [](const GraphModule& gm) {
        std::vector<std::string> names;
        for (const Node* n : gm.graph()) {
          if (n->op() == OpCode::Placeholder) names.push_back(n->name());
        }
        return names;
      })
      // The calling convention (call_convention.h): the positional
      // arguments' names (empty when unknown) and the keyword arguments'.
      .def("call_names", [](const GraphModule& gm) { return gm.call.names; })
      .def("call_keywords", [](const GraphModule& gm) { return gm.call.keyword_names(gm.in_spec); });
}

}  // namespace torchcap::python
