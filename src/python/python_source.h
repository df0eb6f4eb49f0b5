// Where a node came from in a Python program: the user's Python frames and
// the nn.Modules whose forward was running (TraceOptions::locate_source for
// torchcap._C).
//
// One PythonSource lives for one trace, on the tracing thread, which holds
// the GIL whenever it is called. The frames walked are those between the
// innermost Python frame and the frame that started the trace (excluded);
// frames of files under `internal_dirs` (torch's and torchcap's own packages)
// are left out. Stacks are cached by their frames' (code, instruction)
// pairs, so consecutive nodes made by one line share one StackTrace and the
// source text of a line is read once.
#pragma once

#include <torchcap/meta.h>

#include <pybind11/pybind11.h>

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

  // The traced program's modules: what forward hooks report for them, by
  // object ("layer1.0.conv1", "torch.nn.modules.conv.Conv2d"). The GIL is held.
  // The root module (path "") is on the stack of every node, outermost.
  void add_module(py::object module, std::string path, std::string type);
  // Global forward hooks: a module's forward starts or ends. Modules not added
  // are not on the stack. The GIL is held by the caller.
  void enter_module(PyObject* module);
  void exit_module(PyObject* module);

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

  bool is_internal(PyObject* code);
  // 1 when the root module is on the stack for the whole trace, else 0.
  size_t root_frames() const { return has_root_ ? 1 : 0; }
  const SourceFrame& frame_for(PyObject* frame, PyObject* code, FrameKey key);

  std::vector<std::string> internal_dirs_;
  py::object boundary_;
  py::object getline_;  // linecache.getline
  // Code objects seen, kept alive so that their addresses stay unique keys.
  std::vector<py::object> codes_;
  std::unordered_map<const void*, bool> internal_;
  std::unordered_map<FrameKey, SourceFrame, FrameKeyHash> frames_;
  std::unordered_map<std::vector<FrameKey>, StackTrace, StackKeyHash> stacks_;
  std::vector<FrameKey> scratch_;

  std::unordered_map<PyObject*, ModuleFrame> known_modules_;
  std::vector<py::object> module_refs_;
  std::vector<ModuleFrame> modules_;
  bool has_root_ = false;
  ModuleStack module_stack_;
};

}  // namespace torchcap::python
