// torchcap._C's runner: a module's calls run from its C++ graph by the
// interpreter (runner.cpp), for the torch.fx modules of _bridge.py.
#pragma once

#include <torchcap/graph_module.h>

#include <pybind11/pybind11.h>

namespace torchcap::python {

// Adds _C.Runner and GraphModule.runner, fx_specs and placeholder_names.
void register_runner_bindings(pybind11::module_& m, pybind11::class_<GraphModule>& graph_module);

}  // namespace torchcap::python
