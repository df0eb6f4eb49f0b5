// Timing helpers for the benchmarks: medians of repeated runs after warm-up,
// printed as `name: value unit` lines. Figures, not assertions: this machine
// is shared and noisy, so comparisons are made side by side in one run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <malloc.h>
#include <sys/resource.h>
#include <time.h>

namespace torchcap::bench {

// Median seconds per call of `fn` over `runs` runs, each run `iters` calls,
// after `warmup` calls.
inline double median_seconds(const std::function<void()>& fn, int runs = 7, int iters = 1,
                             int warmup = 2) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  for (int r = 0; r < runs; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double>(t1 - t0).count() / iters);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// CPU seconds the process has used so far, all its threads (workers of
// intra-op parallelism included): less sensitive than wall time to other
// processes taking the machine's cores.
inline double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// A baseline against a variant, measured in interleaved rounds (baseline
// run, then variant run, `iters` calls each), so that a change in the
// machine's load hits both sides of a difference alike. Medians over rounds
// of wall and process CPU seconds per call, and of the per-round excess of
// the variant over the baseline; and each side's minor page faults per call,
// averaged over the rounds (a program's heap may be given back to the system
// and faulted in again, which costs as much as a few percent of a run).
struct Paired {
  double base_wall = 0, base_cpu = 0;
  double wall = 0, cpu = 0;
  double excess_wall = 0, excess_cpu = 0;
  double base_faults = 0, faults = 0;
};

inline long minor_faults() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

inline Paired paired_seconds(const std::function<void()>& base, const std::function<void()>& variant,
                             int rounds, int iters = 1, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) {
    base();
    variant();
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto time = [iters](const std::function<void()>& fn, std::vector<double>& wall,
                      std::vector<double>& cpu, long& faults) {
    long f0 = minor_faults();
    double c0 = process_cpu_seconds();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    auto t1 = std::chrono::steady_clock::now();
    double c1 = process_cpu_seconds();
    faults += minor_faults() - f0;
    wall.push_back(std::chrono::duration<double>(t1 - t0).count() / iters);
    cpu.push_back((c1 - c0) / iters);
  };
  std::vector<double> bw, bc, vw, vc, ew, ec;
  long bf = 0, vf = 0;
  for (int r = 0; r < rounds; ++r) {
    time(base, bw, bc, bf);
    time(variant, vw, vc, vf);
    ew.push_back(vw.back() - bw.back());
    ec.push_back(vc.back() - bc.back());
  }
  const double calls = static_cast<double>(rounds) * iters;
  return {median(bw), median(bc), median(vw), median(vc), median(ew), median(ec),
          static_cast<double>(bf) / calls, static_cast<double>(vf) / calls};
}

// Enough calls per run for a run to last about `target` seconds.
inline int iterations_for(const std::function<void()>& fn, double target = 0.05) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::max(1, static_cast<int>(target / std::max(once, 1e-7)));
}

inline void print(const std::string& name, double value, const char* unit) {
  std::printf("%s: %.4g %s\n", name.c_str(), value, unit);
  std::fflush(stdout);
}

// Bytes the heap has handed out and not got back (glibc).
inline size_t heap_in_use() {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

// Resident set size now, in bytes (Linux).
inline size_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

// The process's peak resident set size so far, in bytes (Linux).
inline size_t peak_rss_bytes() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<size_t>(usage.ru_maxrss) * 1024;
}

}  // namespace torchcap::bench
