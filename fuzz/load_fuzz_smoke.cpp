// The loader's fuzzer in `make test` (ctest load_fuzz_smoke): the harness and
// structure-aware mutator of `make fuzz` (harness.h), built with the usual
// compiler, run for a fixed number of mutants from a fixed seed, so that every
// run checks the same files, in bounded time (about 20 s on the 2-core machine
// it was written on).
// Each mutant is loaded, saved and reloaded, and run on inputs of its recorded
// shapes; a crash, an exception that is not torchcap's or a broken round trip
// fails the test. A mutant that kills the process (SIGFPE, SIGSEGV, SIGBUS,
// SIGABRT) is written to CRASH_FILE on its way out, to reproduce with
// `torchcap run`; one that throws, to CRASH_FILE.findingN.
// With --corpus DIR, the mutants are also written to DIR (each that loaded,
// and one in ten of the others) for fuzz/compare_loaders.py, which gives
// them to the Python loaders and calls what loads (ctest load_fuzz_python).
//
//   load_fuzz_smoke CRASH_FILE [MUTANTS [SEED]] [--corpus DIR]
#include "harness.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

namespace fuzz = torchcap::fuzz;

namespace {

// The mutant being checked, for the signal handler.
const char* crash_file = nullptr;
const std::string* current = nullptr;

// Writes the mutant that killed the process, then dies of the same signal.
// Only async-signal-safe calls.
void keep_the_mutant(int sig) {
  if (crash_file != nullptr && current != nullptr) {
    int fd = ::open(crash_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t written = ::write(fd, current->data(), current->size());
      (void)written;
      ::close(fd);
    }
    const char note[] = "load_fuzz_smoke: a mutant killed the process; it is in CRASH_FILE\n";
    ssize_t shown = ::write(2, note, sizeof note - 1);
    (void)shown;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  std::string corpus;
  if (argc >= 3 && std::string(argv[argc - 2]) == "--corpus") {
    corpus = argv[argc - 1];
    argc -= 2;
  }
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: load_fuzz_smoke CRASH_FILE [MUTANTS [SEED]] [--corpus DIR]\n");
    return 2;
  }
  crash_file = argv[1];
  if (!corpus.empty()) {
    std::filesystem::remove_all(corpus);
    std::filesystem::create_directories(corpus);
  }
  const long mutants = argc > 2 ? std::atol(argv[2]) : 30000;
  const unsigned long long seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 42;
  // Memory is bounded so that a mutant's huge allocation fails (an error the
  // interpreter reports) instead of exhausting the machine. One thread: the
  // same work on any machine, and CI's other tests keep their cores.
  const rlim_t limit = rlim_t{4} << 30;
  rlimit as{limit, limit};
  ::setrlimit(RLIMIT_AS, &as);
  at::set_num_threads(1);
  fuzz::skip_libtorch_backtraces();
  for (int sig : {SIGFPE, SIGSEGV, SIGBUS, SIGABRT, SIGILL}) std::signal(sig, keep_the_mutant);

  const auto start = std::chrono::steady_clock::now();
  std::vector<fuzz::Seed> seeds = fuzz::seed_files();
  // Mutants that load and run join the pool, so that mutations build on
  // each other.
  std::vector<std::string> pool;
  for (const fuzz::Seed& s : seeds) pool.push_back(s.bytes);
  const size_t kMaxPool = 400;
  std::mt19937_64 rng(seed);
  long counts[5] = {0, 0, 0, 0, 0};
  int findings = 0;
  for (long i = 0; i < mutants; ++i) {
    std::string file = pool[rng() % pool.size()];
    if (!fuzz::mutate_structure(file, rng)) continue;
    current = &file;
    at::manual_seed(static_cast<uint64_t>(i));
    try {
      fuzz::Outcome o = fuzz::check_input(reinterpret_cast<const uint8_t*>(file.data()),
                                          file.size(), /*run=*/true);
      ++counts[static_cast<int>(o)];
      const bool ran = o == fuzz::Outcome::Ran || o == fuzz::Outcome::RunFailed;
      if (ran && pool.size() < kMaxPool) pool.push_back(file);
      if (!corpus.empty() && (o != fuzz::Outcome::Refused || i % 10 == 0)) {
        const std::string path = corpus + "/mutant-" + std::to_string(i) + ".tcg";
        std::ofstream(path, std::ios::binary).write(file.data(), static_cast<std::streamsize>(file.size()));
      }
    } catch (const std::exception& e) {
      ++findings;
      const std::string kept = std::string(crash_file) + ".finding" + std::to_string(findings);
      std::ofstream(kept, std::ios::binary)
          .write(file.data(), static_cast<std::streamsize>(file.size()));
      std::printf("FINDING in mutant %ld (kept as %s):\n%s\n", i, kept.c_str(), e.what());
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("load_fuzz_smoke: %zu seeds, %ld mutants (seed %llu) in %.1f s: %ld refused, "
              "%ld loaded and not run, %ld ran, %ld failed to run with torchcap's error, %ld met "
              "a known finding; %d findings\n",
              seeds.size(), mutants, seed, seconds, counts[0], counts[1], counts[2], counts[3],
              counts[4], findings);
  current = nullptr;
  return findings == 0 ? 0 : 1;
}
