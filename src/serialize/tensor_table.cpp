#include "serialize/tensor_table.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

namespace torchcap::detail {
namespace {

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The bytes a view covers, from its first to its last element; false on overflow.
bool byte_span(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
               size_t item, uint64_t& out) {
  for (int64_t s : sizes) {
    if (s == 0) {
      out = 0;
      return true;
    }
  }
  uint64_t span = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    uint64_t step;
    if (__builtin_mul_overflow(static_cast<uint64_t>(sizes[d] - 1),
                               static_cast<uint64_t>(strides[d]), &step) ||
        __builtin_add_overflow(span, step, &span)) {
      return false;
    }
  }
  // LibTorch counts elements and bytes in int64_t.
  if (__builtin_mul_overflow(span, item, &out) ||
      out > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return false;
  }
  // The number of elements must fit too, even where strides overlap.
  uint64_t numel = 1;
  for (int64_t s : sizes) {
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(s), &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
  }
  return true;
}

// What one entry says, once checked.
struct Described {
  c10::ScalarType type;
  std::vector<int64_t> sizes, strides;
};

// Note [Weightless tensors] in format.h: an entry with its metadata only,
// which becomes a meta tensor (no memory) for LoadOptions::weights to bind.
at::Tensor weightless(const format::Field& t, format::Object& entry, const format::Field& flag,
                      const Described& d) {
  if (!flag.is_boolean() || !flag.boolean()) {
    flag.fail(std::string("expected true, got ") +
              (flag.is_boolean() ? "false" : flag.type_name()));
  }
  for (const char* key : {"offset", "length", "crc32"}) {
    if (entry.has(key)) {
      format::Field(t, key).fail("a weightless tensor has no bytes in the file, so no '" +
                                 std::string(key) + "'");
    }
  }
  uint64_t span = 0;
  if (!byte_span(d.sizes, d.strides, c10::elementSize(d.type), span)) {
    t.fail("sizes " + list_str(d.sizes) + " with strides " + list_str(d.strides) +
           " span more bytes than 64 bits can count");
  }
  return at::empty_strided(d.sizes, d.strides,
                           at::TensorOptions().dtype(d.type).device(c10::kMeta));
}

}  // namespace

TensorTable read_tensor_table(const format::Field& table, const std::shared_ptr<Bytes>& bytes,
                              const format::Header& h, bool verify_checksums) {
  const format::FileInfo& file = table.cursor().file();
  const bool checksums = format::has_checksums(h.minor);
  TensorTable out;
  std::set<std::string> names;
  // (offset, length, index) of every non-empty tensor, to find overlaps.
  std::vector<std::tuple<uint64_t, uint64_t, size_t>> ranges;
  std::vector<uint64_t> starts;  // of each entry, for messages
  table.elements([&](const format::Field& element) {
    const size_t i = element.index();
    starts.push_back(element.offset());
    format::Entry e{&file, element.offset(), "tensors", nullptr, i};
    format::Field t = element.in(e);
    format::Object entry = t.object();
    entry.check_keys(format::keys::kTensor);
    format::Field name_field = entry.get("name");
    const std::string name(name_field.string());
    if (name.empty()) name_field.fail("the name is empty");
    e.noun = "tensor";
    e.name = &name;
    if (!names.insert(name).second) name_field.fail("a second tensor has this name");

    Described d;
    format::Field dtype = entry.get("dtype");
    d.type = dtype.dtype();
    if (!format::is_storable_dtype(d.type)) {
      dtype.fail(std::string("tensors of dtype ") + format::dtype_name(d.type) +
                 " cannot be stored in the data section");
    }
    entry.get("sizes").dims(true, d.sizes);
    format::Field strides_field = entry.get("strides");
    strides_field.dims(true, d.strides);
    if (d.strides.size() != d.sizes.size()) {
      strides_field.fail(std::to_string(d.strides.size()) + " strides for " +
                         std::to_string(d.sizes.size()) + " dimensions");
    }
    if (std::optional<format::Field> flag = entry.find("weightless")) {
      out.tensors.push_back(weightless(t, entry, *flag, d));
      out.names.push_back(name);
      entry.close();
      return;
    }
    format::Field offset_field = entry.get("offset");
    const uint64_t offset = static_cast<uint64_t>(offset_field.non_negative());
    format::Field length_field = entry.get("length");
    const uint64_t length = static_cast<uint64_t>(length_field.non_negative());
    uint32_t recorded_crc = 0;
    if (checksums) {
      format::Field crc_field = entry.get("crc32");
      int64_t crc = crc_field.non_negative();
      if (crc > int64_t{0xffffffff}) {
        crc_field.fail("CRC-32 " + std::to_string(crc) + " does not fit in 32 bits");
      }
      recorded_crc = static_cast<uint32_t>(crc);
    }
    entry.close();

    uint64_t expected = 0;
    if (!byte_span(d.sizes, d.strides, c10::elementSize(d.type), expected)) {
      t.fail("sizes " + list_str(d.sizes) + " with strides " + list_str(d.strides) +
             " span more bytes than 64 bits can count");
    }
    if (length != expected) {
      length_field.fail("byte length " + std::to_string(length) + " does not match dtype " +
                        format::dtype_name(d.type) + ", sizes " + list_str(d.sizes) +
                        " and strides " + list_str(d.strides) + ", which span " +
                        std::to_string(expected) + " bytes");
    }
    if (offset % format::kAlignment != 0) {
      offset_field.fail("offset " + std::to_string(offset) + " is not a multiple of " +
                        std::to_string(format::kAlignment));
    }
    if (offset > h.data_size || length > h.data_size - offset) {
      t.fail("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
             ") of the data section extend past its end at " + std::to_string(h.data_size));
    }
    if (length > 0) ranges.emplace_back(offset, length, i);

    unsigned char* data = bytes->data() + h.data_offset + offset;
    if (verify_checksums) {
      uint32_t crc = format::crc32(data, length);
      if (crc != recorded_crc) {
        format::fail_at(file, h.data_offset + offset,
                        e.label() + ": its bytes are damaged: their CRC-32 is 0x" +
                            format::hex_digits(crc, 8) + ", the tensor table records 0x" +
                            format::hex_digits(recorded_crc, 8));
      }
    }
    // A bool that is neither 0 nor 1 is undefined behaviour in the kernels
    // that read it; bool tensors are small, so their bytes are checked.
    if (d.type == c10::ScalarType::Bool) {
      for (uint64_t k = 0; k < length; ++k) {
        if (data[k] > 1) {
          format::fail_at(file, h.data_offset + offset + k,
                          e.label() + ": bool byte " + std::to_string(data[k]) +
                              " is neither 0 nor 1");
        }
      }
    }
    std::shared_ptr<Bytes> keep = bytes;
    out.tensors.push_back(at::from_blob(
        data, d.sizes, d.strides, [keep](void*) mutable { keep.reset(); },
        at::TensorOptions().dtype(d.type)));
    out.names.push_back(name);
  });
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    auto [prev_offset, prev_length, prev_index] = ranges[k - 1];
    auto [offset, length, index] = ranges[k];
    if (offset < prev_offset + prev_length) {
      // Named at the later of the two table entries, as if read in order.
      const size_t later = std::max(index, prev_index), earlier = std::min(index, prev_index);
      format::Entry e{&file, starts[later], "tensors", nullptr, later};
      e.noun = "tensor";
      e.name = &out.names[later];
      e.fail("", "its bytes overlap those of tensor '" + out.names[earlier] + "'");
    }
  }
  return out;
}

}  // namespace torchcap::detail
