// Stack traces of the user's program, captured when a node is recorded.
//
// Capture takes only return addresses (libunwind's unw_backtrace), so recording stays
// cheap; symbolization (module, function, file and line from DWARF, through
// elfutils' libdwfl) happens the first time someone asks for the frames.
#include <torchcap/meta.h>

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <algorithm>
#include <mutex>
#include <unordered_map>

extern "C" void* __libc_stack_end;  // glibc: the program's first stack pointer

namespace torchcap {
namespace {

constexpr int kMaxCapturedFrames = 96;
constexpr size_t kMaxUserFrames = 16;
// Stacks recognized by their return address slots (Note [Stacks recognized
// by their return address slots]): in all, and at one depth.
constexpr size_t kMaxKnownStacks = 1024;
constexpr size_t kMaxStacksPerDepth = 64;

struct Symbolized {
  SourceFrame frame;
  bool user = false;  // not torchcap, LibTorch, the C++ library or the C runtime
};

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }
bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

std::string base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// Shared objects whose frames are never the user's.
bool is_library_module(const std::string& module) {
  static const char* const kLibraries[] = {
      "libtorchcap", "libtorch", "libc10",   "libcaffe2", "libstdc++", "libc.so",
      "libc-",       "libgcc_s", "libgomp",  "ld-linux",  "libpthread", "libdw",
      "libshm",      "libgtest", "libgmock", "libbenchmark"};
  for (const char* lib : kLibraries) {
    if (starts_with(module, lib)) return true;
  }
  return false;
}

// Source files whose inlined or template code lands in the user's binary but is
// not the user's: LibTorch's headers, the C++ library's, torchcap's own.
bool is_library_source(const std::string& file) {
  return contains(file, "/include/c++/") || contains(file, "/include/torch/") ||
         contains(file, "/include/ATen/") || contains(file, "/include/c10/") ||
         contains(file, "/include/torchcap/") || contains(file, "/gtest/") ||
         contains(file, "/gmock/");
}

bool is_library_function(const std::string& fn) {
  return starts_with(fn, "torchcap::") || starts_with(fn, "c10::") || starts_with(fn, "at::") ||
         starts_with(fn, "torch::") || starts_with(fn, "std::") || starts_with(fn, "__gnu_cxx::") ||
         starts_with(fn, "testing::") || starts_with(fn, "_start") || starts_with(fn, "__libc");
}

std::string demangle(const char* name) {
  if (name == nullptr) return "";
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) return name;
  std::string s(out);
  std::free(out);
  return s;
}

// One libdwfl session for the process, guarded by a mutex; results are cached
// by address, so each return address is resolved once.
class Symbolizer {
 public:
  static Symbolizer& get() {
    static Symbolizer* s = new Symbolizer();  // leaked: used until exit
    return *s;
  }

  // The frames at one return address, innermost first: one per inlined call,
  // then the function the code was compiled into.
  // The reference stays valid: entries are never erased, and rehashing an
  // unordered_map does not move its values.
  const std::vector<Symbolized>& resolve(void* pc) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(pc);
    if (it == cache_.end()) {
      it = cache_.emplace(pc, lookup(reinterpret_cast<Dwarf_Addr>(pc) - 1)).first;  // the call itself
    }
    return it->second;
  }

 private:
  Symbolizer() {
    callbacks_.find_elf = dwfl_linux_proc_find_elf;
    callbacks_.find_debuginfo = dwfl_standard_find_debuginfo;
    callbacks_.debuginfo_path = nullptr;
    report();
  }

  void report() {
    function_indexes_.clear();  // they point into the session's data
    if (dwfl_ != nullptr) dwfl_end(dwfl_);
    dwfl_ = dwfl_begin(&callbacks_);
    if (dwfl_ == nullptr) return;
    dwfl_report_begin(dwfl_);
    dwfl_linux_proc_report(dwfl_, getpid());
    dwfl_report_end(dwfl_, nullptr, nullptr);
  }

  static std::string die_function_name(Dwarf_Die* die) {
    Dwarf_Attribute attr;
    for (int name : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
      if (dwarf_attr_integrate(die, name, &attr) != nullptr) {
        if (const char* s = dwarf_formstring(&attr)) return demangle(s);
      }
    }
    if (dwarf_attr_integrate(die, DW_AT_name, &attr) != nullptr) {
      if (const char* s = dwarf_formstring(&attr)) return s;
    }
    return "";
  }

  // The functions (out-of-line and inlined) of one compile unit with their
  // address ranges, read once: libdw's dwarf_getscopes walks the whole unit
  // for every address, which is slow on a unit full of LibTorch's templates.
  struct FunctionIndex {
    struct Function {
      Dwarf_Die die;
      int parent;  // the function around this one, or -1
      int depth;
    };
    struct Range {
      Dwarf_Addr low, high;
      int function;
    };
    std::vector<Function> functions;
    std::vector<Range> ranges;
    Dwarf_Files* files = nullptr;

    // The most deeply nested function whose code holds `addr`, or -1.
    int innermost(Dwarf_Addr addr) const {
      int best = -1;
      for (const Range& r : ranges) {
        if (addr >= r.low && addr < r.high &&
            (best < 0 || functions[r.function].depth > functions[best].depth)) {
          best = r.function;
        }
      }
      return best;
    }

    void add(Dwarf_Die* die, int parent, int depth) {
      Dwarf_Die child;
      if (dwarf_child(die, &child) != 0) return;
      do {
        int tag = dwarf_tag(&child);
        int enclosing = parent;
        if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine) {
          Dwarf_Addr base = 0, low = 0, high = 0;
          bool has_code = false;
          for (ptrdiff_t at = 0; (at = dwarf_ranges(&child, at, &base, &low, &high)) > 0;) {
            ranges.push_back(Range{low, high, static_cast<int>(functions.size())});
            has_code = true;
          }
          if (has_code) {
            enclosing = static_cast<int>(functions.size());
            functions.push_back(Function{child, parent, depth});
          }
        }
        add(&child, enclosing, depth + 1);
      } while (dwarf_siblingof(&child, &child) == 0);
    }
  };

  const FunctionIndex& function_index(Dwfl_Module* mod, Dwarf_Die* cu) {
    auto key = std::make_pair(static_cast<void*>(mod), dwarf_dieoffset(cu));
    auto it = function_indexes_.find(key);
    if (it != function_indexes_.end()) return it->second;
    FunctionIndex& index = function_indexes_[key];
    size_t nfiles = 0;
    if (dwarf_getsrcfiles(cu, &index.files, &nfiles) != 0) index.files = nullptr;
    index.add(cu, -1, 0);
    return index;
  }

  std::vector<Symbolized> lookup(Dwarf_Addr addr) {
    std::vector<Symbolized> out;
    if (dwfl_ == nullptr) return out;
    Dwfl_Module* mod = dwfl_addrmodule(dwfl_, addr);
    if (mod == nullptr) {
      report();  // a library loaded since the last report
      mod = dwfl_ != nullptr ? dwfl_addrmodule(dwfl_, addr) : nullptr;
      if (mod == nullptr) return out;
    }
    const char* module_path = dwfl_module_info(mod, nullptr, nullptr, nullptr, nullptr, nullptr,
                                               nullptr, nullptr);
    const std::string module = module_path ? base_name(module_path) : "";
    // No frame of a library is the user's: skip the symbol and line lookups,
    // which for LibTorch's symbol table cost about a millisecond per address.
    if (is_library_module(module)) return out;

    std::string file;
    int line = 0;
    if (Dwfl_Line* l = dwfl_module_getsrc(mod, addr)) {
      if (const char* f = dwfl_lineinfo(l, nullptr, &line, nullptr, nullptr, nullptr)) file = f;
    }
    // Walk the inlined calls that contain the address, innermost first: each
    // DW_TAG_inlined_subroutine's call site is where its caller stood, and
    // its caller is the function around it in the compile unit's tree.
    std::vector<SourceFrame> frames;
    Dwarf_Addr bias = 0;
    if (Dwarf_Die* cu = dwfl_module_addrdie(mod, addr, &bias)) {
      const FunctionIndex& index = function_index(mod, cu);
      int current = index.innermost(addr - bias);
      while (current >= 0 && frames.size() < 64) {
        Dwarf_Die die = index.functions[current].die;
        frames.push_back(SourceFrame{file, line, die_function_name(&die), {}});
        if (dwarf_tag(&die) != DW_TAG_inlined_subroutine) break;
        Dwarf_Attribute attr;
        Dwarf_Word value = 0;
        file.clear();
        line = 0;
        if (index.files != nullptr &&
            dwarf_formudata(dwarf_attr(&die, DW_AT_call_file, &attr), &value) == 0) {
          if (const char* f = dwarf_filesrc(index.files, value, nullptr, nullptr)) file = f;
        }
        if (dwarf_formudata(dwarf_attr(&die, DW_AT_call_line, &attr), &value) == 0) {
          line = static_cast<int>(value);
        }
        current = index.functions[current].parent;
      }
    }
    if (frames.empty()) {
      frames.push_back(SourceFrame{file, line, demangle(dwfl_module_addrname(mod, addr)), {}});
    }
    for (SourceFrame& f : frames) {
      Symbolized s;
      s.user = !is_library_source(f.file) &&
               !(f.file.empty() && is_library_function(f.function)) &&
               !(f.file.empty() && f.function.empty());
      if (f.file.empty()) f.file = module;
      s.frame = std::move(f);
      out.push_back(std::move(s));
    }
    return out;
  }

  std::mutex mu_;
  Dwfl_Callbacks callbacks_{};
  Dwfl* dwfl_ = nullptr;
  std::unordered_map<void*, std::vector<Symbolized>> cache_;
  std::map<std::pair<void*, Dwarf_Off>, FunctionIndex> function_indexes_;  // by module and unit
};

}  // namespace

struct StackTrace::State {
  std::vector<void*> pcs;
  std::once_flag once;
  std::vector<SourceFrame> frames;
  // Where capture() stood when it last tried to learn this stack's slots
  // (Note [Stacks recognized by their return address slots]), or 0.
  uintptr_t tried_at = 0;
};

namespace {

// Note [Stacks recognized by their return address slots]
// unw_backtrace finds each frame's caller through libunwind's cache of frame
// layouts, a 256 KB table indexed by a hash of the return address: a random
// access per frame, some forty a node, which made stack traces a large share
// of the tracing overhead on small operators. A stack the thread has seen before is
// recognized without unwinding: whenever capture() is called from the same
// callers, its frame is at the same depth and their return addresses lie at
// the same places above it. So the second time a stack is captured, where its
// return addresses lie is recorded (find_slots), by capture()'s frame
// address; a later capture at that address whose stack holds those values at
// those places has those callers, and takes that stack's state without
// unwinding. (Frames at fixed distances from capture()'s make each recorded
// place the true one; a frame sized at run time could move its callers', and
// a stack taken for another would then need every recorded value at its
// recorded place all the same.)
struct Slot {
  const uintptr_t* at;
  uintptr_t value;
};

// A word of this thread's stack, read wherever it lies. The scan and the
// comparisons below read the callers' frames word by word, which under
// AddressSanitizer includes the red zones it puts around their locals.
__attribute__((no_sanitize_address)) uintptr_t stack_word(const uintptr_t* at) { return *at; }

// This thread's own stack: [low, high), or empty if unknown. For the main
// thread glibc's pthread_getattr_np reads /proc/self/maps, slow in a
// process with LibTorch's libraries loaded; its stack ends where glibc
// recorded the program's first stack pointer, and may grow down to the stack
// size limit below that.
struct StackBounds {
  uintptr_t low = 0, high = 0;
};

const StackBounds& thread_stack() {
  thread_local const StackBounds bounds = [] {
    StackBounds b;
    if (gettid() == getpid()) {
      rlimit limit;
      if (getrlimit(RLIMIT_STACK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
        b.high = reinterpret_cast<uintptr_t>(__libc_stack_end);
        b.low = b.high - std::min<uintptr_t>(limit.rlim_cur, b.high);
      }
      return b;
    }
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return b;
    void* low = nullptr;
    size_t size = 0;
    if (pthread_attr_getstack(&attr, &low, &size) == 0) {
      b.low = reinterpret_cast<uintptr_t>(low);
      b.high = b.low + size;
    }
    pthread_attr_destroy(&attr);
    return b;
  }();
  return bounds;
}

// Where the return addresses pcs[1..n) of the stack capture() is on lie
// (pcs[0] is in capture() itself, whose frame is at `here`): found by
// reading the stack from `here` towards its base for each value in turn.
// Nothing if one is not found in this thread's own stack (a capture on a
// signal stack or a user-level context's): such stacks are unwound every
// time. (libunwind's cursor would say exactly where each return address
// lies, by interpreting the unwind tables frame by frame again; the scan
// is cheap, once per stack, and the stack holds a copy
// of a return address elsewhere only by rare chance.)
std::vector<Slot> find_slots(uintptr_t here, void* const* pcs, int n) {
  const StackBounds& stack = thread_stack();
  if (here < stack.low || here >= stack.high) return {};
  const auto* at = reinterpret_cast<const uintptr_t*>(here);
  const auto* end = reinterpret_cast<const uintptr_t*>(stack.high);
  std::vector<Slot> slots;
  slots.reserve(static_cast<size_t>(n));
  for (int k = 1; k < n; ++k) {
    const auto value = reinterpret_cast<uintptr_t>(pcs[k]);
    while (at < end && stack_word(at) != value) ++at;
    if (at == end) return {};
    slots.push_back(Slot{at, value});
    ++at;
  }
  return slots;
}

// Note [Probing the stacks of one depth]
// Many stacks can share a depth: one function calling operators from many
// lines does that (ResNet-18's blocks). Each stack known at a depth has a
// probe, one of its slots, checked before the others: the first slot in
// which it differs from the stack of that depth it shares the most slots
// with (the others have parted from it before). Stacks through the same
// operator differ only from the user's frames on, some twenty slots up,
// so comparing slots in order would read far into each candidate's; with
// probes a capture reads one slot of each stack it is not, and all slots
// of the one it is (a probe that passes by chance costs a full
// comparison, never a wrong match). The search starts after the stack
// recognized last, as a loop's stacks come back in turn. With probes, a
// depth can hold 64 stacks, where comparing in full kept 8: ResNet-18 has
// more than 8 stacks at some depths, and many of its captures were
// unwound on every trace.

// The index of the first slot where stacks `a` and `b` lie or hold
// differently (the length of the shorter if one begins the other).
size_t first_difference(const std::vector<Slot>& a, const std::vector<Slot>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i].at == b[i].at && a[i].value == b[i].value) ++i;
  return i;
}

}  // namespace

StackTrace StackTrace::capture(int skip) {
  // libunwind's unw_backtrace caches what it learns about each return
  // address, so capturing the same code paths again (every node of a trace
  // comes through the dispatcher) costs a fraction of a full unwind.
  static const bool cache_policy_set = [] {
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
    return true;
  }();
  (void)cache_policy_set;
  // Note [Stack traces shared by their return addresses]
  // The nodes one line of the program records (every layer of a loop, every
  // operator a module's forward calls in turn) come through the same return
  // addresses: they share one state, found by the addresses' hash, so that a
  // capture allocates nothing and each distinct stack is symbolized once.
  // The tables are the thread's, bounded, and hold no more than what graphs
  // may still share.
  struct Known {
    int skip;
    std::vector<Slot> slots;  // every return address of the stack, innermost first
    std::shared_ptr<State> state;
    uint64_t used = 0;  // when last recognized or learned (Recent::clock)
    size_t probe = 0;   // the index in `slots` of this stack's probe

    bool matches(int skip_now) const {
      if (skip != skip_now) return false;
      for (const Slot& s : slots) {
        if (stack_word(s.at) != s.value) return false;
      }
      return true;
    }
  };
  // The stacks known at one depth (Note [Probing the stacks of one depth]).
  struct AtDepth {
    std::vector<Slot> probes;  // probes[i]: known[i].slots[known[i].probe]
    std::vector<Known> known;
    size_t last = 0;  // the index of the stack recognized last
  };
  struct Recent {
    std::unordered_map<size_t, std::shared_ptr<State>> states;
    // By capture()'s frame address (Note [Stacks recognized by their return
    // address slots]).
    std::unordered_map<uintptr_t, AtDepth> by_depth;
    size_t known = 0;
    uint64_t clock = 0;
  };
  thread_local Recent recent;
  // Adds `fresh` to the stacks of depth `d`, in place of the least recently
  // used one when the depth is full, and chooses its probe.
  auto learn = [](AtDepth& d, Known fresh, size_t& count) {
    size_t at = d.known.size();
    if (at == kMaxStacksPerDepth) {
      at = 0;
      for (size_t i = 1; i < d.known.size(); ++i) {
        if (d.known[i].used < d.known[at].used) at = i;
      }
      d.known[at] = std::move(fresh);
    } else {
      d.known.push_back(std::move(fresh));
      d.probes.emplace_back();
      ++count;
    }
    Known& added = d.known[at];
    added.probe = 0;
    for (size_t i = 0; i < d.known.size(); ++i) {
      if (i == at) continue;
      const size_t apart = first_difference(d.known[i].slots, added.slots);
      added.probe = std::max(added.probe, std::min(apart, added.slots.size() - 1));
      Known& other = d.known[i];
      if (apart > other.probe && apart < other.slots.size()) {
        other.probe = apart;
        d.probes[i] = other.slots[apart];
      }
    }
    d.probes[at] = added.slots[added.probe];
  };
  StackTrace t;
  const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  auto at_depth = recent.by_depth.find(here);
  if (at_depth != recent.by_depth.end()) {
    AtDepth& d = at_depth->second;
    const size_t n = d.known.size();
    size_t i = d.last;
    for (size_t tried = 0; tried < n; ++tried) {
      if (++i == n) i = 0;
      const Slot& probe = d.probes[i];
      if (stack_word(probe.at) != probe.value || !d.known[i].matches(skip)) continue;
      d.last = i;
      d.known[i].used = ++recent.clock;
      t.state_ = d.known[i].state;
      return t;
    }
  }
  void* buffer[kMaxCapturedFrames];
  int n = unw_backtrace(buffer, kMaxCapturedFrames);
  int first = std::min(n, skip + 1);  // and this function
  size_t h = static_cast<size_t>(n - first);
  for (int i = first; i < n; ++i) {
    h = (h ^ reinterpret_cast<size_t>(buffer[i])) * 0x100000001b3ULL;
  }
  auto it = recent.states.find(h);
  if (it != recent.states.end() && it->second->pcs.size() == static_cast<size_t>(n - first) &&
      std::equal(it->second->pcs.begin(), it->second->pcs.end(), buffer + first)) {
    t.state_ = it->second;
    // Seen before: worth recording where its return addresses lie, once.
    if (t.state_->tried_at != here && n > 1) {
      t.state_->tried_at = here;
      std::vector<Slot> slots = find_slots(here, buffer, n);
      if (!slots.empty()) {
        if (recent.known >= kMaxKnownStacks) {
          recent.by_depth.clear();
          recent.known = 0;
        }
        learn(recent.by_depth[here], Known{skip, std::move(slots), t.state_, ++recent.clock},
              recent.known);
      }
    }
    return t;
  }
  if (recent.states.size() >= 4096) recent.states.clear();
  t.state_ = std::make_shared<State>();
  t.state_->pcs.assign(buffer + first, buffer + n);
  recent.states[h] = t.state_;
  return t;
}

StackTrace StackTrace::from_frames(std::vector<SourceFrame> frames) {
  StackTrace t;
  t.state_ = std::make_shared<State>();
  std::call_once(t.state_->once, [&] { t.state_->frames = std::move(frames); });
  return t;
}

bool StackTrace::empty() const { return frames().empty(); }

const std::vector<SourceFrame>& StackTrace::frames() const {
  static const std::vector<SourceFrame> kNone;
  if (!state_) return kNone;
  std::call_once(state_->once, [this] {
    Symbolizer& sym = Symbolizer::get();
    for (void* pc : state_->pcs) {
      for (const Symbolized& s : sym.resolve(pc)) {
        if (!s.user) continue;
        state_->frames.push_back(s.frame);
        if (state_->frames.size() == kMaxUserFrames) return;
      }
    }
  });
  return state_->frames;
}

std::string StackTrace::str() const {
  const auto& fs = frames();
  std::string out;
  for (size_t i = fs.size(); i-- > 0;) {
    const SourceFrame& f = fs[i];
    out += "  File \"" + f.file + "\", line " + std::to_string(f.line) + ", in " +
           (f.function.empty() ? "?" : f.function) + "\n";
    if (!f.code.empty()) out += "    " + f.code + "\n";
  }
  return out;
}

}  // namespace torchcap
