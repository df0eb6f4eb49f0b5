// Loads each file named on the command line with the C++ loader and prints
// one line per file: "OK PATH" or "ERR PATH MESSAGE". fuzz/compare_loaders.py
// compares these verdicts with the Python loader's.
#include <torchcap/error.h>
#include <torchcap/serialize.h>

#include <iostream>

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    try {
      torchcap::load(argv[i]);
      std::cout << "OK " << argv[i] << "\n";
    } catch (const torchcap::FormatError& e) {
      std::string message = e.what();
      for (char& c : message) c = c == '\n' ? ' ' : c;
      std::cout << "ERR " << argv[i] << " " << message << "\n";
    }
  }
  return 0;
}
