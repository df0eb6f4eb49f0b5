// Loads each file named on the command line with the C++ loader and prints
// one line per file: "OK PATH" or "ERR PATH MESSAGE". fuzz/compare_loaders.py
// compares these verdicts with the Python loader's. With --no-checksums first,
// checksums are not verified (the fuzzer's files fail them all).
#include <torchcap/error.h>
#include <torchcap/serialize.h>

#include <cstring>
#include <iostream>

int main(int argc, char** argv) {
  torchcap::LoadOptions options;
  int first = 1;
  if (argc > 1 && std::strcmp(argv[1], "--no-checksums") == 0) {
    options.verify_checksums = false;
    first = 2;
  }
  for (int i = first; i < argc; ++i) {
    try {
      torchcap::load(argv[i], options);
      std::cout << "OK " << argv[i] << "\n";
    } catch (const torchcap::FormatError& e) {
      std::string message = e.what();
      for (char& c : message) c = c == '\n' ? ' ' : c;
      std::cout << "ERR " << argv[i] << " " << message << "\n";
    }
  }
  return 0;
}
