// Files written under a temporary name and renamed when complete, and
// removed if the process is interrupted meanwhile. Internal.
#pragma once

#include <functional>
#include <string>

namespace torchcap::detail {

// Note [Temporary files and interrupts] (temp_files.cpp): writes `path` by
// way of a temporary file in its directory (`write` gets its descriptor and
// name, and writes everything), then renames it to `path`: a reader never
// sees half a file, and an error leaves no file behind. `fail` throws the
// caller's exception for a system error's description. The rename is made
// durable.
void write_atomically(const std::string& path, const std::function<void(int fd, const std::string& tmp)>& write,
                      const std::function<void(const std::string& what)>& fail);

// The same for bytes in memory.
void write_bytes_atomically(const std::string& path, const char* data, size_t size,
                            const std::function<void(const std::string& what)>& fail);

// "cannot WHAT 'PATH': " and errno's description.
std::string system_error(const std::string& what, const std::string& path);

// Writes all `size` bytes to `fd`, again after EINTR and short writes;
// false (errno set) on an error.
bool write_fully(int fd, const void* data, size_t size);

// Installs handlers for SIGINT, SIGTERM and SIGHUP that remove the
// temporary files being written, then end the process as the signal would
// have. For programs (the torchcap command); a library does not take
// signals over. Once per process.
void remove_temporary_files_on_signals();

}  // namespace torchcap::detail
