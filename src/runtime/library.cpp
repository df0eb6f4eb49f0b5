// Loading operator libraries (see library.h).
#include <torchcap/library.h>

#include <torchcap/error.h>

#include <mutex>
#include <set>

#include <dlfcn.h>
#include <glob.h>
#include <sys/stat.h>

namespace torchcap {

void load_library(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw Error("operator library '" + path + "': no such file");
  if (S_ISDIR(st.st_mode)) {
    throw Error("operator library '" + path + "' is a directory, not a shared object (.so)");
  }
  // RTLD_GLOBAL, as torch.ops.load_library: a library may need the symbols of
  // one loaded before it. The handle is dropped on purpose (never unloaded).
  ::dlerror();
  if (::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* reason = ::dlerror();
    throw Error("cannot load operator library '" + path + "': " +
                (reason != nullptr ? reason : "unknown reason"));
  }
}

// Note [Operator libraries found by their namespace]
// A graph that calls torchvision::nms or torchvision::roi_align (every
// detection model) runs where torchvision's operator library is loaded.
// Python loads it with `import torchvision`; a C++ program, the command and
// the Python reader of a file that never imported torchvision would
// otherwise need --library PATH with a path the user must find. Debian's
// python3-torchvision installs it in the system's Python packages, the one
// place torchcap looks (the same on every Debian machine), by pattern, since
// its name carries the Python version.
namespace {

const char* pattern_of(const std::string& ns) {
  if (ns == "torchvision") return "/usr/lib/python3/dist-packages/torchvision/_C*.so";
  return nullptr;
}

}  // namespace

std::string library_location_of_namespace(const std::string& ns) {
  const char* pattern = pattern_of(ns);
  return pattern != nullptr ? pattern : "";
}

bool load_library_of_namespace(const std::string& ns) {
  static std::mutex mutex;
  static std::set<std::string> tried;
  const char* pattern = pattern_of(ns);
  if (pattern == nullptr) return false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!tried.insert(ns).second) return false;
  glob_t found{};
  bool loaded = false;
  if (::glob(pattern, 0, nullptr, &found) == 0 && found.gl_pathc > 0) {
    try {
      load_library(found.gl_pathv[0]);
      loaded = true;
    } catch (const Error&) {
      // Not loadable here (another LibTorch's build): the caller's message
      // says which operator is missing and how to load a library.
    }
  }
  ::globfree(&found);
  return loaded;
}

}  // namespace torchcap
