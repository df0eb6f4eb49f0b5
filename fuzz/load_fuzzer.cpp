// libFuzzer target over the loader (`make fuzz`).
//
// The property is fuzz::check_input's (harness.h): any bytes either load or
// throw FormatError, without a crash, a sanitizer report, a hang or an
// unbounded allocation; whatever loads can be saved again and reloads to a
// module that prints the same; and it runs on inputs of its recorded shapes
// or fails with one of torchcap's errors. Anything else aborts, so libFuzzer
// reports it.
//
// Three kinds of mutation. Most of a .tcg file is JSON whose length the
// header records, so plain byte mutations that insert or erase bytes would
// almost always stop at the file-size check; the custom mutator therefore
// (1) mostly changes the graph itself and recomputes every checksum (Note
// [Mutating a file's graph]: the hostile files a checksum cannot tell from
// good ones), (2) else mutates one section's bytes with libFuzzer's own
// mutations and rewrites the header to fit (damage, which fails the
// checksums: check_input also loads each input with them off), and (3) now
// and then mutates the raw bytes, so the header checks are fuzzed as well.
#include "harness.h"

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

bool fits(const std::string& out, uint8_t* data, size_t max_size) {
  if (out.size() > max_size) return false;
  std::memcpy(data, out.data(), out.size());
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torchcap::fuzz::skip_libtorch_backtraces();
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::mt19937_64 rng(seed);
  if (size >= 72 && std::memcmp(data, kMagic, 8) == 0 && rng() % 8 != 0) {
    if (rng() % 3 != 0) {
      std::string file(reinterpret_cast<const char*>(data), size);
      if (torchcap::fuzz::mutate_structure(file, rng) && fits(file, data, max_size)) {
        return file.size();
      }
    }
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
      if (fits(out, data, max_size)) return out.size();
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    torchcap::fuzz::check_input(data, size, /*run=*/true);
  } catch (const torchcap::fuzz::Finding& f) {
    std::fprintf(stderr, "load_fuzzer: %s\n", f.what());
    std::abort();
  }
  return 0;
}
