// Writing shards: ShardWriter writes one HDF5 file, DatasetWriter spreads a
// stream of samples over S of them. Shards are contiguous (unchunked, so
// readers can pread rows; Note [contiguous reads] in io/detail/shard_file.h)
// and appear under their final name only once complete: a writer fills
// "<name>.tmp", fsyncs it and renames it, so a crash never leaves half a shard
// that a reader would take for a whole one. The temporary takes its whole
// size on disk first, so a full disk fails there (Note [reserved shard]).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/shard_format.h"

namespace lockstep::io {

// Throws InvalidArgument unless shards can store `format`: inputs u8, f16 or
// f32 with every sample dimension at least 1; labels i32 or i64; or, without
// labels, i32 token windows [N, T+1] with T >= 1.
void check_format(const ShardFormat& format);

class ShardWriter {
 public:
  // Starts `path` (written as path + ".tmp" until close()) holding `rows` samples.
  ShardWriter(std::filesystem::path path, const ShardFormat& format, std::int64_t rows);
  // Without close(): removes the temporary file; the final name is untouched.
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends `count` samples: inputs in the format's dtype and sample shape,
  // labels in its label dtype (null for a token shard), both row-major and contiguous.
  void append(const void* inputs, const void* labels, std::int64_t count);
  // Checks that every row was written, flushes, fsyncs and renames into place.
  void close();

  std::int64_t rows() const { return rows_; }
  std::int64_t written() const { return written_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  struct Handles;
  std::filesystem::path path_, temp_path_;
  ShardFormat format_;
  std::int64_t rows_, written_ = 0;
  std::unique_ptr<Handles> handles_;
};

class DatasetWriter {
 public:
  // Shards of `directory` named "<prefix>-00000-of-00004.h5" ..., which sort
  // in sample order; shard i holds samples [i*N/S, (i+1)*N/S). The directory
  // is created if needed and must not already hold *.h5 files (a stale shard
  // would silently join the dataset).
  DatasetWriter(std::filesystem::path directory, const ShardFormat& format, std::int64_t total_rows,
                int shards, std::string prefix = "shard");
  // Without close() (an exception on the way): also removes the shards it
  // completed, so that no partial dataset is left to be mistaken for a whole.
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Appends `count` samples in order, crossing shard boundaries as needed.
  void append(const void* inputs, const void* labels, std::int64_t count);
  // Closes the last shard; throws unless exactly total_rows were appended.
  void close();

  std::int64_t total_rows() const { return total_rows_; }
  std::int64_t written() const { return written_; }
  // Final paths of every shard, in order.
  const std::vector<std::filesystem::path>& shard_paths() const { return paths_; }

 private:
  std::int64_t shard_end(int shard) const;

  ShardFormat format_;
  std::int64_t total_rows_, written_ = 0;
  std::vector<std::filesystem::path> paths_;
  int current_ = -1;
  bool closed_ = false;
  std::unique_ptr<ShardWriter> writer_;
};

}  // namespace lockstep::io
