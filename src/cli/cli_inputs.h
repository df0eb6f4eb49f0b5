// Inputs given on the command line: shapes to fill with random values, or
// files holding tensors.
#pragma once

#include <torchcap/graph_module.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace torchcap::cli {

// One `--input` value: "1x3x224x224", "1x3x224x224:float32", "scalar:int64",
// or the path of a file written by Python's torch.save(tensor). Random values
// come from the generator, seeded once per command.
at::Tensor parse_input(const std::string& spec);

// Random inputs shaped like the graph's placeholders.
std::vector<at::Tensor> random_inputs_for(const GraphModule& gm);

// A tensor from a file written by torch.save (Python) or torchcap.
at::Tensor load_tensor_file(const std::string& path);

// The dtype named by `name` ("float32", "f32", "float", "int64", ...).
c10::ScalarType parse_dtype(const std::string& name);

// "float32" for float, and so on.
std::string dtype_name(c10::ScalarType t);

}  // namespace torchcap::cli
