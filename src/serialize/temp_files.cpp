// Note [Temporary files and interrupts]
// A file is written under a temporary name beside its target and renamed
// over it when complete and on disk, so an interrupted or failed write
// never leaves half a file under the target's name. An exception removes
// the temporary file on its way out; a signal does not unwind, so the names
// being written are also kept where a signal handler can read them without
// allocating or locking: a fixed table of slots, each claimed by an atomic
// flag while its name is written. The command (and any program that asks,
// remove_temporary_files_on_signals) removes them on SIGINT, SIGTERM and
// SIGHUP, then ends as the signal would have (default action, raised
// again), so its exit status still says it was interrupted.
#include "serialize/temp_files.h"

#include <torchcap/error.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

#include <fcntl.h>
#include <unistd.h>

namespace torchcap::detail {
namespace {

constexpr size_t kSlots = 16;
constexpr size_t kMaxPath = 4096;

struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 being filled or emptied, 2 holds a name
  char path[kMaxPath];
};
std::array<Slot, kSlots> slots;

// Claims a slot for `path`; -1 when every slot is taken or the name is too
// long (the file is then only removed on errors, not on signals).
int remember(const std::string& path) {
  if (path.size() >= kMaxPath) return -1;
  for (size_t i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (slots[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(slots[i].path, path.c_str(), path.size() + 1);
      slots[i].state.store(2, std::memory_order_release);
      return static_cast<int>(i);
    }
  }
  return -1;
}

void forget(int slot) {
  if (slot >= 0) slots[static_cast<size_t>(slot)].state.store(0, std::memory_order_release);
}

extern "C" void remove_and_reraise(int sig) {
  for (Slot& s : slots) {
    if (s.state.load(std::memory_order_acquire) == 2) ::unlink(s.path);  // async-signal-safe
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

std::string directory_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string system_error(const std::string& what, const std::string& path) {
  return "cannot " + what + " '" + path + "': " + std::strerror(errno);
}

bool write_fully(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void write_atomically(const std::string& path, const std::function<void(int fd, const std::string& tmp)>& write,
                      const std::function<void(const std::string& what)>& caller_fail) {
  auto fail = [&caller_fail](const std::string& what) {
    caller_fail(what);
    throw Error(what);  // `caller_fail` is to throw its own; this is in case it does not
  };
  // The temporary file is created with the mode of an ordinary new file (the
  // umask applies), in the target's directory so that rename() is atomic.
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int fd = -1;
  int slot = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    slot = remember(tmp);  // before the file exists: a signal then finds nothing to remove
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      forget(slot);
      if (errno != EEXIST || attempt > 100) fail(system_error("create", tmp));
    }
  }
  try {
    write(fd, tmp);
    // The data must be on disk before the name points at it, or a crash
    // after the rename could leave a file of zeros under the target name.
    if (::fsync(fd) != 0) fail(system_error("flush", tmp));
    if (::close(fd) != 0) {
      fd = -1;
      fail(system_error("close", tmp));
    }
    fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail(system_error("rename to", path));
    forget(slot);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    forget(slot);
    throw;
  }
  // Make the rename itself durable. A failure here leaves a complete file
  // under the right name, so it is not reported.
  int dir = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void write_bytes_atomically(const std::string& path, const char* data, size_t size,
                            const std::function<void(const std::string& what)>& caller_fail) {
  auto fail = [&caller_fail](const std::string& what) {
    caller_fail(what);
    throw Error(what);
  };
  write_atomically(path, [&](int fd, const std::string& tmp) {
    if (!write_fully(fd, data, size)) fail(system_error("write", tmp));
  }, caller_fail);
}

void remove_temporary_files_on_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction action {};
      action.sa_handler = remove_and_reraise;
      sigemptyset(&action.sa_mask);
      ::sigaction(sig, &action, nullptr);
    }
  });
}

}  // namespace torchcap::detail
