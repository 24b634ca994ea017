// Reading IDX files (the MNIST family's format: a big-endian header, then
// raw bytes), gzipped as Debian's dataset-fashion-mnist ships them, and
// converting a pair of them (images, labels) into shards. Streams the data in
// pieces, so a conversion never holds a whole file in memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace lockstep::examples {

class IdxFile {
 public:
  // Opens `path` and reads its header; throws lockstep::IoError naming the
  // file when it is missing, is not IDX, does not hold unsigned bytes, or
  // declares sizes that overflow or that its bytes cannot hold (Note [IDX
  // sizes] in idx_file.cpp).
  explicit IdxFile(std::filesystem::path path);
  ~IdxFile();
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;

  // dims[0] is the item count; the rest is the shape of one item.
  const std::vector<std::int64_t>& dims() const { return dims_; }
  std::int64_t item_bytes() const { return item_bytes_; }
  // Reads the next `count` items into `out`; throws when the file ends early.
  void read(std::int64_t count, std::uint8_t* out);

 private:
  std::filesystem::path path_;
  void* file_;  // gzFile
  std::vector<std::int64_t> dims_;
  std::int64_t item_bytes_ = 1;
};

// Converts images [N, dims...] and labels [N] into `shards` shards of u8
// inputs [N, 1, dims...] and i64 labels in `out`, named `split`-*.h5.
void convert_idx(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                 const std::filesystem::path& out, int shards, const std::string& split);

}  // namespace lockstep::examples
