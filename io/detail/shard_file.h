// ShardFile: one open shard. Opening checks everything a reader relies on
// (both datasets, their dtypes, ranks and row counts, that the data lies
// inside the file) and decides how rows are read; read_rows() then serves any
// thread.
//
// Note [contiguous reads]: a contiguous dataset's rows lie back to back at the
// file offset H5Dget_offset reports (absolute: it includes any user block).
// When the dataset is contiguous, stored in this machine's byte
// order and allocated, rows are read with preadv on a file descriptor of our
// own: no HDF5 call, no HDF5 lock, so T threads read in parallel. A run of
// consecutive rows is one preadv scattering each row to its destination.
// Everything else (chunked, compressed, compact, big-endian) goes
// through H5Dread under the HDF5 lock (Note [HDF5 lock], io/hdf5.h),
// which converts byte order and runs the filters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "io/hdf5.h"
#include "io/shard_format.h"

namespace lockstep::io::detail {

// The largest encoded image a shard may hold: ImageNet's largest JPEG is
// about 15 MB; a row past this is damaged offsets, not a photograph.
inline constexpr std::int64_t kMaxEncodedImageBytes = std::int64_t{256} << 20;

class ShardFile {
 public:
  // Opens and checks `path`; throws IoError naming the file, the dataset and
  // what to do. `force_hdf5` reads even a contiguous dataset through HDF5.
  ShardFile(std::filesystem::path path, bool force_hdf5);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const ShardFormat& format() const { return format_; }
  std::int64_t rows() const { return rows_; }
  ShardLayout layout() const { return layout_; }
  // Why rows go through HDF5 ("chunked", "big-endian" ...); empty when contiguous.
  const std::string& layout_reason() const { return layout_reason_; }

  // Every label, converted to i64 (and native byte order) by HDF5 when the
  // shard was opened; the first call moves them out, later calls get none.
  std::vector<std::int64_t> take_labels() { return std::move(labels_values_); }
  // Every target of a target shard, converted to f32 by HDF5 when the shard
  // was opened, row after row; moved out as take_labels.
  std::vector<float> take_targets() { return std::move(target_values_); }
  // Reads local rows `rows` (ascending, no repeats) so that row rows[i] lands
  // at dst[i]; thread-safe. Throws IoError when the file has shrunk or fails.
  void read_rows(std::span<const std::int64_t> rows, std::span<std::byte* const> dst) const;
  // An encoded-image shard's local row `row`: its encoded bytes, replacing
  // `bytes` (Note [encoded offsets] in shard_file.cpp); thread-safe.
  void read_encoded(std::int64_t row, std::vector<std::uint8_t>& bytes) const;

 private:
  void inspect(bool force_hdf5);
  void choose_layout(bool force_hdf5);
  void inspect_offsets(const core::Shape& inputs_extent, const core::Shape& labels_extent,
                       hid_t labels);
  void read_contiguous(std::span<const std::int64_t> rows, std::span<std::byte* const> dst) const;
  void read_through_hdf5(std::span<const std::int64_t> rows, std::span<std::byte* const> dst) const;
  [[noreturn]] void fail(const char* dataset, const std::string& what) const;

  std::filesystem::path path_;
  ShardFormat format_;
  std::int64_t rows_ = 0;
  ShardLayout layout_ = ShardLayout::hdf5;
  std::string layout_reason_;
  int fd_ = -1;
  std::uint64_t file_bytes_ = 0;
  std::uint64_t inputs_offset_ = 0;          // contiguous: where row 0 starts
  std::uint64_t inputs_bytes_ = 0;           // rows x sample bytes, checked against the file
  std::vector<std::int64_t> labels_values_;  // empty without labels
  std::vector<float> target_values_;         // empty without targets
  std::vector<std::int64_t> offsets_;        // encoded images: [rows + 1]
  bool widened_u16_ = false;                 // Note [u16 tokens] in shard_file.cpp
  Hdf5Id file_, inputs_;                     // kept open for the hdf5 layout only
};

}  // namespace lockstep::io::detail
