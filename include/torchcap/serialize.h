// Saving a GraphModule to a `.tcg` file and loading it back (docs/FORMAT.md).
//
// A file holds the graph, its metadata, its specs and its attribute tensors.
// Loading verifies everything before building anything the caller sees, and
// reports the first problem as a FormatError naming it and its byte offset
// ("model.tcg: byte 8: format version 2.0 is not supported ..."). A damaged or
// hostile file never crashes the loader, never makes it hang, and never makes
// it allocate more than a small multiple of the file's size.
//
// Ownership of loaded tensors: `load` maps the file copy-on-write and the
// attribute tensors point into the mapping without copying. Each tensor holds
// a reference to the mapping, which is unmapped when the last of them goes;
// the file may be renamed or deleted meanwhile. Writing to a loaded tensor
// changes the process's private copy of that page, never the file. Truncating
// the file while it is loaded is not supported: the kernel raises SIGBUS on
// access to pages past the new end.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/module_state.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchcap {

// The format version this build writes. A reader accepts files of its major
// version with any minor version (minor versions only add optional content).
inline constexpr uint16_t kFormatMajorVersion = 1;
// Version 1.1 added checksums, 1.2 source lines in stack frames and module
// stacks, 1.3 weightless tensors (saved without their values), 1.4 dynamic
// graphs (symbolic.h), 1.5 the calling convention, 1.6 numbers given for
// Tensor parameters (a Python number in `x + 0.5`); files of every earlier
// version are still read. Each file is written in the oldest version that
// holds it (1.2 for a module with none of these), which older readers read too.
inline constexpr uint16_t kFormatMinorVersion = 6;

struct LoadOptions {
  // Check the CRC-32 checksums a file of version 1.1 or later carries: of its
  // header, of its JSON section and of each tensor's bytes, so that damage
  // (a flipped bit on a disk, a file cut and patched by a transfer) is
  // reported instead of becoming a wrong weight. This reads every byte of the
  // file once at load (docs/benchmarks.md has what that costs, measured by
  // `make bench`). Off, tensor pages are read only when first used and damage
  // to their bytes goes unnoticed; every structural check still runs.
  bool verify_checksums = true;
  // Run each operator node on meta tensors of its inputs' recorded shapes,
  // and refuse a file whose operators fail there or give other dtypes or
  // sizes than the file records (docs/FORMAT.md, "Shapes"; about a
  // microsecond per node, measured by `make bench`). Off, such a file loads
  // and fails at its first run, with an error naming the node; the checks of
  // the arguments some kernels would not survive (which kill the process,
  // not throw) run either way.
  bool check_shapes = true;
  // Values for the module's attributes, by name (a state dict's names,
  // "layer1.0.conv1.weight"): bound after loading with
  // GraphModule::bind_weights, which checks each one's dtype and sizes. A
  // weightless file (saved from a model on the meta device) needs one for
  // each weightless tensor; without any, it loads with meta tensors, which
  // can be shown and saved but not run. Weights for attributes the file
  // stores replace the stored tensors. Errors are WeightErrors naming every
  // missing, extra and mismatched weight.
  NamedTensors weights;
  // Refuse a weight that names no attribute of the module. Off, such weights
  // are ignored (a full state dict for a graph that reads only part of it).
  bool strict_weights = true;
};

// Writes `gm` to `path`. The bytes go to a temporary file in the same
// directory, which is flushed to disk and then renamed over `path`: a crash
// leaves either the old file or the new one under that name, never half of
// one. Throws FormatError if the module cannot be stored (a non-CPU or
// quantized tensor, a string that is not UTF-8) or the file cannot be written.
void save(const GraphModule& gm, const std::string& path);

// The bytes `save` would write.
std::string save_to_string(const GraphModule& gm);

// Reads and verifies a file written by `save`. Throws FormatError, and
// WeightError when LoadOptions::weights do not fit.
GraphModule load(const std::string& path, const LoadOptions& options = {});

// The parameters and buffers of a model by name, for LoadOptions::weights:
//   torchcap::load("gpt.tcg", {.weights = torchcap::named_tensors(torchcap::ModuleState::of(*model))})
NamedTensors named_tensors(const ModuleState& state);

// The same, from bytes in memory. The bytes are copied once into an aligned
// block that the tensors then share, so `data` may be freed afterwards.
// `source` names the bytes in error messages.
GraphModule load_from_buffer(const void* data, size_t size, const std::string& source = "buffer",
                             const LoadOptions& options = {});

}  // namespace torchcap
