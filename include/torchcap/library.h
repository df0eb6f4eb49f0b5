// Operator libraries: shared objects that register custom operators with
// LibTorch's dispatcher when loaded (torchvision's `_C*.so` defines
// torchvision::nms, torchvision::roi_align, ...), as torch.ops.load_library
// does in Python.
//
// Load a library before torch::jit::load of a model that calls its operators,
// before tracing such a program, and before loading or running a saved graph
// that records them: the tracer records them like aten operators
// (`torchvision::nms`), the interpreter runs them, the Python code names them
// `torch.ops.torchvision.nms.default`.
#pragma once

#include <string>

namespace torchcap {

// Loads the shared object at `path` for good (it is never unloaded: the
// operators it registers must outlive every graph that uses them). Loading the
// same library twice does nothing. Throws torchcap::Error naming the library
// and the loader's reason when it cannot be loaded.
void load_library(const std::string& path);

// Note [Operator libraries found by their namespace]: loads the library that
// defines the operators of namespace `ns` from where its Debian package
// installs it, for the namespaces torchcap knows: "torchvision" (the _C*.so
// inside the python3-torchvision package, which links only LibTorch). Returns
// whether it loaded one now; false when `ns` is not one of those, its
// library was loaded before, or the package is not installed. The loaders
// call it for an operator they do not find, as `torchcap trace` does for a
// TorchScript file; a program that links or loads the library itself never
// needs it.
bool load_library_of_namespace(const std::string& ns);

// Where load_library_of_namespace looks for namespace `ns`'s library, for
// messages ("" when torchcap knows no place for it).
std::string library_location_of_namespace(const std::string& ns);

}  // namespace torchcap
