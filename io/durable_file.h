// Files that appear whole or not at all, shared by shards and checkpoints:
// a temporary created exclusively and never through a symlink, written with
// every status checked, fsynced, renamed into place, and its directory fsynced.
// A full disk or any other failure is an IoError naming the file; callers
// remove their temporaries on the way out (remove_temporary).
#pragma once

#include <cstddef>
#include <filesystem>

namespace lockstep::io {

// Creates `path` for writing with O_CREAT | O_EXCL | O_NOFOLLOW: anything
// already there, a symlink included, is an IoError and is left untouched.
// Returns the open descriptor; the caller closes it with close_file().
int create_exclusive(const std::filesystem::path& path);
// Writes all `bytes` to `fd` (retrying short writes); IoError naming `path`.
void write_all(int fd, const void* data, std::size_t bytes, const std::filesystem::path& path);
// fsyncs and closes `fd`; IoError naming `path` when either fails (ENOSPC
// and EIO can surface only here).
void sync_and_close(int fd, const std::filesystem::path& path);
// fsyncs an existing file or directory.
void fsync_path(const std::filesystem::path& path, bool directory);
// Renames `temporary` to `target` and fsyncs the directory that holds them.
void commit_rename(const std::filesystem::path& temporary, const std::filesystem::path& target);
// Removes a leftover temporary (the link itself when it is a symlink: never
// its target). Returns whether something was there.
bool remove_temporary(const std::filesystem::path& path) noexcept;

}  // namespace lockstep::io
