// Saving and loading a ResNet-18 (the example zoo's, ~45 MB of weights):
// time to save, time to load, and how much memory loading takes. Prints
// `name: value unit` lines; times are medians of 7 runs after one warm-up.
//
//   serialize_bench
//
// Loading maps the file and wraps the weights without copying them, so the
// memory a load takes should be small next to the file, whatever its size.
// That is measured in a fresh process (this program re-run with
// --measure-load PATH [unverified]), where the peak resident set is reset just
// before each load: the figures are the peak during `load` over what the
// process held before it, for the process's first load and for a later one,
// and the anonymous memory (what is not a page of a file) the loaded module
// holds. Verifying the checksums (the default) reads every page of the file,
// so those pages count in the resident set; they are the page cache's, shared
// and not copies, which the anonymous figure shows.
#include <torchcap/serialize.h>

#include "zoo.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

double median_ms(const std::function<void()>& f, int runs = 7) {
  f();  // warm-up: page cache, allocator, operator tables
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    auto start = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A field of /proc/self/status in kB ("VmRSS", "VmHWM").
long status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
  }
  return -1;
}

// The child: loads twice, printing for each load the peak resident set
// during it over the resident set before it. The first load in a fresh
// process also pays for what LibTorch and the allocator set up lazily; the
// second is the steady state.
int measure_load(const std::string& path, const torchcap::LoadOptions& options) {
  double figures[2], anonymous = 0;
  for (double& figure : figures) {
    const long before = status_kb("VmRSS"), anon_before = status_kb("RssAnon");
    // Resets VmHWM to the current resident set (Linux >= 4.0).
    std::ofstream("/proc/self/clear_refs") << "5";
    torchcap::GraphModule gm = torchcap::load(path, options);
    figure = (status_kb("VmHWM") - before) / 1024.0;
    anonymous = (status_kb("RssAnon") - anon_before) / 1024.0;
    if (gm.attributes().empty()) return 1;
  }
  std::printf("%.1f %.1f %.1f\n", figures[0], figures[1], anonymous);
  return 0;
}

struct LoadMemory {
  double first_mb = -1, steady_mb = -1, anonymous_mb = -1;
};

// Runs measure_load in a fresh process.
LoadMemory load_memory(const std::string& path, bool verify) {
  namespace fs = std::filesystem;
  // popen runs a shell, so /proc/self/exe must be resolved here, not there.
  std::string cmd = fs::read_symlink("/proc/self/exe").string() + " --measure-load '" + path +
                    "'" + (verify ? "" : " unverified");
  LoadMemory m;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    if (std::fscanf(p, "%lf %lf %lf", &m.first_mb, &m.steady_mb, &m.anonymous_mb) != 3) m = {};
    ::pclose(p);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  torchcap::LoadOptions unverified;
  unverified.verify_checksums = false;
  if (argc >= 3 && std::string(argv[1]) == "--measure-load") {
    return measure_load(argv[2], argc == 4 ? unverified : torchcap::LoadOptions{});
  }

  namespace fs = std::filesystem;
  std::string pattern = (fs::temp_directory_path() / "torchcap_bench_XXXXXX").string();
  const std::string dir = ::mkdtemp(pattern.data());
  const std::string path = dir + "/resnet18.tcg";

  torchcap::examples::Example e = torchcap::examples::make("resnet18");
  torchcap::GraphModule gm = torchcap::examples::trace(e);
  size_t weights = 0;
  for (const auto& a : gm.attributes()) weights += a.value.defined() ? a.value.nbytes() : 0;

  double save_ms = median_ms([&] { torchcap::save(gm, path); });
  double save_memory_ms = median_ms([&] { (void)torchcap::save_to_string(gm); });
  double load_ms = median_ms([&] { (void)torchcap::load(path); });
  double unverified_ms = median_ms([&] { (void)torchcap::load(path, unverified); });
  const double file_mb = fs::file_size(path) / (1024.0 * 1024.0);
  LoadMemory verified_memory = load_memory(path, true);
  LoadMemory unverified_memory = load_memory(path, false);
  fs::remove_all(dir);

  std::printf("serialize_resnet18_weights: %.1f MB\n", weights / (1024.0 * 1024.0));
  std::printf("serialize_resnet18_file_size: %.1f MB\n", file_mb);
  std::printf("serialize_resnet18_save: %.1f ms\n", save_ms);
  std::printf("serialize_resnet18_save_to_string: %.1f ms\n", save_memory_ms);
  std::printf("serialize_resnet18_load: %.2f ms\n", load_ms);
  std::printf("serialize_resnet18_load_without_checksums: %.2f ms\n", unverified_ms);
  std::printf("serialize_resnet18_load_checksums_ratio: %.2f x\n", load_ms / unverified_ms);
  std::printf("serialize_resnet18_load_peak_rss_first_load: %.1f MB\n", verified_memory.first_mb);
  std::printf("serialize_resnet18_load_peak_rss_steady: %.1f MB\n", verified_memory.steady_mb);
  std::printf("serialize_resnet18_load_anonymous_memory: %.1f MB\n",
              verified_memory.anonymous_mb);
  std::printf("serialize_resnet18_load_without_checksums_peak_rss_steady: %.1f MB\n",
              unverified_memory.steady_mb);
  return 0;
}
