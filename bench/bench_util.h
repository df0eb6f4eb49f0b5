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
