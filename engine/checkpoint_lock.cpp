// DirectoryLock (engine/checkpoint_lock.h, Note [checkpoint lock]): flock(2)
// on a file opened once per lock, its contents rewritten by the new holder.
#include "engine/checkpoint_lock.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

namespace lockstep::engine {
namespace fs = std::filesystem;
namespace {

// When this process took its first lock: the run's start, as a holder reports it.
std::string start_time_utc() {
  static const std::string started = [] {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm utc{};
    gmtime_r(&now, &utc);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return std::string(text);
  }();
  return started;
}

// What the holder wrote, on one line; empty when it has not written yet.
std::string read_holder(int fd) {
  char text[512];
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string holder(text, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
  for (char& c : holder)
    if (c == '\n') c = ' ';
  return holder;
}

}  // namespace

std::string DirectoryLock::holder_line() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  return fmt::format("host {} pid {} started {}", host, ::getpid(), start_time_utc());
}

DirectoryLock::DirectoryLock(const fs::path& directory) : file_(directory / kLockFileName) {
  fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0)
    throw IoError(
        fmt::format("cannot open the lock file '{}' of checkpoint directory '{}': {} "
                    "(check that the directory is writable)",
                    file_.string(), directory.string(), std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = error == EWOULDBLOCK ? read_holder(fd_) : "";
    ::close(fd_);
    if (error != EWOULDBLOCK)
      throw IoError(fmt::format("cannot lock '{}': {} (the file system may not support flock)",
                                file_.string(), std::strerror(error)));
    throw CheckpointDirectoryLocked(
        fmt::format("checkpoint directory '{}' belongs to another run that is still going: {} "
                    "holds its lock ({}). Wait for that run to end or stop it, or use another "
                    "directory",
                    directory.string(),
                    holder.empty() ? "a process that has not written its name yet" : holder,
                    file_.string()),
        holder);
  }
  const std::string line = holder_line() + "\n";
  try {
    if (::ftruncate(fd_, 0) != 0)
      throw IoError(
          fmt::format("cannot write the lock file '{}': {}", file_.string(), std::strerror(errno)));
    if (::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
      throw IoError(fmt::format("cannot write the lock file '{}': {} (check the disk)",
                                file_.string(), std::strerror(errno)));
  } catch (...) {
    ::close(fd_);  // releases the lock
    throw;
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace lockstep::engine
