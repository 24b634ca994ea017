// The lock that makes a checkpoint directory one run's (Note [checkpoint
// lock]): an flock on <dir>/lockstep.lock, held from the moment a run takes
// the directory until the process ends, and the holder's name in the file so
// that a second run can say whose the directory is.
#pragma once

#include <filesystem>
#include <string>

#include "kernels/error.h"

namespace lockstep::engine {

// Note [checkpoint lock]: two runs started at once into one directory both
// passed the empty-directory check, each removed the other's temporaries as
// leftovers, and one checksummed the other's half-written file. So the
// process that writes a directory's checkpoints (rank 0) takes an exclusive
// flock on kLockFileName there before it looks at the directory, and holds it
// for its life: the kernel releases it when the process ends, however it
// ends, so a killed run never leaves the directory locked. The file keeps the
// holder's host, pid and start time (left behind after the run; only the
// flock counts). A second process is refused, naming the holder. Checking for
// existing checkpoints and removing leftover temporaries happen only under
// the lock. On NFS, Linux emulates flock with a byte-range lock over the
// whole file, which the server arbitrates between hosts.
inline constexpr const char* kLockFileName = "lockstep.lock";

// Thrown when another process holds the lock; holder() is what its file says.
class CheckpointDirectoryLocked : public IoError {
 public:
  CheckpointDirectoryLocked(const std::string& message, std::string holder)
      : IoError(message), holder_(std::move(holder)) {}
  const std::string& holder() const { return holder_; }

 private:
  std::string holder_;
};

class DirectoryLock {
 public:
  // Takes the lock of `directory` (Note [checkpoint lock]) without waiting
  // and writes this process's holder_line() into the lock file. Throws
  // CheckpointDirectoryLocked naming the holder when another process has
  // it, IoError when the lock file cannot be opened or written.
  explicit DirectoryLock(const std::filesystem::path& directory);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::filesystem::path& file() const { return file_; }
  // "host node7 pid 4242 started 2026-12-02T14:11:05Z": this process.
  static std::string holder_line();

 private:
  std::filesystem::path file_;
  int fd_ = -1;
};

}  // namespace lockstep::engine
