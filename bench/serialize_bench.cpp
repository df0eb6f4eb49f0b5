// Saving and loading a ResNet-18 (the example zoo's, ~45 MB of weights):
// time to save, time to load, and how much memory loading takes. Prints
// `name: value unit` lines; times are medians of 7 runs after one warm-up.
//
// Then the scale of the format on a big graph: a chain of 200,000 operator
// nodes without tensors, each with its value's metadata, a stack frame with a
// source line and a module stack (shared by 100 nodes, as a block's nodes
// share one). Save and load times, and the peak memory each takes over what
// the process held before (the graph itself, for save), per node, each in a
// fresh process; and torchcap.load's time in Python (/usr/bin/python3 with
// PYTHONPATH naming the package, as `make bench` sets it).
//
//   serialize_bench [--chain-only]
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
#include <ctime>
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
constexpr int64_t kChainLength = 200000;

// x -> add(x, x) -> add(prev, x) -> ... : kChainLength operator nodes.
torchcap::GraphModule chain_module(int64_t length) {
  using namespace torchcap;
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  x->meta().val = ValueMeta::tensor(TensorMeta{c10::kFloat, {2, 3}, {3, 1}, c10::Device(c10::kCPU)});
  Node* prev = x;
  ModuleStack stack;
  for (int64_t i = 0; i < length; ++i) {
    if (i % 100 == 0) {
      std::string block = "blocks." + std::to_string(i / 100);
      stack = ModuleStack({ModuleFrame{"blocks", "torch.nn.modules.container.Sequential"},
                           ModuleFrame{block, "model.Block"}});
    }
    prev = g.call_function("aten::add.Tensor", {prev, x});
    prev->meta().val = x->meta().val;
    prev->meta().stack_trace = StackTrace::from_frames(
        {SourceFrame{"model.py", static_cast<int>(10 + i % 50), "forward", "x = x + y"}});
    prev->meta().module_stack = stack;
  }
  g.output({prev});
  gm.set_flat_specs();
  return gm;
}

// The child's figures: peak resident set during one call over the resident
// set before it, in kB.
long peak_kb_during(const std::function<void()>& f) {
  const long before = status_kb("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM (Linux >= 4.0)
  f();
  return status_kb("VmHWM") - before;
}

double cpu_ms() {
  timespec t;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// In a fresh process: `--measure-chain save PATH` builds the chain and saves
// it; `--measure-chain load PATH` loads it (`load-unchecked PATH`: without
// the shape check). Prints the peak memory of that
// one call in kB, its time in ms, and the CPU time it used in ms (on a
// machine shared with other work, the time a process waits for a core shows
// in the first and not in the second).
int measure_chain(const std::string& what, const std::string& path) {
  double ms = 0, cpu = 0;
  auto timed = [&](const std::function<void()>& f) {
    auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_ms();
    f();
    cpu = cpu_ms() - cpu_start;
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  long kb;
  if (what == "save") {
    torchcap::GraphModule gm = chain_module(kChainLength);
    kb = peak_kb_during([&] { timed([&] { torchcap::save(gm, path); }); });
  } else {
    torchcap::LoadOptions options;
    options.check_shapes = what != "load-unchecked";
    kb = peak_kb_during([&] { timed([&] { torchcap::GraphModule gm = torchcap::load(path, options); }); });
  }
  std::printf("%ld %.1f %.1f\n", kb, ms, cpu);
  return 0;
}

// Runs a command and reads three numbers from its output (memory, time,
// CPU time); -1s on failure.
struct Figures {
  double kb = -1, ms = -1, cpu_ms = -1;
};
Figures run_for_figures(const std::string& cmd) {
  Figures out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    if (std::fscanf(p, "%lf %lf %lf", &out.kb, &out.ms, &out.cpu_ms) != 3) out = {};
    ::pclose(p);
  }
  return out;
}

// The chain figures: each measurement in a fresh process, the median of 3.
void chain_bench(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string path = dir + "/chain.tcg";
  auto median3 = [](std::vector<Figures> v) {
    std::sort(v.begin(), v.end(), [](const Figures& a, const Figures& b) { return a.ms < b.ms; });
    return v[1];
  };
  std::vector<Figures> saves, loads, unchecked_loads, pythons, unchecked_pythons;
  for (int i = 0; i < 3; ++i) saves.push_back(run_for_figures(self + " --measure-chain save '" + path + "'"));
  // With and without the shape check (docs/FORMAT.md, "Shapes"), in turn.
  for (int i = 0; i < 3; ++i) {
    loads.push_back(run_for_figures(self + " --measure-chain load '" + path + "'"));
    unchecked_loads.push_back(run_for_figures(self + " --measure-chain load-unchecked '" + path + "'"));
  }
  // Python: torchcap.load alone, after importing torch.
  auto python = [&](const char* options) {
    return "/usr/bin/python3 -c 'import sys, time, resource, torchcap; t = time.perf_counter(); "
           "c = time.process_time(); gm = torchcap.load(sys.argv[1]" + std::string(options) + "); "
           "t, c = time.perf_counter() - t, time.process_time() - c; "
           "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, t * 1000, c * 1000)' '" + path + "'";
  };
  for (int i = 0; i < 3; ++i) {
    pythons.push_back(run_for_figures(python("")));
    unchecked_pythons.push_back(run_for_figures(python(", check_shapes=False")));
  }
  const Figures save = median3(saves), load = median3(loads), py = median3(pythons);
  const Figures unchecked = median3(unchecked_loads), unchecked_py = median3(unchecked_pythons);
  const double nodes = static_cast<double>(kChainLength);
  std::printf("serialize_chain200k_file_size: %.1f MB\n", fs::file_size(path) / (1024.0 * 1024.0));
  std::printf("serialize_chain200k_save: %.0f ms\n", save.ms);
  std::printf("serialize_chain200k_save_cpu: %.0f ms\n", save.cpu_ms);
  std::printf("serialize_chain200k_save_peak_memory: %.2f KB/node\n", save.kb / nodes);
  std::printf("serialize_chain200k_load: %.0f ms\n", load.ms);
  std::printf("serialize_chain200k_load_cpu: %.0f ms\n", load.cpu_ms);
  std::printf("serialize_chain200k_load_peak_memory: %.2f KB/node\n", load.kb / nodes);
  std::printf("serialize_chain200k_load_without_shape_check_cpu: %.0f ms\n", unchecked.cpu_ms);
  std::printf("serialize_chain200k_shape_check_cpu: %.2f us/node\n",
              (load.cpu_ms - unchecked.cpu_ms) * 1000 / nodes);
  std::printf("serialize_chain200k_python_load: %.0f ms\n", py.ms);
  std::printf("serialize_chain200k_python_load_cpu: %.0f ms\n", py.cpu_ms);
  std::printf("serialize_chain200k_python_load_without_shape_check_cpu: %.0f ms\n", unchecked_py.cpu_ms);
  std::printf("serialize_chain200k_python_shape_check_cpu: %.2f us/node\n",
              (py.cpu_ms - unchecked_py.cpu_ms) * 1000 / nodes);
  std::printf("serialize_chain200k_python_peak_rss: %.0f MB\n", py.kb / 1024.0);
}

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
  if (argc == 4 && std::string(argv[1]) == "--measure-chain") return measure_chain(argv[2], argv[3]);

  namespace fs = std::filesystem;
  std::string pattern = (fs::temp_directory_path() / "torchcap_bench_XXXXXX").string();
  const std::string dir = ::mkdtemp(pattern.data());
  if (argc == 2 && std::string(argv[1]) == "--chain-only") {
    chain_bench(dir);
    fs::remove_all(dir);
    return 0;
  }
  const std::string path = dir + "/resnet18.tcg";

  torchcap::examples::Example e = torchcap::examples::make("resnet18");
  torchcap::GraphModule gm = torchcap::examples::trace(e);
  size_t weights = 0;
  for (const auto& a : gm.attributes()) weights += a.value.defined() ? a.value.nbytes() : 0;

  double save_ms = median_ms([&] { torchcap::save(gm, path); });
  double save_memory_ms = median_ms([&] { (void)torchcap::save_to_string(gm); });
  double load_ms = median_ms([&] { (void)torchcap::load(path); });
  double unverified_ms = median_ms([&] { (void)torchcap::load(path, unverified); });
  torchcap::LoadOptions unchecked = unverified;
  unchecked.check_shapes = false;
  double unchecked_ms = median_ms([&] { (void)torchcap::load(path, unchecked); });
  const double file_mb = fs::file_size(path) / (1024.0 * 1024.0);
  LoadMemory verified_memory = load_memory(path, true);
  LoadMemory unverified_memory = load_memory(path, false);
  chain_bench(dir);
  fs::remove_all(dir);

  std::printf("serialize_resnet18_weights: %.1f MB\n", weights / (1024.0 * 1024.0));
  std::printf("serialize_resnet18_file_size: %.1f MB\n", file_mb);
  std::printf("serialize_resnet18_save: %.1f ms\n", save_ms);
  std::printf("serialize_resnet18_save_to_string: %.1f ms\n", save_memory_ms);
  std::printf("serialize_resnet18_load: %.2f ms\n", load_ms);
  std::printf("serialize_resnet18_load_without_checksums: %.2f ms\n", unverified_ms);
  std::printf("serialize_resnet18_load_checksums_ratio: %.2f x\n", load_ms / unverified_ms);
  std::printf("serialize_resnet18_load_without_checksums_or_shape_check: %.2f ms\n", unchecked_ms);
  std::printf("serialize_resnet18_load_peak_rss_first_load: %.1f MB\n", verified_memory.first_mb);
  std::printf("serialize_resnet18_load_peak_rss_steady: %.1f MB\n", verified_memory.steady_mb);
  std::printf("serialize_resnet18_load_anonymous_memory: %.1f MB\n",
              verified_memory.anonymous_mb);
  std::printf("serialize_resnet18_load_without_checksums_peak_rss_steady: %.1f MB\n",
              unverified_memory.steady_mb);
  return 0;
}
