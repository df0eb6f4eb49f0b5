// Writes the fuzzer's seed corpus (fuzz::seed_files: valid .tcg files of the
// test modules, the example zoo, a training step and the operators the
// argument rule is about). Generated at build time so the repository carries
// no binary files.
//
//   make_fuzz_seeds CORPUS_DIR
#include "harness.h"

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_seeds CORPUS_DIR\n";
    return 2;
  }
  for (const torchcap::fuzz::Seed& seed : torchcap::fuzz::seed_files()) {
    std::ofstream out(std::string(argv[1]) + "/seed_" + seed.name + ".tcg", std::ios::binary);
    out.write(seed.bytes.data(), static_cast<std::streamsize>(seed.bytes.size()));
    if (!out) {
      std::cerr << "cannot write seed " << seed.name << "\n";
      return 1;
    }
  }
  return 0;
}
