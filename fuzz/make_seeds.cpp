// Writes the fuzzer's seed corpus: valid .tcg files of the test modules.
// Generated at build time so the repository carries no binary files.
//
//   make_fuzz_seeds CORPUS_DIR
#include <torchcap/serialize.h>

#include "serialize_fixtures.h"

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_seeds CORPUS_DIR\n";
    return 2;
  }
  namespace t = torchcap::testing;
  const std::pair<const char*, torchcap::GraphModule> seeds[] = {
      {"small", t::small_module()},
      {"arguments", t::every_argument_module()},
      {"nested", t::nested_spec_module()},
      {"attributes", t::attribute_zoo_module()},
      {"signature", t::signature_module()},
      {"weightless", t::weightless_module()},
  };
  for (const auto& [name, gm] : seeds) {
    std::string bytes = torchcap::save_to_string(gm);
    std::ofstream out(std::string(argv[1]) + "/seed_" + name + ".tcg", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::cerr << "cannot write seed " << name << "\n";
      return 1;
    }
  }
  return 0;
}
