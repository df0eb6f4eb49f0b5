// What the loader's fuzzers share: the property they check on each input, the
// structure-aware mutation of a file's graph, and the seeds they start from.
// Built into the libFuzzer target (load_fuzzer.cpp, `make fuzz`: clang and
// AddressSanitizer) and into the bounded run that `make test` makes
// (load_fuzz_smoke.cpp, the usual compiler).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace torchcap::fuzz {

// A broken promise: the message says which, and what happened.
class Finding : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Outcome {
  Refused,    // the loader refused it (FormatError): the usual fate of a mutant
  Loaded,     // loaded; not run (no recorded inputs, or too large to run here)
  Ran,        // loaded and ran
  RunFailed,  // loaded; running it failed with one of torchcap's errors
  Known,      // loaded; running it met a known finding (kKnownFindings in harness.cpp)
};

// The property: any bytes either load or are refused with a FormatError,
// with checksums verified and without; what loads saves, reloads and prints
// the same; and, when `run`, it runs on inputs of its recorded shapes or fails
// with one of torchcap's errors. Throws Finding otherwise; any other
// exception escapes (a finding too), but for the known findings not fixed yet.
// A crash is a crash.
Outcome check_input(const uint8_t* data, size_t size, bool run);

// Note [Mutating a file's graph]: takes `file` (a .tcg file) apart, changes
// one to three things in its nodes — an integer argument (to 0, -1, 2^31,
// 2^62, ...), a list's length, a dtype, layout, device or memory format, a
// reference to another node (aliasing) or a constant in its place, a node's
// recorded metadata — and puts it together again with its checksums
// recomputed: a hostile file, as one made by hand would be. False (and
// `file` unchanged) if `file` is not a file it can take apart.
bool mutate_structure(std::string& file, std::mt19937_64& rng);

// Makes LibTorch's errors cheap: most mutants end in one, and symbolizing its
// backtrace took two thirds of the fuzzers' time. Call once, first.
void skip_libtorch_backtraces();

struct Seed {
  std::string name;
  std::string bytes;  // a valid .tcg file
};

// Valid files of the test modules (every argument kind, specs, attributes,
// signature, weightless), of the example zoo's small programs traced, of a
// training step, and of a traced program of the operators whose arguments
// Note [Integers kernels divide by] is about. Made when called (tracing
// takes a second or two); the repository carries no binary files.
std::vector<Seed> seed_files();

}  // namespace torchcap::fuzz
