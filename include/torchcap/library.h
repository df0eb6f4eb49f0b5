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

}  // namespace torchcap
