// Exclusive temporaries, checked writes, fsync and rename, append-only record
// files and the run's inputs (engine/core/output_file.h, Note [one way to
// write a file]).
#include "engine/core/output_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "kernels/error.h"

namespace lockstep::core {
namespace {

namespace fs = std::filesystem;

std::string advice(int error) {
  return error == ENOSPC || error == EDQUOT ? "the disk is full: free space and retry"
                                            : "check the disk and its permissions";
}

[[noreturn]] void fail(const std::string& what, const fs::path& path, int error) {
  throw IoError(what + " '" + path.string() + "': " + std::strerror(error) + " (" + advice(error) +
                ")");
}

// An OutputFileError for `what` at `target`: the errno's text, the step that
// failed, the advice.
[[noreturn]] void fail_output(const std::string& what, const fs::path& target,
                              const std::string& step, int error) {
  std::string reason = std::string(std::strerror(error)) + " (" + step + "; " + advice(error) + ")";
  throw OutputFileError(what + " '" + target.string() + "': " + reason, reason);
}

// The steps every writer shares, each returning 0 or the errno that failed
// them, so that each caller raises its own kind of error.

// Writes all of `bytes` (retrying short writes and EINTR); a write of 0
// bytes is ENOSPC.
int write_fully(int fd, const char* p, std::size_t bytes) noexcept {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return 0;
}

int fsync_directory(const fs::path& directory) noexcept {
  const int fd = ::open(directory.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int synced = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return synced;
}

struct Input {
  fs::path path;
  dev_t device;
  ino_t inode;
};

struct Inputs {
  std::mutex mutex;
  std::vector<Input> files;
};

Inputs& inputs() {
  static Inputs* all = new Inputs;  // never destroyed: writers may run during exit
  return *all;
}

fs::path directory_of(const fs::path& target) {
  return target.has_parent_path() ? target.parent_path() : fs::path(".");
}

}  // namespace

void note_input(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  Inputs& all = inputs();
  std::lock_guard lock(all.mutex);
  for (const Input& in : all.files)
    if (in.device == st.st_dev && in.inode == st.st_ino) return;
  all.files.push_back({path, st.st_dev, st.st_ino});
}

void check_not_input(const fs::path& output, std::string_view what) {
  struct stat st {};
  if (::stat(output.c_str(), &st) != 0) return;  // nothing there (or a dangling link): no input
  Inputs& all = inputs();
  std::lock_guard lock(all.mutex);
  for (const Input& in : all.files) {
    if (in.device != st.st_dev || in.inode != st.st_ino) continue;
    // An input removed since (a pruned checkpoint) may have passed its inode
    // on to a new file: only a path that still names that file counts.
    struct stat now {};
    if (::stat(in.path.c_str(), &now) != 0 || now.st_dev != in.device || now.st_ino != in.inode)
      continue;
    std::string reason =
        (in.path == output ? "" : "the same file as '" + in.path.string() + "', ") +
        "one of this run's inputs: writing it would replace what was read; "
        "nothing was written (name another output file)";
    throw OutputFileError(std::string(what) + " '" + output.string() + "' is " + reason,
                          "it is " + reason);
  }
}

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
  if (const int error = write_fully(fd, static_cast<const char*>(data), bytes))
    fail("cannot write", path, error);
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
  check_not_input(target, "the output");
  if (::rename(temporary.c_str(), target.c_str()) != 0)
    fail("cannot rename '" + temporary.string() + "' to", target, errno);
  if (const int error = fsync_directory(directory_of(target)))
    fail("cannot fsync the directory of", target, error);
}

bool remove_temporary(const fs::path& path) noexcept { return ::unlink(path.c_str()) == 0; }

OutputFile::OutputFile(fs::path target, std::string_view what, bool durable)
    : target_(std::move(target)), what_(what), durable_(durable) {
  if (target_.empty() || !target_.has_filename())
    throw OutputFileError(what_ + " '" + target_.string() + "' does not name a file",
                          "it does not name a file");
  check_not_input(target_, what_);
  // mkstemp's contract with our own name: a random suffix, O_EXCL (which
  // never follows a symlink), another suffix when the name is taken.
  static thread_local std::mt19937_64 random{std::random_device{}() ^
                                             static_cast<std::uint64_t>(::getpid())};
  static constexpr char kLetters[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  const fs::path directory = directory_of(target_);
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string suffix(6, 'x');
    for (char& c : suffix) c = kLetters[random() % (sizeof(kLetters) - 1)];
    temporary_ = directory / fmt::format(".{}.{}.tmp", target_.filename().string(), suffix);
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ >= 0) return;
    if (errno != EEXIST)
      fail_output(what_, target_, "creating its temporary '" + temporary_.string() + "' failed",
                  errno);
  }
  throw OutputFileError(
      what_ + " '" + target_.string() +
          "': 100 names for its temporary were taken (remove the .tmp files there)",
      "100 names for its temporary were taken (remove the .tmp files there)");
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    remove_temporary(temporary_);
  }
}

void OutputFile::write(std::string_view bytes) {
  if (fd_ < 0) throw IoError(what_ + " '" + target_.string() + "' was already committed");
  if (const int error = write_fully(fd_, bytes.data(), bytes.size()))
    fail_output(what_, target_, "writing its temporary '" + temporary_.string() + "' failed",
                error);
}

void OutputFile::commit() {
  if (fd_ < 0) throw IoError(what_ + " '" + target_.string() + "' was already committed");
  const int fd = fd_;
  fd_ = -1;
  try {
    const int synced = durable_ && ::fsync(fd) != 0 ? errno : 0;
    const int closed = ::close(fd) != 0 ? errno : 0;
    if (synced || closed)
      fail_output(what_, target_,
                  (synced ? "fsync of its temporary '" : "closing its temporary '") +
                      temporary_.string() + "' failed",
                  synced ? synced : closed);
    check_not_input(target_, what_);
    if (::rename(temporary_.c_str(), target_.c_str()) != 0)
      fail_output(what_, target_,
                  "renaming its temporary '" + temporary_.string() + "' over it failed", errno);
  } catch (...) {
    remove_temporary(temporary_);
    throw;
  }
  if (!durable_) return;
  if (const int error = fsync_directory(directory_of(target_)))
    fail_output(what_, target_, "fsync of its directory after the rename failed", error);
}

void write_file(const fs::path& target, std::string_view contents, std::string_view what) {
  OutputFile file(target, what);
  file.write(contents);
  file.commit();
}

AppendFile::AppendFile(fs::path target, std::string_view what) : target_(std::move(target)) {
  check_not_input(target_, what);
  // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead of
  // blocking the run in open(); cleared below, so that writes block as usual.
  fd_ = ::open(target_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK,
               0644);
  if (fd_ < 0) {
    const int error = errno;
    if (error == ELOOP) {
      const std::string reason =
          "it is a symbolic link, which is not followed (a link planted there could point at a "
          "checkpoint): name the file itself";
      throw OutputFileError(std::string(what) + " '" + target_.string() + "': " + reason, reason);
    }
    fail_output(std::string(what), target_,
                error == ENXIO ? "a FIFO with no reader" : "opening it to append failed", error);
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || S_ISDIR(st.st_mode) ||
      !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    ::close(fd_);
    fd_ = -1;
    const std::string reason = "it is not a regular file (name a file to append records to)";
    throw OutputFileError(std::string(what) + " '" + target_.string() + "': " + reason, reason);
  }
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

int AppendFile::append(std::string_view lines) noexcept {
  return write_fully(fd_, lines.data(), lines.size());
}

}  // namespace lockstep::core
