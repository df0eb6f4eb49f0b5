// Meta mode against real mode and eager execution, in one run.
//
//   meta_bench models [NAME]
//                        MLP-200, ResNet-18 and ViT-B/32 (or the one named:
//                        mlp200, resnet18, vit_b32): eager, real-mode and
//                        meta-mode trace times, per-node figures and ratios
//   meta_bench decoder   a GPT-2-XL-sized decoder built on the meta device:
//                        meta-mode trace time, peak resident memory and the
//                        size of its weightless file (run
//                        it in a process of its own: the peak is the
//                        process's)
//   meta_bench loop NAME [SECONDS|Nx [--no-stack-traces|--eager|--alternate [--no-stack-traces]]]
//                        traces one model (mlp200, resnet18, vit_b32, any
//                        zoo example) in real mode again and again, or runs
//                        it eagerly, for a profiler: for SECONDS (10), or N
//                        times ("20x", for instruction counts under
//                        valgrind); --alternate runs it eagerly and traces
//                        it in turn, and prints the median time and page
//                        faults of each (Note [Page faults in the rounds])
//
// Per-node figures: real mode's overhead is (trace - eager) / nodes, as in
// trace_bench, the median over interleaved rounds of each round's difference,
// in wall time and in process CPU time (all threads); meta mode computes
// nothing, so its figure is trace / nodes. Real mode is measured with stack
// traces (the default) and without (record_stack_traces = false).
// Allocations: operator new calls
// (from any library) of a trace minus those of an eager run, per node; a
// count, the same from run to run, where times vary by a few percent.
// Page faults: minor faults per eager run and per trace over the rounds
// (Note [Page faults in the rounds]).
#include "bench_util.h"
#include "models.h"
#include "transformers.h"
#include "zoo.h"

#include <torchcap/serialize.h>
#include <torchcap/tracer.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>

// Note [Counting allocations]
// The benchmark replaces the global operator new, which every library of the
// process then calls (LibTorch's tensors, the tracer's nodes, the standard
// library's strings and vectors), to count heap allocations. Memory still
// comes from malloc. Only allocations_of counts: in the timed runs an
// atomic increment per allocation was charged mostly to the side that
// allocates more (the trace); in a profile of tracing the MLP-200 it took
// 2.3 % of all samples, as many as a tenth of libtorchcap's.
namespace {
std::atomic<uint64_t> allocations{0};
std::atomic<bool> counting{false};

void count_allocation() {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
}

void* counted_allocation(std::size_t n) {
  count_allocation();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

void* counted_allocation(std::size_t n, std::align_val_t alignment) {
  count_allocation();
  const std::size_t a = std::max(static_cast<std::size_t>(alignment), sizeof(void*));
  void* p = nullptr;
  if (posix_memalign(&p, a, n == 0 ? 1 : n) == 0) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_allocation(n); }
void* operator new[](std::size_t n) { return counted_allocation(n); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_allocation(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_allocation(n, a); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_allocation(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace torchcap::bench {
namespace {

// Note [Page faults in the rounds]
// glibc gives the top of its heap back to the system when enough of it is
// free, and a later large allocation then faults its pages in afresh: a
// kernel entry and a zeroed page each. Which of two interleaved programs
// pays depends on the order of their allocations and on the heap's state:
// this bench has measured ResNet-18's trace at 1.35x eager (each trace
// faulted about 2,400 pages) and, after a reboot, at 0.79x (each eager run
// faulted, 47 ms against 31), and it moves between runs of one build. So each
// side's page faults per run are printed beside each ratio: a ratio is the
// tracer's cost only when neither side faults.

// Heap allocations (operator new calls) made by one call of `fn`, after one
// call to warm it up.
uint64_t allocations_of(const std::function<void()>& fn) {
  fn();
  const uint64_t before = allocations.load(std::memory_order_relaxed);
  counting.store(true, std::memory_order_relaxed);
  fn();
  counting.store(false, std::memory_order_relaxed);
  return allocations.load(std::memory_order_relaxed) - before;
}

struct Program {
  std::string name;
  ModuleState state;
  TracedFunction forward;
  std::vector<c10::IValue> inputs;
};

Program from_example(const std::string& name) {
  auto e = std::make_shared<examples::Example>(examples::make(name));
  Program p{name, e->module ? ModuleState::of(*e->module) : ModuleState{}, e->forward,
            e->make_inputs(0)};
  // The example owns the module the function calls.
  p.forward = [e](std::vector<c10::IValue> in) { return e->forward(std::move(in)); };
  return p;
}

Program vit_b32() {
  torch::manual_seed(0);
  examples::ViTOptions options;
  options.patch_size = 32;
  auto model = std::make_shared<examples::ViT>(options);
  model->eval();
  return {"vit_b32", ModuleState::of(*model),
          [model](std::vector<c10::IValue> in) { return c10::IValue(model->forward(in[0].toTensor())); },
          {at::randn({1, 3, 224, 224})}};
}

std::vector<c10::IValue> as_meta(const std::vector<c10::IValue>& in) {
  std::vector<c10::IValue> out;
  for (const c10::IValue& v : in) out.emplace_back(v.toTensor().to(at::kMeta));
  return out;
}

void compare(Program& p) {
  TraceOptions meta;
  meta.meta = true;
  size_t nodes = 0, meta_nodes = 0;
  auto eager = [&] {
    at::NoGradGuard no_grad;
    p.forward(p.inputs);
  };
  auto real = [&] { nodes = trace(p.state, p.forward, p.inputs).graph().size(); };
  TraceOptions no_stack_traces;
  no_stack_traces.record_stack_traces = false;
  auto real_without_stacks = [&] { trace(p.state, p.forward, p.inputs, no_stack_traces); };
  auto in_meta = [&] { meta_nodes = trace(p.state, p.forward, p.inputs, meta).graph().size(); };
  std::vector<c10::IValue> shapes = as_meta(p.inputs);
  auto shapes_only = [&] { trace(p.state, p.forward, shapes, meta); };

  eager();  // the first run sets up kernels (oneDNN's): not a run to size the rounds by
  int iters = iterations_for(eager, 0.2);
  // Models that take seconds eagerly get fewer runs.
  const bool slow = iters == 1;
  // Eager and real mode in interleaved rounds (their difference is the
  // figure that matters, and the machine's load drifts). On ResNet-18 the
  // difference is 1-4 % of a run and one round's spreads by about as much:
  // 31 rounds (about 6 s) keep the median from moving much between runs.
  const int rounds = slow ? 7 : 31;
  Paired real_mode = paired_seconds(eager, real, rounds, iters, slow ? 1 : 2);
  Paired without_stacks = paired_seconds(eager, real_without_stacks, rounds, iters, slow ? 1 : 2);
  int meta_iters = iterations_for(in_meta, 0.05);
  double t_meta = median_seconds(in_meta, 7, meta_iters);
  double t_shapes = median_seconds(shapes_only, 7, meta_iters);
  const double t_eager = real_mode.base_wall;
  const double extra_allocations =
      static_cast<double>(allocations_of(real)) - static_cast<double>(allocations_of(eager));

  const std::string prefix = "meta/" + p.name + "/";
  print(prefix + "nodes", static_cast<double>(nodes), "nodes");
  print(prefix + "eager", t_eager * 1e3, "ms");
  print(prefix + "real_trace", real_mode.wall * 1e3, "ms");
  print(prefix + "meta_trace", t_meta * 1e3, "ms");
  print(prefix + "meta_trace_shapes_only", t_shapes * 1e3, "ms");
  print(prefix + "real_overhead_per_node", real_mode.excess_wall / nodes * 1e6, "us");
  print(prefix + "real_overhead_per_node_cpu", real_mode.excess_cpu / nodes * 1e6, "us");
  print(prefix + "real_allocations_per_node", extra_allocations / nodes, "allocations");
  print(prefix + "eager_page_faults_per_run", real_mode.base_faults, "faults");
  print(prefix + "real_page_faults_per_run", real_mode.faults, "faults");
  print(prefix + "no_stack_traces/eager_page_faults_per_run", without_stacks.base_faults, "faults");
  print(prefix + "no_stack_traces/real_page_faults_per_run", without_stacks.faults, "faults");
  print(prefix + "meta_per_node", t_meta / meta_nodes * 1e6, "us");
  print(prefix + "real_over_eager", (t_eager + real_mode.excess_wall) / t_eager, "x");
  print(prefix + "real_over_eager_no_stack_traces",
        (without_stacks.base_wall + without_stacks.excess_wall) / without_stacks.base_wall, "x");
  print(prefix + "real_over_eager_cpu",
        (real_mode.base_cpu + real_mode.excess_cpu) / real_mode.base_cpu, "x");
  print(prefix + "meta_over_eager", t_meta / t_eager, "x");
  if (meta_nodes != nodes) print(prefix + "MISMATCH_meta_nodes", static_cast<double>(meta_nodes), "nodes");
}

// `only`: one model's name, or empty for all.
void models(const std::string& only) {
  print("meta/threads", at::get_num_threads(), "threads");
  for (const std::string name : {"mlp200", "resnet18"}) {
    if (!only.empty() && only != name) continue;
    Program p = from_example(name);
    compare(p);
  }
  if (!only.empty() && only != "vit_b32") return;
  Program vit = vit_b32();
  compare(vit);
}

// Eager runs and traces in turn, one each, `runs` times: median times and
// mean page faults of each side.
void alternate(Program& p, int runs, const TraceOptions& options) {
  auto eager = [&] {
    at::NoGradGuard no_grad;
    p.forward(p.inputs);
  };
  auto real = [&] { trace(p.state, p.forward, p.inputs, options); };
  const Paired r = paired_seconds(eager, real, runs, /*iters=*/1, /*warmup=*/3);
  const std::string prefix = "alternate/" + p.name + "/";
  print(prefix + "eager", r.base_wall * 1e3, "ms");
  print(prefix + "real_trace", r.wall * 1e3, "ms");
  print(prefix + "real_over_eager", r.wall / r.base_wall, "x");
  print(prefix + "eager_page_faults_per_run", r.base_faults, "faults");
  print(prefix + "real_page_faults_per_run", r.faults, "faults");
}

// Traces one program over and over for `seconds`, for a profiler
// (perf record -g build/meta_bench loop mlp200 10).
// `how`: "" (trace), "--no-stack-traces", "--eager" (runs the program
// itself, to compare), or "--alternate" (eager runs and traces in turn, N
// of each, or 20 when given SECONDS), which `more_how`
// "--no-stack-traces" may follow.
void loop(const std::string& name, const std::string& duration, const std::string& how,
          const std::string& more_how) {
  const bool counted = !duration.empty() && duration.back() == 'x';
  const double limit = std::atof(duration.c_str());
  Program p = name == "vit_b32" ? vit_b32() : from_example(name);
  TraceOptions options;
  options.record_stack_traces = how != "--no-stack-traces" && more_how != "--no-stack-traces";
  if (how == "--alternate") {
    alternate(p, counted ? static_cast<int>(limit) : 20, options);
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  auto more = [&] {
    if (counted) return n < limit;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit;
  };
  while (more()) {
    if (how == "--eager") {
      at::NoGradGuard no_grad;
      p.forward(p.inputs);
    } else {
      trace(p.state, p.forward, p.inputs, options);
    }
    ++n;
  }
  print("loop/" + name + "/runs", n, "runs");
}

void decoder() {
  size_t rss_start = rss_bytes();
  auto t0 = std::chrono::steady_clock::now();
  auto model = std::make_shared<examples::Decoder>(examples::DecoderOptions{},
                                                   torch::Device(torch::kMeta));
  double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t parameters = 0;
  for (const at::Tensor& t : model->parameters()) parameters += t.numel();
  const int64_t tokens = 1024;
  std::vector<c10::IValue> inputs = {
      at::empty({1, tokens}, at::TensorOptions().dtype(at::kLong).device(at::kMeta))};
  TracedFunction forward = [model](std::vector<c10::IValue> in) {
    return c10::IValue(model->forward(in[0].toTensor()));
  };
  ModuleState state = ModuleState::of(*model);
  TraceOptions meta;
  meta.meta = true;
  size_t rss_before = rss_bytes();

  t0 = std::chrono::steady_clock::now();
  GraphModule gm = trace(state, forward, inputs, meta);
  double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t nodes = gm.graph().size();
  double t = median_seconds([&] { trace(state, forward, inputs, meta); }, 5, 1, 1);

  // Saved weightless: each parameter's name and metadata, no bytes.
  t0 = std::chrono::steady_clock::now();
  const size_t file_bytes = save_to_string(gm).size();
  double save_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  print("meta/gpt2_xl/parameters", parameters / 1e9, "billion");
  print("meta/gpt2_xl/tokens", static_cast<double>(tokens), "tokens");
  print("meta/gpt2_xl/nodes", static_cast<double>(nodes), "nodes");
  print("meta/gpt2_xl/build_model_on_meta", build_s * 1e3, "ms");
  print("meta/gpt2_xl/meta_trace_first", first_s * 1e3, "ms");
  print("meta/gpt2_xl/meta_trace", t * 1e3, "ms");
  print("meta/gpt2_xl/meta_per_node", t / nodes * 1e6, "us");
  print("meta/gpt2_xl/save_weightless", save_s * 1e3, "ms");
  print("meta/gpt2_xl/weightless_file", file_bytes / 1048576.0, "MiB");
  print("meta/gpt2_xl/rss_at_start", rss_start / 1048576.0, "MiB");
  print("meta/gpt2_xl/rss_before_trace", rss_before / 1048576.0, "MiB");
  print("meta/gpt2_xl/peak_rss", peak_rss_bytes() / 1048576.0, "MiB");
}

}  // namespace
}  // namespace torchcap::bench

int main(int argc, char** argv) {
  std::string which = argc > 1 ? argv[1] : "models";
  if (which == "models") {
    torchcap::bench::models(argc > 2 ? argv[2] : "");
  } else if (which == "loop" && argc > 2 && argc < 7 &&
             (argc < 5 || std::strcmp(argv[4], "--no-stack-traces") == 0 ||
              std::strcmp(argv[4], "--eager") == 0 || std::strcmp(argv[4], "--alternate") == 0) &&
             (argc < 6 || (std::strcmp(argv[4], "--alternate") == 0 &&
                           std::strcmp(argv[5], "--no-stack-traces") == 0))) {
    torchcap::bench::loop(argv[2], argc > 3 ? argv[3] : "10", argc > 4 ? argv[4] : "",
                          argc > 5 ? argv[5] : "");
  } else if (which == "decoder") {
    torchcap::bench::decoder();
  } else {
    std::cerr << "usage: meta_bench [models [NAME]|decoder|loop NAME [SECONDS|Nx "
                 "[--no-stack-traces|--eager|--alternate [--no-stack-traces]]]]\n";
    return 2;
  }
  return 0;
}
