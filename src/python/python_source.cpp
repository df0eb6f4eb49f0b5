#include "python/python_source.h"

#include <frameobject.h>

// Note [Module stacks from frames] reads a frame's first argument (`self`).
// Python 3.11 offers no public call for one variable of a frame; its
// internal frame layout gives it without building the frame's locals dict,
// and the frames themselves without frame objects (Note [Frames without
// frame objects]).
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#define TORCHCAP_FRAME_INTERNALS 1
#endif

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>

namespace torchcap::python {

namespace {

thread_local PythonSource* tls_source = nullptr;

// Deep recursion in a user's program should not make every node carry
// hundreds of frames.
constexpr size_t kMaxFrames = 64;

// Note [Frames cached across traces]: a bound on what a long-running
// process that traces ever new code keeps, about 1.5 KB a stack of five
// frames. A model's stacks are few (a loop over layers makes one per line of
// a layer's code): ResNet-18 has under a hundred.
constexpr size_t kMaxCachedStacks = 1 << 13;

std::string str_attr(PyObject* obj, const char* name) {
  py::object v = py::reinterpret_borrow<py::object>(obj).attr(name);
  return py::isinstance<py::str>(v) ? v.cast<std::string>() : std::string();
}

}  // namespace

size_t PythonSource::FrameKeyHash::operator()(const FrameKey& k) const {
  return std::hash<const void*>()(k.code) * 31 + static_cast<size_t>(k.lasti);
}

size_t PythonSource::ModulesHash::operator()(const std::vector<PyObject*>& k) const {
  size_t h = k.size();
  for (PyObject* m : k) h = h * 1000003 ^ std::hash<const void*>()(m);
  return h;
}

size_t PythonSource::StackKeyHash::operator()(const std::vector<FrameKey>& k) const {
  size_t h = k.size();
  for (const FrameKey& f : k) h = h * 1000003 ^ FrameKeyHash()(f);
  return h;
}

struct PythonSource::Cache {
  explicit Cache(std::vector<std::string> dirs)
      : internal_dirs(std::move(dirs)),
        getline(py::module_::import("linecache").attr("getline")) {}

  const std::vector<std::string> internal_dirs;
  py::object getline;  // linecache.getline
  // Code objects seen, kept alive so that their addresses stay unique keys.
  std::vector<py::object> codes;
  ska::flat_hash_map<const void*, CodeInfo> codes_info;
  std::unordered_map<FrameKey, SourceFrame, FrameKeyHash> frames;
  std::unordered_map<std::vector<FrameKey>, StackTrace, StackKeyHash> stacks;
  // Note [Module stacks cached across traces].
  std::unordered_map<std::vector<PyObject*>, CachedModuleStack, ModulesHash> module_stacks;
  struct ModuleText {
    std::string path, type;
  };
  ska::flat_hash_map<PyObject*, ModuleText> module_texts;  // as last traced
  uint64_t generation = 0;
  int users = 0;  // PythonSources using it
};

PythonSource::PythonSource(std::vector<std::string> internal_dirs, py::object boundary)
    : boundary_(std::move(boundary)) {
  // Under the GIL, which guards the shared cache. Never destroyed: Python
  // objects must not be released after the interpreter is gone.
  static auto* shared = new std::shared_ptr<Cache>();
  std::shared_ptr<Cache>& c = *shared;
  if (!c || c->internal_dirs != internal_dirs ||
      (c->users == 0 && std::max({c->stacks.size(), c->module_stacks.size(),
                                  c->module_texts.size()}) >= kMaxCachedStacks)) {
    c = std::make_shared<Cache>(std::move(internal_dirs));
  }
  cache_ = c;
  ++cache_->users;
}

PythonSource::~PythonSource() {
  // Python objects are released under the GIL, whichever way the trace ended.
  py::gil_scoped_acquire gil;
  --cache_->users;
  cache_.reset();
  modules_ = py::list();
  boundary_ = py::object();
}

PythonSource* PythonSource::current() { return tls_source; }

PythonSource::Scope::Scope(PythonSource* source) : previous_(tls_source) { tls_source = source; }
PythonSource::Scope::~Scope() { tls_source = previous_; }

PythonSource::CodeInfo PythonSource::code_info(PyObject* code) {
  auto it = cache_->codes_info.find(code);
  if (it != cache_->codes_info.end()) return it->second;
  std::string file = str_attr(code, "co_filename");
  CodeInfo info;
  for (const std::string& dir : cache_->internal_dirs) {
    info.internal = info.internal || file.compare(0, dir.size(), dir) == 0;
  }
  info.forward = str_attr(code, "co_name") == "forward" &&
                 reinterpret_cast<PyCodeObject*>(code)->co_argcount > 0;
  cache_->codes.push_back(py::reinterpret_borrow<py::object>(code));
  cache_->codes_info.emplace(code, info);
  return info;
}

#ifndef TORCHCAP_FRAME_INTERNALS
PyObject* PythonSource::self_of(PyObject* frame) {
  py::object locals = py::reinterpret_borrow<py::object>(frame).attr("f_locals");
  return PyDict_Check(locals.ptr()) ? PyDict_GetItemString(locals.ptr(), "self") : nullptr;
}
#endif

PythonSource::ModuleText PythonSource::module_text(const std::vector<PyObject*>& modules,
                                                   size_t i) const {
  // The root, when given, is first (locate puts it there).
  size_t index = i == 0 && root_ ? *root_ : module_index_.at(modules[i]);
  PyObject* entry = PyList_GET_ITEM(modules_.ptr(), index);
  return ModuleText{PyUnicode_AsUTF8(PyTuple_GET_ITEM(entry, 1)),
                    PyUnicode_AsUTF8(PyTuple_GET_ITEM(entry, 2))};
}

bool PythonSource::describes(const ModuleStack& stack, const std::vector<PyObject*>& modules) const {
  const std::vector<ModuleFrame>& frames = stack.frames();
  if (frames.size() != modules.size()) return false;
  for (size_t i = 0; i < modules.size(); ++i) {
    ModuleText now = module_text(modules, i);
    if (frames[i].path != now.path || frames[i].type != now.type) return false;
  }
  return true;
}

const ModuleStack& PythonSource::module_stack_of(const std::vector<PyObject*>& modules) {
  static const ModuleStack empty;
  if (modules.empty()) return empty;
  auto it = cache_->module_stacks.find(modules);
  if (it != cache_->module_stacks.end()) {
    CachedModuleStack& cached = it->second;
    if (cached.generation == cache_->generation || describes(cached.stack, modules)) {
      cached.generation = cache_->generation;
      return cached.stack;
    }
  }
  std::vector<ModuleFrame> frames;
  frames.reserve(modules.size());
  for (size_t i = 0; i < modules.size(); ++i) {
    ModuleText text = module_text(modules, i);
    frames.push_back(ModuleFrame{text.path, text.type});
  }
  CachedModuleStack fresh{ModuleStack(std::move(frames)), cache_->generation};
  if (it != cache_->module_stacks.end()) {
    it->second = std::move(fresh);
    return it->second.stack;
  }
  return cache_->module_stacks.emplace(modules, std::move(fresh)).first->second.stack;
}

void PythonSource::note_frame(FrameKey key) {
  if (cache_->frames.count(key) != 0) return;
  PyObject* code = const_cast<PyObject*>(static_cast<const PyObject*>(key.code));
  SourceFrame f;
  f.file = str_attr(code, "co_filename");
  f.line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(code), key.lasti);
  f.function = str_attr(code, "co_name");
  // linecache runs Python, during which another thread may trace and fill
  // the cache; emplace keeps what is there.
  py::object text = cache_->getline(f.file, f.line);
  if (py::isinstance<py::str>(text)) f.code = py::str(text.attr("strip")()).cast<std::string>();
  cache_->frames.emplace(key, std::move(f));
}

void PythonSource::locate(NodeMeta& meta) {
  // The GIL is held when the program's Python called the operator, the
  // common case; a gil_scoped_acquire costs more than the check.
  std::optional<py::gil_scoped_acquire> gil;
  if (PyGILState_Check() == 0) gil.emplace();
  scratch_.clear();
  module_scratch_.clear();
#ifdef TORCHCAP_FRAME_INTERNALS
  // Note [Frames without frame objects]: the interpreter's frames are read
  // as they are. PyThreadState_GetFrame and PyFrame_GetBack would make a
  // frame object for each (and free it when its call returns), as many for
  // each node as calls on the stack that were not asked for one before.
  _PyInterpreterFrame* stop = reinterpret_cast<PyFrameObject*>(boundary_.ptr())->f_frame;
  for (_PyInterpreterFrame* frame = PyThreadState_Get()->cframe->current_frame;
       frame != nullptr && frame != stop && scratch_.size() < kMaxFrames;
       frame = frame->previous) {
    if (_PyFrame_IsIncomplete(frame)) continue;  // as PyFrame_GetBack skips them
    PyCodeObject* code = frame->f_code;
    PyObject* c = reinterpret_cast<PyObject*>(code);
    const CodeInfo info = code_info(c);
    if (info.forward) note_module(frame->localsplus[0]);
    if (!info.internal) {
      scratch_.push_back(
          FrameKey{c, _PyInterpreterFrame_LASTI(frame) * static_cast<int>(sizeof(_Py_CODEUNIT))});
    }
  }
#else
  PyFrameObject* frame = PyThreadState_GetFrame(PyThreadState_Get());
  while (frame != nullptr && reinterpret_cast<PyObject*>(frame) != boundary_.ptr() &&
         scratch_.size() < kMaxFrames) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* c = reinterpret_cast<PyObject*>(code);
    const CodeInfo info = code_info(c);
    if (info.forward) note_module(self_of(reinterpret_cast<PyObject*>(frame)));
    if (!info.internal) {
      scratch_.push_back(FrameKey{c, PyFrame_GetLasti(frame)});
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
#endif
  if (root_) module_scratch_.push_back(root_object_);
  std::reverse(module_scratch_.begin(), module_scratch_.end());  // outermost first
  meta.module_stack = module_stack_of(module_scratch_);
  if (scratch_.empty()) return;
  auto it = cache_->stacks.find(scratch_);
  if (it == cache_->stacks.end()) {
    // A stack not seen before: its frames are made now, those not seen before
    // either. The code objects are alive: their frames are running.
    for (const FrameKey& k : scratch_) note_frame(k);
    std::vector<SourceFrame> frames;  // innermost first, as scratch_
    frames.reserve(scratch_.size());
    for (const FrameKey& k : scratch_) frames.push_back(cache_->frames.at(k));
    it = cache_->stacks.emplace(scratch_, StackTrace::from_frames(std::move(frames))).first;
  }
  meta.stack_trace = it->second;
}

void PythonSource::note_module(PyObject* self) {
  // `self` captured by a closure inside forward lives in a cell.
  if (self != nullptr && PyCell_Check(self)) self = PyCell_GET(self);
  if (self == nullptr || module_index_.count(self) == 0) return;
  // Innermost first; a forward calling its base class's forward is one
  // module call.
  if (module_scratch_.empty() || module_scratch_.back() != self) module_scratch_.push_back(self);
}

void PythonSource::set_modules(py::list given) {
  // A copy: the program could change the caller's list while it runs.
  auto modules = py::reinterpret_steal<py::list>(PySequence_List(given.ptr()));
  if (!modules) throw py::error_already_set();
  const Py_ssize_t n = PyList_GET_SIZE(modules.ptr());
  module_index_.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* entry = PyList_GET_ITEM(modules.ptr(), i);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(entry, 1)) || !PyUnicode_Check(PyTuple_GET_ITEM(entry, 2))) {
      throw py::type_error("modules[" + std::to_string(i) +
                           "]: expected a (module, qualified path, class) tuple of an object "
                           "and two str");
    }
    // module_frame reads them as UTF-8, which a str holds once asked.
    for (int j : {1, 2}) {
      if (PyUnicode_AsUTF8(PyTuple_GET_ITEM(entry, j)) == nullptr) throw py::error_already_set();
    }
    // A module address seen before with another path or class: cached
    // stacks holding it are checked again (Note [Module stacks cached across
    // traces]). One never seen is on no cached stack.
    const char* path = PyUnicode_AsUTF8(PyTuple_GET_ITEM(entry, 1));
    const char* type = PyUnicode_AsUTF8(PyTuple_GET_ITEM(entry, 2));
    auto [known, added] = cache_->module_texts.emplace(PyTuple_GET_ITEM(entry, 0), Cache::ModuleText{});
    if (added || known->second.path != path || known->second.type != type) {
      known->second = Cache::ModuleText{path, type};
      if (!added) ++cache_->generation;
    }
    if (PyUnicode_GET_LENGTH(PyTuple_GET_ITEM(entry, 1)) == 0) {
      root_ = i;
      root_object_ = PyTuple_GET_ITEM(entry, 0);
    } else {
      module_index_.emplace(PyTuple_GET_ITEM(entry, 0), i);
    }
  }
  modules_ = std::move(modules);
}

}  // namespace torchcap::python
