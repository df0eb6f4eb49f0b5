#include "serialize/format.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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

std::string hex_digits(uint32_t v, int width) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*x", width, v);
  return buf;
}

CheckedHeader check_header(const unsigned char* b, uint64_t size, bool verify_checksum) {
  CheckedHeader out;
  auto problem = [&](uint64_t at, std::string what) {
    out.problem_at = at;
    out.problem = std::move(what);
    return out;
  };
  using std::to_string;
  if (size < sizeof kMagic || std::memcmp(b, kMagic, sizeof kMagic) != 0) {
    return problem(0, "not a torchcap graph file (the first 8 bytes are not the .tcg magic)");
  }
  if (size < kBaseHeaderSize) {
    return problem(size, "the file ends after " + to_string(size) + " bytes, inside the " +
                             to_string(kBaseHeaderSize) + "-byte header");
  }
  Header& h = out.header;
  h = decode_header(b, size);
  const std::string version = to_string(h.major) + "." + to_string(h.minor);
  if (h.major != kFormatMajorVersion) {
    return problem(field::kMajor, "format version " + version +
                                      " is not supported; this torchcap reads version " +
                                      to_string(kFormatMajorVersion) + ".x");
  }
  const bool strict = is_known_minor(h.minor);
  const uint64_t header_size = header_size_of(h.minor);
  if (size < header_size) {
    return problem(size, "the file ends after " + to_string(size) + " bytes, inside the " +
                             to_string(header_size) + "-byte header of version " + version);
  }
  // A version this reader knows has exactly the header it defines; a newer
  // one may have a larger header, whose extra fields are skipped.
  if (strict && h.header_size != header_size) {
    return problem(field::kHeaderSize, "header size " + to_string(h.header_size) + " is not " +
                                           to_string(header_size) +
                                           ", the header size of version " + version);
  }
  if (h.header_size < header_size || h.header_size > size) {
    return problem(field::kHeaderSize, "header size " + to_string(h.header_size) +
                                           " is not between " + to_string(header_size) +
                                           " and the file size " + to_string(size));
  }
  // Before any other field is believed: a damaged header is reported as
  // such, not as whichever of its fields the damage hit.
  if (verify_checksum && has_checksums(h.minor)) {
    uint32_t crc = header_crc(b, h.header_size);
    if (crc != h.header_crc) {
      return problem(field::kHeaderCrc, "the header is damaged: its CRC-32 is 0x" +
                                            hex_digits(crc, 8) + ", the header records 0x" +
                                            hex_digits(h.header_crc, 8));
    }
  }
  if (h.file_size != size) {
    return problem(field::kFileSize, "the header gives the file size as " +
                                         to_string(h.file_size) + " bytes but the file has " +
                                         to_string(size) +
                                         (h.file_size > size ? " (truncated)" : " (trailing bytes)"));
  }
  if (h.alignment != kAlignment) {
    return problem(field::kAlignment, "alignment " + to_string(h.alignment) + " is not " +
                                          to_string(kAlignment));
  }
  if (strict && h.flags != 0) {
    return problem(field::kFlags, "unknown flags 0x" + hex_digits(h.flags) + " for version " +
                                      version);
  }
  if (h.json_offset < h.header_size || h.json_offset > size) {
    return problem(field::kJsonOffset, "the JSON section's offset " + to_string(h.json_offset) +
                                           " is not between the end of the header and the "
                                           "end of the file");
  }
  auto past_end = [&](const char* which, uint64_t offset, uint64_t length) {
    return "the " + std::string(which) + " section [" + to_string(offset) + ", +" +
           to_string(length) + ") extends past the end of the file at " + to_string(size);
  };
  if (h.json_size > size - h.json_offset) {
    return problem(field::kJsonSize, past_end("JSON", h.json_offset, h.json_size));
  }
  if (h.json_size > kMaxJsonSize) {
    return problem(field::kJsonSize, "the JSON section is " + to_string(h.json_size) +
                                         " bytes; the format allows at most " +
                                         to_string(kMaxJsonSize));
  }
  const uint64_t json_end = h.json_offset + h.json_size;
  if (h.data_offset % kAlignment != 0 || h.data_offset < json_end || h.data_offset > size) {
    return problem(field::kDataOffset,
                   "the data section's offset " + to_string(h.data_offset) +
                       " is not a multiple of " + to_string(kAlignment) +
                       " between the end of the JSON section at " + to_string(json_end) +
                       " and the end of the file");
  }
  if (h.data_size > size - h.data_offset) {
    return problem(field::kDataSize, past_end("data", h.data_offset, h.data_size));
  }
  return out;
}

const char* dtype_name(c10::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.value == t) return d.name;
  }
  return nullptr;
}

std::optional<c10::ScalarType> dtype_from_name(std::string_view name) {
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

std::optional<double> nonfinite_double_from_string(std::string_view s) {
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
