// torchcap._C's part of the Python loader (torchcap/_load.py).
#pragma once

#include <pybind11/pybind11.h>

namespace torchcap::python {

// Adds _C.read_graph (load_bindings.cpp) to `m`.
void register_load_bindings(pybind11::module_& m);

}  // namespace torchcap::python
