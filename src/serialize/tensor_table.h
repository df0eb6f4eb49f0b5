// The tensor table of a `.tcg` file (docs/FORMAT.md, "tensors"): each entry
// checked, then made a tensor that views the file's bytes where they lie, or
// a meta tensor for a weightless entry. The tensors keep the bytes alive.
#pragma once

#include "serialize/format.h"
#include "serialize/json_cursor.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torchcap::detail {

// The bytes being read. Every loaded tensor holds a reference, so they live
// as long as the last tensor that points into them.
class Bytes {
 public:
  virtual ~Bytes() = default;
  unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }

 protected:
  unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

struct TensorTable {
  std::vector<at::Tensor> tensors;
  std::vector<std::string> names;  // by index, for messages
};

// The table `table` describes, in the file `bytes` whose checked header is
// `h`. `verify_checksums`: check each tensor's CRC-32 (the version must have
// them). Throws FormatError at the first problem, in table order.
TensorTable read_tensor_table(const format::Field& table, const std::shared_ptr<Bytes>& bytes,
                              const format::Header& h, bool verify_checksums);

}  // namespace torchcap::detail
