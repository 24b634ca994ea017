// EncodedShardWriter: writes one encoded-image shard (docs/data-format.md):
// the image files' bytes back to back in 'inputs' u8, their byte ranges in
// 'offsets' i64 [N+1] and their classes in 'labels' i64 [N]. Like
// ShardWriter (io/shard_writer.h) it fills "<name>.tmp", fsyncs it and
// renames it, so a reader never takes half a shard for a whole one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

namespace lockstep::io {

class EncodedShardWriter {
 public:
  // Starts `path` holding one image for each entry of `image_bytes` (each
  // image's size in bytes, at least 1), appended in that order.
  EncodedShardWriter(std::filesystem::path path, std::span<const std::int64_t> image_bytes);
  // Without close(): removes the temporary file; the final name is untouched.
  ~EncodedShardWriter();
  EncodedShardWriter(const EncodedShardWriter&) = delete;
  EncodedShardWriter& operator=(const EncodedShardWriter&) = delete;

  // Appends the next image, which must have the size given for it, and its class.
  void append(std::span<const std::uint8_t> image, std::int64_t label);
  // Checks that every image was written, writes the labels, fsyncs and renames.
  void close();

  std::int64_t rows() const { return static_cast<std::int64_t>(offsets_.size()) - 1; }
  std::int64_t written() const { return static_cast<std::int64_t>(labels_.size()); }

 private:
  struct Handles;
  std::filesystem::path path_, temp_path_;
  std::vector<std::int64_t> offsets_;  // [rows + 1]
  std::vector<std::int64_t> labels_;   // appended so far
  std::unique_ptr<Handles> handles_;
};

}  // namespace lockstep::io
