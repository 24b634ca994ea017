// Exclusive temporaries, checked writes, fsync and rename (io/durable_file.h).
#include "io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "kernels/error.h"

namespace lockstep::io {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& what, const fs::path& path, int error) {
  throw IoError(what + " '" + path.string() + "': " + std::strerror(error) +
                (error == ENOSPC || error == EDQUOT ? " (the disk is full: free space and retry)"
                                                    : " (check the disk and its permissions)"));
}

}  // namespace

int create_exclusive(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    if (error == EEXIST)
      throw IoError("cannot create '" + path.string() +
                    "': something is already there (a symlink or a file another process is "
                    "writing); it was left untouched: remove it if it is stale");
    fail("cannot create", path, error);
  }
  return fd;
}

void write_all(int fd, const void* data, std::size_t bytes, const fs::path& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write", path, n < 0 ? errno : ENOSPC);
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void sync_and_close(int fd, const fs::path& path) {
  const int synced = ::fsync(fd) == 0 ? 0 : errno;
  const int closed = ::close(fd) == 0 ? 0 : errno;
  if (synced) fail("cannot fsync", path, synced);
  if (closed) fail("cannot close", path, closed);
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open for fsync", path, errno);
  sync_and_close(fd, path);
}

void commit_rename(const fs::path& temporary, const fs::path& target) {
  if (::rename(temporary.c_str(), target.c_str()) != 0)
    fail("cannot rename '" + temporary.string() + "' to", target, errno);
  fsync_path(target.has_parent_path() ? target.parent_path() : fs::path("."), true);
}

bool remove_temporary(const fs::path& path) noexcept { return ::unlink(path.c_str()) == 0; }

}  // namespace lockstep::io
