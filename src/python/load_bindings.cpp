// _C.load: a `.tcg` file read by the C++ loader (torchcap::load), for
// torchcap.load, which makes of it the torch.fx module a trace makes (one
// bridge to torch.fx: _to_fx in torchcap/_trace.py, FxBuilder in module.cpp).
// The Python reader in torchcap/_load.py is what runs without the compiled
// part, and the reference the fuzzer compares this one with.
#include "python/load_bindings.h"

#include <torchcap/error.h>
#include <torchcap/graph_module.h>
#include <torchcap/passes.h>
#include <torchcap/serialize.h>

#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

namespace torchcap::python {
namespace {

namespace py = pybind11;

// The file's module with its attributes as stored: weights are bound by
// torchcap.load, in Python, whose messages name the Python objects given.
// A damaged file raises torchcap.FormatError with the loader's message. The
// shape check may call meta kernels written in Python, which take the GIL
// themselves (Note [Kernels written in Python] in serialize/shapes.h).
GraphModule load_file(const std::string& path, bool verify_checksums, bool check_shapes) {
  LoadOptions options;
  options.verify_checksums = verify_checksums;
  options.check_shapes = check_shapes;
  py::gil_scoped_release no_gil;
  return load(path, options);
}

// (dtype, sizes, strides) of each placeholder's recorded tensor, or None
// where the file records none: what a call's inputs are held to. In a
// dynamic graph, a size that depends on the symbols is None, and so are the
// strides of a tensor with such a size (symbol_values checks those).
py::list placeholder_metas(const GraphModule& gm) {
  py::list out;
  for (const Node* n : gm.graph().nodes()) {
    if (n->op() != OpCode::Placeholder) continue;
    const ValueMeta& v = n->meta().val;
    if (v.kind != ValueKind::Tensor || v.tensors.size() != 1) {
      out.append(py::none());
      continue;
    }
    const TensorMeta& t = v.tensors[0];
    py::object dtype = py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(t.dtype)));
    if (t.symbolic != nullptr) {
      py::tuple sizes(t.sizes.size());
      for (size_t d = 0; d < t.sizes.size(); ++d) {
        sizes[d] = t.symbolic->sizes[d].is_constant() ? py::object(py::int_(t.sizes[d])) : py::none();
      }
      out.append(py::make_tuple(dtype, sizes, py::none()));
      continue;
    }
    out.append(py::make_tuple(dtype, py::tuple(py::cast(c10::IntArrayRef(t.sizes).vec())),
                              py::tuple(py::cast(c10::IntArrayRef(t.strides).vec()))));
  }
  return out;
}

// Note [Attributes of a loaded module]: torchcap.load gives the module just
// loaded, before anything else holds it, the tensors its torch.fx module is
// to hold (the weights bound, parameters made nn.Parameters), so that the C++
// graph and the torch.fx module share them as a trace's do. Only then: a
// module in use is never changed (copies of a torch.fx module share it).
void set_loaded_attributes(GraphModule& gm,
                           const std::vector<std::pair<std::string, py::object>>& tensors) {
  for (const auto& [name, t] : tensors) {
    const AttributeKind kind = gm.attribute(name).kind;
    gm.set_attribute(name, t.is_none() ? at::Tensor() : THPVariable_Unpack(t.ptr()), kind);
  }
}

}  // namespace

void register_load_bindings(py::module_& m, py::class_<GraphModule>& graph_module) {
  m.def("load", &load_file, py::arg("path"), py::arg("verify_checksums"), py::arg("check_shapes"),
        "The module of a .tcg file, its attributes as stored (torchcap.load binds weights)");
  graph_module.def("placeholder_metas", &placeholder_metas);
  graph_module.def("is_dynamic", &GraphModule::is_dynamic);
  // Raises InputError unless the tensors fit a dynamic graph's ranges and
  // expressions (passes.h symbol_values); returns the symbols' values.
  graph_module.def("check_sizes", [](const GraphModule& gm, const std::vector<at::Tensor>& inputs) {
    return symbol_values(gm, inputs);
  });
  graph_module.def("set_loaded_attributes", &set_loaded_attributes);
}

}  // namespace torchcap::python
