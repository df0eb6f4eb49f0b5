#include "serialize/format.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace torchcap::format {
namespace {

void put(char* out, uint64_t offset, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t get(const unsigned char* in, uint64_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(in[offset + i]) << (8 * i);
  return v;
}

constexpr uint64_t kCanonicalNan = 0x7ff8000000000000ULL;

}  // namespace

uint32_t crc32(const void* data, uint64_t size, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  // crc32_z takes a size_t; chunks keep it exact wherever size_t is narrower.
  constexpr uint64_t kChunk = uint64_t{1} << 30;
  while (size > 0) {
    uint64_t n = std::min(size, kChunk);
    crc = static_cast<uint32_t>(::crc32_z(crc, p, static_cast<z_size_t>(n)));
    p += n;
    size -= n;
  }
  return crc;
}

uint32_t header_crc(const unsigned char* header, uint64_t header_size) {
  uint32_t crc = crc32(header, field::kHeaderCrc);
  const uint64_t after = field::kHeaderCrc + 4;
  return header_size > after ? crc32(header + after, header_size - after, crc) : crc;
}

void encode_header(const Header& h, char* out) {
  std::memcpy(out + field::kMagic, kMagic, sizeof(kMagic));
  put(out, field::kMajor, h.major, 2);
  put(out, field::kMinor, h.minor, 2);
  put(out, field::kHeaderSize, h.header_size, 4);
  put(out, field::kFileSize, h.file_size, 8);
  put(out, field::kJsonOffset, h.json_offset, 8);
  put(out, field::kJsonSize, h.json_size, 8);
  put(out, field::kDataOffset, h.data_offset, 8);
  put(out, field::kDataSize, h.data_size, 8);
  put(out, field::kAlignment, h.alignment, 4);
  put(out, field::kFlags, h.flags, 4);
  if (h.header_size >= kHeaderSize) {
    put(out, field::kJsonCrc, h.json_crc, 4);
    put(out, field::kHeaderCrc,
        header_crc(reinterpret_cast<const unsigned char*>(out), h.header_size), 4);
  }
}

Header decode_header(const unsigned char* in, uint64_t available) {
  Header h;
  h.major = static_cast<uint16_t>(get(in, field::kMajor, 2));
  h.minor = static_cast<uint16_t>(get(in, field::kMinor, 2));
  h.header_size = static_cast<uint32_t>(get(in, field::kHeaderSize, 4));
  h.file_size = get(in, field::kFileSize, 8);
  h.json_offset = get(in, field::kJsonOffset, 8);
  h.json_size = get(in, field::kJsonSize, 8);
  h.data_offset = get(in, field::kDataOffset, 8);
  h.data_size = get(in, field::kDataSize, 8);
  h.alignment = static_cast<uint32_t>(get(in, field::kAlignment, 4));
  h.flags = static_cast<uint32_t>(get(in, field::kFlags, 4));
  if (available >= kHeaderSize) {
    h.json_crc = static_cast<uint32_t>(get(in, field::kJsonCrc, 4));
    h.header_crc = static_cast<uint32_t>(get(in, field::kHeaderCrc, 4));
  }
  return h;
}

const char* dtype_name(c10::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.value == t) return d.name;
  }
  return nullptr;
}

std::optional<c10::ScalarType> dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.value;
  }
  return std::nullopt;
}

bool is_storable_dtype(c10::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.value == t) return d.storable;
  }
  return false;
}

const Keys& spec_keys(TreeSpec::Kind k) {
  switch (k) {
    case TreeSpec::Kind::Leaf:
    case TreeSpec::Kind::None:
      return keys::kLeafSpec;
    case TreeSpec::Kind::Constant:
      return keys::kConstantSpec;
    case TreeSpec::Kind::Tuple:
    case TreeSpec::Kind::List:
      return keys::kSequenceSpec;
    case TreeSpec::Kind::Dict:
      return keys::kDictSpec;
  }
  return keys::kLeafSpec;
}

std::string nonfinite_double_string(double d) {
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  if (bits == kCanonicalNan) return "nan";
  static const char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 15; i >= 0; --i) s += kHex[(bits >> (4 * i)) & 0xf];
  return s;
}

std::optional<double> nonfinite_double_from_string(const std::string& s) {
  uint64_t bits;
  if (s == "inf") {
    bits = 0x7ff0000000000000ULL;
  } else if (s == "-inf") {
    bits = 0xfff0000000000000ULL;
  } else if (s == "nan") {
    bits = kCanonicalNan;
  } else if (s.size() == 18 && s[0] == '0' && s[1] == 'x') {
    bits = 0;
    for (size_t i = 2; i < s.size(); ++i) {
      char c = s[i];
      int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (v < 0) return std::nullopt;
      bits = bits << 4 | static_cast<uint64_t>(v);
    }
  } else {
    return std::nullopt;
  }
  double d;
  std::memcpy(&d, &bits, sizeof d);
  // Only values JSON numbers cannot carry: a finite double must be a number.
  if (std::isfinite(d)) return std::nullopt;
  return d;
}

}  // namespace torchcap::format
