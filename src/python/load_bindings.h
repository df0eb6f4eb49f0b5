// torchcap._C's part of torchcap.load (torchcap/_load.py).
#pragma once

#include <torchcap/graph_module.h>

#include <pybind11/pybind11.h>

namespace torchcap::python {

// Adds _C.load and GraphModule.placeholder_metas (load_bindings.cpp).
void register_load_bindings(pybind11::module_& m, pybind11::class_<GraphModule>& graph_module);

}  // namespace torchcap::python
