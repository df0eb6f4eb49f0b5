// Note [Calls run from the C++ graph]
// A traced, exported or loaded module's torch.fx code is generated and
// compiled by torch.fx, which costs a trace's time many times over
// (docs/benchmarks.md): a program that traces a model and calls it would
// wait for torch.fx to serve one call. So until someone
// needs the torch.fx code (editing the graph and recompile(), or a call this
// runner declines), the module's forward runs the C++ graph it was made
// from with the interpreter (include/torchcap/interpreter.h), built on the
// first call. The same kernels run on the same values as the generated code
// would call, so the results are the same.
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

class Runner {
 public:
  // `module`: a _C.GraphModule, which is never changed once made.
  explicit Runner(py::object module) : module_(std::move(module)), gm_(module_.cast<const GraphModule&>()) {
    for (const Attribute& a : gm_.attributes()) attributes_.push_back(a.value);
    py::gil_scoped_release no_gil;
    inference_ = std::make_unique<Interpreter>(gm_);
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
    const Interpreter* interpreter = inference_.get();
    if (requires_grad) {
      if (!autograd_) {  // made under the GIL, so once
        InterpreterOptions options;
        options.autograd = true;
        autograd_ = std::make_unique<Interpreter>(gm_, options);
      }
      interpreter = autograd_.get();
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

 private:
  py::object module_;  // holds gm_
  const GraphModule& gm_;
  std::vector<at::Tensor> attributes_;  // the graph's, as the interpreters hold them
  std::unique_ptr<const Interpreter> inference_;
  std::unique_ptr<const Interpreter> autograd_;  // the first call under autograd makes it
};

}  // namespace

void register_runner_bindings(py::module_& m, py::class_<GraphModule>& graph_module) {
  py::class_<Runner>(m, "Runner").def("run", &Runner::run, py::arg("inputs"));
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
      });
}

}  // namespace torchcap::python
