// Loads each file named on the command line with the C++ loader and prints
// one line per file: "ERR PATH MESSAGE" if it is refused; else the outcome of
// a run on inputs of its recorded shapes (fuzz/harness.h's property, checked
// here too): "OK PATH" (it ran), "RUNERR PATH" (it failed with one of
// torchcap's errors), "LOADED PATH" (not run: too large to run here), or
// "FINDING PATH MESSAGE".
// fuzz/compare_loaders.py compares these verdicts with the Python loaders'.
// With --no-checksums first, checksums are not verified (the fuzzers' files
// fail them all).
#include "harness.h"

#include <torchcap/error.h>
#include <torchcap/serialize.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

int main(int argc, char** argv) {
  torchcap::LoadOptions options;
  int first = 1;
  if (argc > 1 && std::strcmp(argv[1], "--no-checksums") == 0) {
    options.verify_checksums = false;
    first = 2;
  }
  torchcap::fuzz::skip_libtorch_backtraces();
  for (int i = first; i < argc; ++i) {
    try {
      torchcap::load(argv[i], options);
    } catch (const torchcap::FormatError& e) {
      std::string message = e.what();
      for (char& c : message) c = c == '\n' ? ' ' : c;
      std::cout << "ERR " << argv[i] << " " << message << std::endl;
      continue;
    }
    std::ifstream in(argv[i], std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      const torchcap::fuzz::Outcome o = torchcap::fuzz::check_input(
          reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), /*run=*/true);
      const char* verdict = o == torchcap::fuzz::Outcome::RunFailed ? "RUNERR "
                            : o == torchcap::fuzz::Outcome::Loaded  ? "LOADED "
                                                                    : "OK ";
      std::cout << verdict << argv[i] << std::endl;
    } catch (const std::exception& e) {
      std::string message = e.what();
      for (char& c : message) c = c == '\n' ? ' ' : c;
      std::cout << "FINDING " << argv[i] << " " << message << std::endl;
    }
  }
  return 0;
}
