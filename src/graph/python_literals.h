// Python spellings of torchcap's constants, shared by the graph listing and the
// Python code generator.
#pragma once

#include <torchcap/argument.h>
#include <torchcap/node.h>

#include <functional>
#include <string>

namespace torchcap {
namespace detail {

std::string python_string_literal(const std::string& s);
// A double as Python's repr() prints it: 1.0, 0.1, 1e-05, inf, nan.
std::string python_float_repr(double v);
// "float32" for torch.float32; nullptr if Python has no name for it.
const char* torch_dtype_name(c10::ScalarType t);
const char* torch_layout_name(c10::Layout l);
const char* torch_memory_format_name(c10::MemoryFormat m);
std::string python_device_literal(c10::Device d);
// `a` as Python source; node references spelled by `node`.
std::string python_literal(const Argument& a, const std::function<std::string(const Node*)>& node);

}  // namespace detail
}  // namespace torchcap
