// libFuzzer target over the loader (`make fuzz`).
//
// The property: any bytes either load or throw FormatError, without a crash,
// a sanitizer report, a hang or an unbounded allocation; and whatever loads
// can be saved again and reloads to a module that prints the same. Any other
// exception escapes and aborts, so libFuzzer reports it.
//
// Most of a .tcg file is JSON whose length the header records, so plain byte
// mutations that insert or erase bytes would almost always stop at the
// file-size check. The custom mutator below therefore mutates one section at
// a time and rewrites the header to fit, most of the time; the rest of the
// time it mutates the raw bytes, so the header checks are fuzzed as well.
//
// Mutated files fail their checksums (FORMAT.md, version 1.1) at once, so each
// input is loaded twice: as users load it, which reaches the checksum checks,
// and with the checksums off, which reaches everything behind them.
#include <torchcap/error.h>
#include <torchcap/serialize.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

// The header size of the file's version: 64 bytes in 1.0, 72 from 1.1.
size_t header_size(const uint8_t* b) { return b[10] == 0 && b[11] == 0 ? 64 : 72; }
const char kMagic[8] = {'\x89', 'T', 'C', 'G', '\r', '\n', '\x1a', '\n'};

uint64_t get(const uint8_t* b, size_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(b[offset + i]) << (8 * i);
  return v;
}

void put(std::string& b, size_t offset, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) b[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

// The file with a header that agrees with its sections (docs/FORMAT.md).
std::string pack(const uint8_t* header, const std::string& json, const std::string& data) {
  const size_t header_len = header_size(header);
  std::string b(reinterpret_cast<const char*>(header), header_len);
  uint64_t data_at = (header_len + json.size() + 63) / 64 * 64;
  put(b, 16, data_at + data.size(), 8);
  put(b, 24, header_len, 8);
  put(b, 32, json.size(), 8);
  put(b, 40, data_at, 8);
  put(b, 48, data.size(), 8);
  b += json;
  b.resize(data_at, '\0');
  return b + data;
}

// Mutates `s` in place with libFuzzer's own mutations, allowing it to grow.
void mutate(std::string& s, size_t room) {
  size_t size = s.size();
  s.resize(size + room);
  size_t n = LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(s.data()), size, s.size());
  s.resize(n);
}

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "load_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::minstd_rand rng(seed);
  if (size >= 72 && std::memcmp(data, kMagic, 8) == 0 && rng() % 8 != 0) {
    uint64_t json_at = get(data, 24, 8), json_size = get(data, 32, 8);
    uint64_t data_at = get(data, 40, 8), data_size = get(data, 48, 8);
    if (json_at <= size && json_size <= size - json_at && data_at <= size &&
        data_size <= size - data_at) {
      std::string json(reinterpret_cast<const char*>(data + json_at), json_size);
      std::string bytes(reinterpret_cast<const char*>(data + data_at), data_size);
      if (rng() % 4 != 0) {
        mutate(json, 64);
      } else {
        mutate(bytes, 64);
      }
      std::string out = pack(data, json, bytes);
      if (out.size() <= max_size) {
        std::memcpy(data, out.data(), out.size());
        return out.size();
      }
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    torchcap::load_from_buffer(data, size, "fuzz");
  } catch (const torchcap::FormatError&) {
  }
  torchcap::GraphModule gm;
  torchcap::LoadOptions unchecked;
  unchecked.verify_checksums = false;
  try {
    gm = torchcap::load_from_buffer(data, size, "fuzz", unchecked);
  } catch (const torchcap::FormatError&) {
    return 0;
  }
  const std::string printed = gm.str();
  std::string again;
  try {
    again = torchcap::save_to_string(gm);
  } catch (const torchcap::FormatError& e) {
    die("a module the loader accepted cannot be saved", e.what());
  }
  try {
    torchcap::GraphModule reloaded = torchcap::load_from_buffer(again.data(), again.size());
    if (reloaded.str() != printed) die("the module prints differently after a round trip", printed);
  } catch (const torchcap::FormatError& e) {
    die("a saved module does not load", e.what());
  }
  return 0;
}
