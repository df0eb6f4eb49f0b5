// Inputs given on the command line: shapes to fill with random values, or
// files holding tensors.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/tracer.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace torchcap::cli {

// Whether `path` names a regular file (an --input or --target given as a
// file rather than a shape).
bool is_file(const std::string& path);

// One `--input` value: "1x3x224x224", "1x3x224x224:float32", "scalar:int64",
// or the path of a file written by Python's torch.save(tensor). Random values
// come from the generator, seeded once per command. With `shapes_only` (a
// meta-mode trace), a shape gives a meta tensor: no values at all. A shape
// without a dtype makes a tensor of `dtype` (float32 unless given: `run`
// gives each input its placeholder's dtype, so an int64 graph gets integers,
// from 0 to 9).
at::Tensor parse_input(const std::string& spec, bool shapes_only = false,
                       c10::ScalarType dtype = c10::kFloat);

// One `--dynamic` value: INPUT:DIM[=NAME][[MIN:MAX]], e.g. `0:0=batch[1:64]`,
// `0:1=seq`, `0:0=batch[2:]` (no maximum), `1:-1`. Errors quote the value
// and say what was expected.
DynamicDim parse_dynamic(const std::string& spec);

// Random inputs shaped like the graph's placeholders.
std::vector<at::Tensor> random_inputs_for(const GraphModule& gm);

// `run`'s inputs, one per placeholder, from its `--input` values: in order,
// or by name as NAME=VALUE, NAME a placeholder's (`x`, `xs_0`) or an
// argument's (positional or keyword: `scale`). An argument holding a
// structure takes a torch.save'd file of it. A shape without a dtype takes
// its placeholder's. Errors name the input that is missing, unknown or given
// twice, and list the names there are.
std::vector<at::Tensor> run_inputs_for(const GraphModule& gm, const std::vector<std::string>& specs);

// A tensor from a file written by torch.save (Python) or torchcap.
at::Tensor load_tensor_file(const std::string& path);

// Any value from a file written by torch.save: a tensor, a number, a list, a
// tuple or a dict of them. Files that are not such an archive, or hold Python
// objects LibTorch cannot read, are refused by name.
c10::IValue load_value_file(const std::string& path);

// Whether a file written by torch.save holds an OrderedDict at its top (what
// `state_dict()` returns), which LibTorch 1.13's unpickler cannot build.
bool holds_ordered_dict(const std::string& path);

// One `--input` for a parameter of a TorchScript forward, read by the
// parameter's declared type:
//   Tensor           a shape (random values) or a torch.save'd tensor file
//   int, float, bool a literal: 3, 0.5, 1e-3, true, false
//   List[int|float|bool]   1,2,3 (or [1,2,3] where the shell and CLI11 leave it whole)
//   str              the text itself
//   Optional[T]      `none`, or what T accepts
//   anything else    a torch.save'd file holding a value of that type
// Errors name the parameter, its type, and what was given.
c10::IValue parse_argument(const std::string& spec, const c10::Argument& parameter,
                           bool shapes_only = false);

// "x: Tensor", "mask: Optional[Tensor] = None", "steps: int = 3".
std::string describe_parameter(const c10::Argument& parameter);

// The dtype named by `name` ("float32", "f32", "float", "int64", ...).
c10::ScalarType parse_dtype(const std::string& name);

// "a dict", "a list", "an int", ... for messages.
std::string kind_of(const c10::IValue& v);

// "float32" for float, and so on.
std::string dtype_name(c10::ScalarType t);

}  // namespace torchcap::cli
