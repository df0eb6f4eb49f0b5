#include "python/python_source.h"

#include <frameobject.h>

#include <functional>

namespace torchcap::python {

namespace {

thread_local PythonSource* tls_source = nullptr;

// Deep recursion in a user's program should not make every node carry
// hundreds of frames.
constexpr size_t kMaxFrames = 64;

std::string str_attr(PyObject* obj, const char* name) {
  py::object v = py::reinterpret_borrow<py::object>(obj).attr(name);
  return py::isinstance<py::str>(v) ? v.cast<std::string>() : std::string();
}

}  // namespace

size_t PythonSource::FrameKeyHash::operator()(const FrameKey& k) const {
  return std::hash<const void*>()(k.code) * 31 + static_cast<size_t>(k.lasti);
}

size_t PythonSource::StackKeyHash::operator()(const std::vector<FrameKey>& k) const {
  size_t h = k.size();
  for (const FrameKey& f : k) h = h * 1000003 ^ FrameKeyHash()(f);
  return h;
}

PythonSource::PythonSource(std::vector<std::string> internal_dirs, py::object boundary)
    : internal_dirs_(std::move(internal_dirs)),
      boundary_(std::move(boundary)),
      getline_(py::module_::import("linecache").attr("getline")) {}

PythonSource::~PythonSource() {
  // Python objects are released under the GIL, whichever way the trace ended.
  py::gil_scoped_acquire gil;
  codes_.clear();
  module_refs_.clear();
  boundary_ = py::object();
  getline_ = py::object();
}

PythonSource* PythonSource::current() { return tls_source; }

PythonSource::Scope::Scope(PythonSource* source) : previous_(tls_source) { tls_source = source; }
PythonSource::Scope::~Scope() { tls_source = previous_; }

bool PythonSource::is_internal(PyObject* code) {
  auto it = internal_.find(code);
  if (it != internal_.end()) return it->second;
  std::string file = str_attr(code, "co_filename");
  bool internal = false;
  for (const std::string& dir : internal_dirs_) {
    internal = internal || file.compare(0, dir.size(), dir) == 0;
  }
  codes_.push_back(py::reinterpret_borrow<py::object>(code));
  internal_.emplace(code, internal);
  return internal;
}

const SourceFrame& PythonSource::frame_for(PyObject* frame, PyObject* code, FrameKey key) {
  auto it = frames_.find(key);
  if (it != frames_.end()) return it->second;
  SourceFrame f;
  f.file = str_attr(code, "co_filename");
  f.line = PyFrame_GetLineNumber(reinterpret_cast<PyFrameObject*>(frame));
  f.function = str_attr(code, "co_name");
  py::object text = getline_(f.file, f.line);
  if (py::isinstance<py::str>(text)) f.code = py::str(text.attr("strip")()).cast<std::string>();
  return frames_.emplace(key, std::move(f)).first->second;
}

void PythonSource::locate(NodeMeta& meta) {
  py::gil_scoped_acquire gil;
  meta.module_stack = module_stack_;
  scratch_.clear();
  PyFrameObject* frame = PyThreadState_GetFrame(PyThreadState_Get());
  while (frame != nullptr && reinterpret_cast<PyObject*>(frame) != boundary_.ptr() &&
         scratch_.size() < kMaxFrames) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* c = reinterpret_cast<PyObject*>(code);
    if (!is_internal(c)) {
      FrameKey key{c, PyFrame_GetLasti(frame)};
      frame_for(reinterpret_cast<PyObject*>(frame), c, key);
      scratch_.push_back(key);
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  if (scratch_.empty()) return;
  auto it = stacks_.find(scratch_);
  if (it == stacks_.end()) {
    std::vector<SourceFrame> frames;  // innermost first, as scratch_
    frames.reserve(scratch_.size());
    for (const FrameKey& k : scratch_) frames.push_back(frames_.at(k));
    it = stacks_.emplace(scratch_, StackTrace::from_frames(std::move(frames))).first;
  }
  meta.stack_trace = it->second;
}

void PythonSource::add_module(py::object module, std::string path, std::string type) {
  if (path.empty()) {
    // The root: on the stack for the whole trace, whatever its hooks say.
    modules_.insert(modules_.begin(), ModuleFrame{std::move(path), std::move(type)});
    has_root_ = true;
    module_stack_ = ModuleStack(modules_);
    return;
  }
  known_modules_.emplace(module.ptr(), ModuleFrame{std::move(path), std::move(type)});
  module_refs_.push_back(std::move(module));
}

void PythonSource::enter_module(PyObject* module) {
  auto it = known_modules_.find(module);
  if (it == known_modules_.end()) return;
  modules_.push_back(it->second);
  module_stack_ = ModuleStack(modules_);
}

void PythonSource::exit_module(PyObject* module) {
  if (modules_.size() <= root_frames() || known_modules_.count(module) == 0) return;
  modules_.pop_back();
  module_stack_ = ModuleStack(modules_);
}

}  // namespace torchcap::python
