// Where a node came from in a Python program: the user's Python frames and
// the nn.Modules whose forward was running (TraceOptions::locate_source for
// torchcap._C).
//
// One PythonSource lives for one trace, on the tracing thread, which holds
// the GIL whenever it is called. The frames walked are those between the
// innermost Python frame and the frame that started the trace (excluded);
// frames of files under `internal_dirs` (torch's and torchcap's own packages)
// are left out of stack traces.
//
// Note [Frames cached across traces]
// A node's stack is known by its frames' (code, instruction) pairs; what
// they stand for (file, line, function and source line of each, and the
// StackTrace of the whole stack) is made once and kept in a cache shared by
// every trace of the process, so consecutive nodes made by one line share
// one StackTrace, the source of a line is read once, and tracing a program
// again makes none of it. The cache holds the code objects it saw, so that
// their addresses stay unique keys; it is used under the GIL, and started
// afresh, when no trace is using it, once it holds kMaxCachedStacks stacks.
// As linecache (which reads the lines), it does not notice a source file
// edited while the process runs.
//
// Note [Module stacks from frames]
// The module stack is read from the same frames: a frame running a method
// named `forward` whose `self` is one of the traced module's submodules is
// that module's forward. No forward hooks are involved: hooks, even global
// ones, make every module call take nn.Module's slow path and call into
// torchcap twice, which cost more than recording the module's operators.
// Module stacks are cached by the modules on them, so nodes share them.
//
// Note [Module stacks cached across traces]
// A module stack is kept in the shared cache, keyed by the addresses of its
// modules, so that tracing a model again makes none. An address is only a
// key: a module freed since may have left it to another, and a module may
// have been renamed. So the cache also keeps the path and class each module
// address had when last traced, and set_modules compares this trace's with
// them (two string comparisons a module, on strings the caller has just
// made). A cached stack is trusted while no module's path or class has
// changed since it was made or last checked (the cache's generation, bumped
// on each change); after a change, its first use compares its paths and
// classes with this trace's and remakes it if they differ. Traces running
// at once (threads) cannot mislead each other: a stack's key starts with its
// root module, and one root's modules have one path each. Checking each
// stack on its first use in every trace instead cost about 4 cache misses
// an operator of ResNet-18 (its stacks are nearly one per operator).
#pragma once

#include <torchcap/meta.h>

#include <c10/util/flat_hash_map.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchcap::python {

namespace py = pybind11;

class PythonSource {
 public:
  // `boundary`: the frame that called into torchcap; it and its callers are
  // not part of any node's stack trace.
  PythonSource(std::vector<std::string> internal_dirs, py::object boundary);
  ~PythonSource();
  PythonSource(const PythonSource&) = delete;
  PythonSource& operator=(const PythonSource&) = delete;

  // Fills meta.stack_trace and meta.module_stack. Takes the GIL.
  void locate(NodeMeta& meta);

  // The traced program's modules: `modules` is a list of (module, qualified
  // path, class) tuples ((m, "layer1.0.conv1", "torch.nn.modules.conv.Conv2d"));
  // other modules are never on a module stack. The GIL is held. The root
  // module (path "") is on the stack of every node, outermost, whether or not
  // its forward is running. Throws py::type_error for entries of other types.
  void set_modules(py::list modules);

  // The source of the calling thread's running trace, or nullptr.
  static PythonSource* current();

  // Makes `source` current on this thread for its lifetime.
  class Scope {
   public:
    explicit Scope(PythonSource* source);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PythonSource* previous_;
  };

 private:
  struct FrameKey {
    const void* code;
    int lasti;
    bool operator==(const FrameKey& o) const { return code == o.code && lasti == o.lasti; }
  };
  struct FrameKeyHash {
    size_t operator()(const FrameKey& k) const;
  };
  struct StackKeyHash {
    size_t operator()(const std::vector<FrameKey>& k) const;
  };
  struct CodeInfo {
    bool internal = false;  // in one of the internal directories
    bool forward = false;   // a function named forward, with arguments
  };
  struct ModulesHash {
    size_t operator()(const std::vector<PyObject*>& k) const;
  };
  struct CachedModuleStack {
    ModuleStack stack;
    uint64_t generation = 0;  // the cache's generation it was last known right in
  };
  // Note [Frames cached across traces].
  struct Cache;

  CodeInfo code_info(PyObject* code);
  // The frame at `key`, made on first sight. Its code object is alive.
  void note_frame(FrameKey key);
  // Adds `self`, the first argument of a running forward, to the module
  // stack if it is one of the traced modules.
  void note_module(PyObject* self);
  // The `self` local of a frame object, or nullptr.
  static PyObject* self_of(PyObject* frame);
  // The module stack of `modules` (outermost first, the root first when
  // there is one), from the cache when it has it.
  const ModuleStack& module_stack_of(const std::vector<PyObject*>& modules);
  // The path and class of modules[i], as set_modules was given them.
  struct ModuleText {
    const char* path;
    const char* type;
  };
  ModuleText module_text(const std::vector<PyObject*>& modules, size_t i) const;
  // Whether `stack` names what `modules` are in this trace.
  bool describes(const ModuleStack& stack, const std::vector<PyObject*>& modules) const;

  std::shared_ptr<Cache> cache_;
  py::object boundary_;
  std::vector<FrameKey> scratch_;

  // set_modules' list, which keeps its modules alive, and each module's
  // index in it (the root not included).
  py::list modules_;
  ska::flat_hash_map<PyObject*, size_t> module_index_;
  std::optional<size_t> root_;
  PyObject* root_object_ = nullptr;
  std::vector<PyObject*> module_scratch_;
};

}  // namespace torchcap::python
