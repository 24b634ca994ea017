// The one way the library and its programs write a file (Note [one way to
// write a file]): OutputFile for a file that appears whole or not at all,
// AppendFile for a record file that grows (the metrics), the low-level steps
// the HDF5 writers share (exclusive creation, checked writes, fsync, rename),
// and the run's inputs, which no output may replace.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "kernels/error.h"

namespace lockstep::core {

// Note [one way to write a file]: every output (checkpoints, shards, ONNX
// files, the heartbeat, flight dumps, traces, metrics, benchmark JSON,
// classes.txt) is written through this header, so that
// - a temporary is created with O_CREAT | O_EXCL | O_NOFOLLOW: a symlink
//   planted at its name (to a checkpoint, say) is refused and left alone,
//   never followed and overwritten;
// - every write's status is checked, and the file is fsynced before it is
//   renamed over the target, and the directory after: a crash or a full disk
//   leaves the old file or the new one, never a mix, and an IoError names the
//   file and the reason;
// - a target that is one of the run's inputs (note_input: every HDF5 file
//   the library opens for reading, and what a program names as an input) is
//   refused before anything is written: `lockstep-export --out` naming the
//   checkpoint it exports once replaced the only copy of the weights.
// An AppendFile (a record file a resumed run continues) opens the target
// itself with O_APPEND | O_NOFOLLOW and refuses anything but a regular file.

// Records `path` as one of this process's inputs (thread-safe; a path that
// does not exist is ignored).
void note_input(const std::filesystem::path& path);
// Throws an IoError when `output` is one of the inputs note_input recorded
// (the same file, however named, or a link to it); `what` names the output
// in the message ("the --out file").
void check_not_input(const std::filesystem::path& output, std::string_view what);

// Creates `path` for writing with O_CREAT | O_EXCL | O_NOFOLLOW: anything
// already there, a symlink included, is an IoError and is left untouched.
// Returns the open descriptor; the caller closes it with sync_and_close().
int create_exclusive(const std::filesystem::path& path);
// Writes all `bytes` to `fd` (retrying short writes); IoError naming `path`.
void write_all(int fd, const void* data, std::size_t bytes, const std::filesystem::path& path);
// fsyncs and closes `fd`; IoError naming `path` when either fails (ENOSPC
// and EIO can surface only here).
void sync_and_close(int fd, const std::filesystem::path& path);
// fsyncs an existing file or directory.
void fsync_path(const std::filesystem::path& path, bool directory);
// Renames `temporary` to `target` (refused when the target is an input:
// check_not_input) and fsyncs the directory that holds them.
void commit_rename(const std::filesystem::path& temporary, const std::filesystem::path& target);
// Removes a leftover temporary (the link itself when it is a symlink: never
// its target). Returns whether something was there.
bool remove_temporary(const std::filesystem::path& path) noexcept;

// What OutputFile throws: what() names the file and the reason, reason()
// is the reason alone ("No space left on device (the disk is full: ...)"),
// for a caller that names the file itself (Note [write failures]).
class OutputFileError : public IoError {
 public:
  OutputFileError(const std::string& message, std::string reason)
      : IoError(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

// A file that appears whole at `target` on commit(), or not at all. The
// temporary is `.NAME.XXXXXX.tmp` beside the target, its suffix chosen at
// random and created exclusively (mkstemp's contract), so that a stale
// temporary of a run that crashed never blocks the next one. Destroyed
// without commit(), it removes its temporary.
class OutputFile {
 public:
  // `what` names the file in messages ("the ONNX file", "the trace file").
  // `durable` false skips the two fsyncs, for a file whose old contents are
  // as good as lost after a machine crash anyway (the heartbeat: a liveness
  // signal rewritten every step); the rename stays atomic.
  OutputFile(std::filesystem::path target, std::string_view what, bool durable = true);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(std::string_view bytes);
  // fsyncs, renames over the target, fsyncs its directory.
  void commit();
  const std::filesystem::path& target() const { return target_; }
  const std::filesystem::path& temporary() const { return temporary_; }

 private:
  std::filesystem::path target_, temporary_;
  std::string what_;
  bool durable_;
  int fd_ = -1;
};

// OutputFile in one call: `contents` at `target`, whole or not at all.
void write_file(const std::filesystem::path& target, std::string_view contents,
                std::string_view what);

// A record file that grows by whole lines (the --metrics file: a resumed run
// continues it). Opened with O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW: a
// symlink at `target`, or anything but a regular file, is refused; so is an
// input (check_not_input). The caller chooses what a failed append costs
// (the metrics: Note [write failures] in engine/core/log.h).
class AppendFile {
 public:
  AppendFile(std::filesystem::path target, std::string_view what);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  // Appends `lines` (ending in '\n'), retrying short writes; returns 0, or
  // the errno of the write that failed (ENOSPC for a write of 0 bytes).
  int append(std::string_view lines) noexcept;
  const std::filesystem::path& target() const { return target_; }

 private:
  std::filesystem::path target_;
  int fd_ = -1;
};

}  // namespace lockstep::core
