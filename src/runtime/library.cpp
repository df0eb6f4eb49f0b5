// Loading operator libraries (see library.h).
#include <torchcap/library.h>

#include <torchcap/error.h>

#include <dlfcn.h>
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

}  // namespace torchcap
