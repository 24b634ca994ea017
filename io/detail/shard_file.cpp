// Opening, checking and reading one shard (io/detail/shard_file.h).
#include "io/detail/shard_file.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string_view>

#include "io/hdf5.h"
#include "kernels/checked_math.h"

namespace lockstep::io::detail {
namespace {

constexpr std::size_t kMaxIovecs = IOV_MAX;

}  // namespace

ShardFile::ShardFile(std::filesystem::path path, bool force_hdf5) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw IoError("cannot open shard '" + path_.string() + "': " + std::strerror(errno) +
                  " (check the path and its permissions)");
  struct stat info {};
  if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd_);
    throw IoError("shard '" + path_.string() + "' is not a regular file");
  }
  file_bytes_ = static_cast<std::uint64_t>(info.st_size);
  try {
    inspect(force_hdf5);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ShardFile::~ShardFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ShardFile::fail(const char* dataset, const std::string& what) const {
  throw IoError("shard '" + path_.string() + "'" +
                (dataset ? std::string(", dataset '") + dataset + "'" : std::string()) + ": " +
                what);
}

void ShardFile::inspect(bool force_hdf5) {
  Hdf5Lock lock;
  const char* current = nullptr;  // the dataset being looked at, for messages
  try {
    file_ = open_hdf5_file(path_, "shard");
    Hdf5Id labels, targets;
    core::Shape inputs_extent, labels_extent, targets_extent;
    format_.has_labels = LOCKSTEP_CHECK_HDF5(H5Lexists(file_.get(), kLabelsName, H5P_DEFAULT)) > 0;
    format_.has_targets =
        LOCKSTEP_CHECK_HDF5(H5Lexists(file_.get(), kTargetsName, H5P_DEFAULT)) > 0;
    format_.encoded = LOCKSTEP_CHECK_HDF5(H5Lexists(file_.get(), kOffsetsName, H5P_DEFAULT)) > 0;
    if (format_.encoded && !format_.has_labels)
      fail(kOffsetsName,
           "present, so the shard holds encoded images, but it has no 'labels' (an encoded-image "
           "shard holds 'inputs' u8 [bytes], 'offsets' [N+1] and 'labels' [N]; see "
           "docs/data-format.md)");
    if (format_.has_labels && format_.has_targets)
      fail(nullptr,
           "holds both 'labels' and 'targets'; a shard trains towards one of them (class "
           "indices in 'labels', float values in 'targets': write only the one the loss reads)");
    for (const char* name : {kInputsName, kLabelsName, kTargetsName}) {
      current = name;
      const std::string_view which(name);
      const bool is_inputs = which == kInputsName, is_targets = which == kTargetsName;
      if ((which == kLabelsName && !format_.has_labels) || (is_targets && !format_.has_targets))
        continue;
      if (is_inputs && LOCKSTEP_CHECK_HDF5(H5Lexists(file_.get(), name, H5P_DEFAULT)) == 0)
        fail(name,
             "missing (a shard holds 'inputs' [N, ...] and 'labels' [N] or 'targets' [N, ...]; "
             "see docs/data-format.md)");
      Hdf5Id dataset(LOCKSTEP_CHECK_HDF5(H5Dopen2(file_.get(), name, H5P_DEFAULT)));
      const Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Dget_type(dataset.get())));
      auto dtype = dtype_of(type.get());
      const H5T_class_t type_class = LOCKSTEP_CHECK_HDF5(H5Tget_class(type.get()));
      // Note [u16 tokens]: token shards may store u16 (GPT-2's vocabulary fits);
      // HDF5 widens them to i32 on read, so they take the hdf5 read path.
      if (is_inputs && format_.is_tokens() && is_u16(type.get())) {
        dtype = DType::i32;
        widened_u16_ = true;
      }
      if (is_inputs && format_.is_tokens() && dtype != DType::i32)
        fail(kLabelsName,
             "missing (a shard holds 'inputs' [N, ...] and 'labels' [N] or 'targets' [N, ...], "
             "or only 'inputs' of i32 or u16 tokens [N, T+1]; these inputs are " +
                 describe_type(type.get()) + "; see docs/data-format.md)");
      if (is_inputs) {
        // Token inputs are i32 here (checked just above).
        if (!dtype || !(format_.is_tokens() || *dtype == DType::u8 || *dtype == DType::f16 ||
                        *dtype == DType::f32))
          fail(name, "stored as " + describe_type(type.get()) +
                         "; lockstep reads u8, f16 or f32 inputs (in h5py, write them with "
                         "f.create_dataset('inputs', data=x.astype('float32')), or 'uint8' for "
                         "images of bytes)");
        format_.input_dtype = *dtype;
      } else if (!is_targets) {
        // Labels of any integer type (h5py's uint8 included); HDF5 converts
        // them to i64 on read, and check_labels bounds them by the classes.
        if (type_class != H5T_INTEGER)
          fail(name, "stored as " + describe_type(type.get()) +
                         "; labels are class indices of an integer type (in h5py: "
                         "f.create_dataset('labels', data=y.astype('int64')); float values "
                         "belong in a 'targets' dataset)");
        format_.label_dtype = dtype.value_or(DType::i64);
      } else if (type_class != H5T_FLOAT || !dtype || *dtype == DType::bf16) {
        fail(name, "stored as " + describe_type(type.get()) +
                       "; targets are f32 or f16 values (in h5py: "
                       "f.create_dataset('targets', data=t.astype('float32')); class indices "
                       "belong in a 'labels' dataset)");
      }
      const std::string object = "shard '" + path_.string() + "', dataset '" + name + "'";
      (is_inputs    ? inputs_extent
       : is_targets ? targets_extent
                    : labels_extent) = extent_of(dataset.get(), object);
      check_storage(dataset.get(), object);
      (is_inputs ? inputs_ : is_targets ? targets : labels) = std::move(dataset);
    }
    current = nullptr;
    if (format_.encoded) {
      current = kOffsetsName;
      inspect_offsets(inputs_extent, labels_extent, labels.get());
      current = kInputsName;
      choose_layout(force_hdf5);
      if (layout_ == ShardLayout::contiguous) {
        inputs_.reset();
        file_.reset();
      }
      return;
    }
    if (inputs_extent.empty())
      fail(kInputsName, "is a scalar; inputs are [N, ...] with one row per sample");
    if (format_.is_tokens() && (inputs_extent.size() != 2 || inputs_extent[1] < 2))
      fail(kInputsName, "has shape " + core::shape_str(inputs_extent) +
                            "; a token shard (no 'labels') holds windows [N, T+1] with T >= 1");
    if (format_.has_labels && labels_extent.size() != 1)
      fail(kLabelsName, "has shape " + core::shape_str(labels_extent) + "; labels are [N]");
    if (format_.has_labels && inputs_extent[0] != labels_extent[0])
      fail(nullptr, fmt::format("'inputs' has {} rows but 'labels' has {} (every sample needs "
                                "exactly one label; re-create the shard)",
                                inputs_extent[0], labels_extent[0]));
    if (format_.has_targets && targets_extent.empty())
      fail(kTargetsName, "is a scalar; targets are [N, ...] with one row per sample");
    if (format_.has_targets && inputs_extent[0] != targets_extent[0])
      fail(nullptr, fmt::format("'inputs' has {} rows but 'targets' has {} (every sample needs "
                                "exactly one row of targets; re-create the shard)",
                                inputs_extent[0], targets_extent[0]));
    rows_ = inputs_extent[0];
    format_.sample_shape.assign(inputs_extent.begin() + 1, inputs_extent.end());
    if (format_.has_targets)
      format_.target_shape.assign(targets_extent.begin() + 1, targets_extent.end());
    // Everything is sized from these extents: bound them by the file before
    // any buffer is (Note [hostile files] in io/hdf5.h).
    const std::uint64_t limit = checked_mul(kMaxExpansion, file_bytes_, "shard size bound");
    std::uint64_t sample_bytes = dtype_size(format_.input_dtype), labels_bytes = 0,
                  target_values = 1;
    for (std::int64_t d : format_.sample_shape)
      if (__builtin_mul_overflow(sample_bytes, static_cast<std::uint64_t>(d), &sample_bytes))
        sample_bytes = limit + 1;
    for (std::int64_t d : format_.target_shape)
      if (__builtin_mul_overflow(target_values, static_cast<std::uint64_t>(d), &target_values))
        target_values = limit + 1;
    if (sample_bytes == 0)
      fail(kInputsName, "has shape " + core::shape_str(inputs_extent) + ": samples of zero bytes");
    // Labels are read as i64, targets as f32: 8 or 4 bytes a value.
    const std::uint64_t per_row = format_.has_targets ? 4 * target_values : sizeof(std::int64_t);
    if (__builtin_mul_overflow(sample_bytes, static_cast<std::uint64_t>(rows_), &inputs_bytes_) ||
        __builtin_mul_overflow(per_row, static_cast<std::uint64_t>(rows_), &labels_bytes) ||
        inputs_bytes_ > limit || labels_bytes > limit)
      fail(nullptr, fmt::format("inputs {} and {} [{}] hold more bytes than a file of {} "
                                "bytes can (the shard is damaged: re-create it)",
                                core::shape_str(inputs_extent),
                                format_.has_targets ? "targets" : "labels", rows_, file_bytes_));

    current = kLabelsName;
    if (format_.has_labels) {
      labels_values_.resize(static_cast<std::size_t>(rows_));
      if (rows_ > 0) {
        const Hdf5Id memory = memory_type(DType::i64);
        LOCKSTEP_CHECK_HDF5(H5Dread(labels.get(), memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                    labels_values_.data()));
      }
    }
    current = kTargetsName;
    if (format_.has_targets) {
      target_values_.resize(static_cast<std::size_t>(labels_bytes / 4));
      if (!target_values_.empty()) {
        const Hdf5Id memory = memory_type(DType::f32);
        LOCKSTEP_CHECK_HDF5(H5Dread(targets.get(), memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                    target_values_.data()));
      }
      if (const auto bad = std::find_if(target_values_.begin(), target_values_.end(),
                                        [](float v) { return !std::isfinite(v); });
          bad != target_values_.end())
        fail(kTargetsName,
             fmt::format("row {} holds {}: targets must be finite (a NaN or inf target makes "
                         "every step non-finite; fix the data)",
                         (bad - target_values_.begin()) / static_cast<std::int64_t>(target_values),
                         *bad));
    }
    current = kInputsName;
    choose_layout(force_hdf5);
  } catch (const LibraryError& e) {
    fail(current, std::string("HDF5 cannot read it: ") + e.what() +
                      " (the file is truncated or corrupt: re-create it)");
  }
  if (layout_ == ShardLayout::contiguous) {
    inputs_.reset();
    file_.reset();
  }
}

// Note [encoded offsets]: every size of an encoded-image shard comes from
// the file, so each is checked before it sizes anything: the byte count and
// the row count against the file's size (kMaxExpansion), offsets[0] == 0,
// each offset above the one before (an image of no bytes is an error here,
// not a decoder's puzzle), the last one equal to the byte count, and no
// image larger than kMaxEncodedImageBytes. read_encoded() then reads only
// ranges inside 'inputs'.
void ShardFile::inspect_offsets(const core::Shape& inputs_extent, const core::Shape& labels_extent,
                                hid_t labels) {
  if (format_.input_dtype != DType::u8 || inputs_extent.size() != 1)
    fail(kInputsName, fmt::format("is {} {}; an encoded-image shard's inputs are the files' "
                                  "bytes, u8 [total bytes] (in h5py: "
                                  "np.frombuffer(b''.join(files), dtype='uint8'))",
                                  dtype_name(format_.input_dtype), core::shape_str(inputs_extent)));
  if (labels_extent.size() != 1)
    fail(kLabelsName, "has shape " + core::shape_str(labels_extent) + "; labels are [N]");
  const char* current = kOffsetsName;
  const Hdf5Id offsets(LOCKSTEP_CHECK_HDF5(H5Dopen2(file_.get(), current, H5P_DEFAULT)));
  const Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Dget_type(offsets.get())));
  if (LOCKSTEP_CHECK_HDF5(H5Tget_class(type.get())) != H5T_INTEGER)
    fail(current, "stored as " + describe_type(type.get()) +
                      "; offsets are byte positions of an integer type (in h5py: "
                      "f.create_dataset('offsets', data=offsets.astype('int64')))");
  const std::string object = "shard '" + path_.string() + "', dataset '" + current + "'";
  const core::Shape extent = extent_of(offsets.get(), object);
  check_storage(offsets.get(), object);
  rows_ = labels_extent[0];
  if (extent.size() != 1 || extent[0] != rows_ + 1)
    fail(current, fmt::format("has shape {}, but 'labels' has {} rows: offsets are [N+1], "
                              "row i's bytes being [offsets[i], offsets[i+1]) (re-create the "
                              "shard)",
                              core::shape_str(extent), rows_));
  inputs_bytes_ = static_cast<std::uint64_t>(inputs_extent[0]);
  const std::uint64_t limit = checked_mul(kMaxExpansion, file_bytes_, "shard size bound");
  if (inputs_bytes_ > limit || static_cast<std::uint64_t>(rows_) > limit / sizeof(std::int64_t))
    fail(nullptr, fmt::format("inputs of {} bytes and {} rows are more than a file of {} bytes "
                              "can hold (the shard is damaged: re-create it)",
                              inputs_bytes_, rows_, file_bytes_));
  offsets_.resize(static_cast<std::size_t>(rows_) + 1);
  const Hdf5Id memory = memory_type(DType::i64);
  LOCKSTEP_CHECK_HDF5(
      H5Dread(offsets.get(), memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data()));
  if (offsets_[0] != 0)
    fail(current,
         fmt::format("starts at {}; offsets[0] is 0, the first image's first byte", offsets_[0]));
  for (std::int64_t row = 0; row < rows_; ++row) {
    const std::int64_t begin = offsets_[row], end = offsets_[row + 1];
    if (end <= begin || static_cast<std::uint64_t>(end) > inputs_bytes_ ||
        end - begin > kMaxEncodedImageBytes)
      fail(current, fmt::format("row {} spans bytes [{}, {}), but a row holds between 1 and {} "
                                "bytes inside 'inputs' [0, {}) (the offsets are damaged: "
                                "re-create the shard)",
                                row, begin, end, kMaxEncodedImageBytes, inputs_bytes_));
  }
  if (static_cast<std::uint64_t>(offsets_[rows_]) != inputs_bytes_)
    fail(current, fmt::format("ends at {}, but 'inputs' holds {} bytes: the last offset is the "
                              "byte count (re-create the shard)",
                              offsets_[rows_], inputs_bytes_));
  labels_values_.resize(static_cast<std::size_t>(rows_));
  if (rows_ > 0) {
    const Hdf5Id label_memory = memory_type(DType::i64);
    LOCKSTEP_CHECK_HDF5(
        H5Dread(labels, label_memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, labels_values_.data()));
  }
}

void ShardFile::read_encoded(std::int64_t row, std::vector<std::uint8_t>& bytes) const {
  if (!format_.encoded || row < 0 || row >= rows_)
    throw InvalidArgument(fmt::format("shard '{}': read_encoded({}) of a shard {} rows of {}",
                                      path_.string(), row, rows_, format_.str()));
  const auto begin = static_cast<std::uint64_t>(offsets_[row]);
  const auto count = static_cast<std::size_t>(offsets_[row + 1] - offsets_[row]);
  bytes.resize(count);
  if (layout_ == ShardLayout::contiguous) {
    for (std::size_t done = 0; done < count;) {
      const ssize_t n = ::pread(fd_, bytes.data() + done, count - done,
                                static_cast<off_t>(inputs_offset_ + begin + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        fail(kInputsName,
             fmt::format("reading row {} ({} bytes at byte {}): {} (the file changed after it "
                         "was opened; re-create the shard and restart)",
                         row, count, inputs_offset_ + begin + done,
                         n < 0 ? std::strerror(errno) : "the file ends there"));
      done += static_cast<std::size_t>(n);
    }
    return;
  }
  Hdf5Lock lock;
  try {
    const Hdf5Id file_space(LOCKSTEP_CHECK_HDF5(H5Dget_space(inputs_.get())));
    const hsize_t start = begin, size = count;
    LOCKSTEP_CHECK_HDF5(
        H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &size, nullptr));
    const Hdf5Id memory_space(LOCKSTEP_CHECK_HDF5(H5Screate_simple(1, &size, nullptr)));
    const Hdf5Id memory = memory_type(DType::u8);
    LOCKSTEP_CHECK_HDF5(H5Dread(inputs_.get(), memory.get(), memory_space.get(), file_space.get(),
                                H5P_DEFAULT, bytes.data()));
  } catch (const LibraryError& e) {
    fail(kInputsName, fmt::format("reading row {} ({}): {} (the file is corrupt or changed "
                                  "after it was opened; re-create it)",
                                  row, layout_reason_, e.what()));
  }
}

void ShardFile::choose_layout(bool force_hdf5) {
  const Hdf5Id dcpl(LOCKSTEP_CHECK_HDF5(H5Dget_create_plist(inputs_.get())));
  const Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Dget_type(inputs_.get())));
  const H5D_layout_t layout = LOCKSTEP_CHECK_HDF5(H5Pget_layout(dcpl.get()));
  if (force_hdf5) {
    layout_reason_ = "read through HDF5 on request";
  } else if (widened_u16_) {
    layout_reason_ = "u16 tokens, widened to i32 (Note [u16 tokens])";
  } else if (layout == H5D_CHUNKED) {
    const int filters = LOCKSTEP_CHECK_HDF5(H5Pget_nfilters(dcpl.get()));
    layout_reason_ = filters > 0 ? "chunked with filters" : "chunked";
  } else if (layout != H5D_CONTIGUOUS) {
    layout_reason_ = layout == H5D_COMPACT ? "compact" : "virtual";
  } else if (!native_order(type.get())) {
    layout_reason_ = "big-endian";
  } else if (rows_ > 0) {
    const haddr_t offset = H5Dget_offset(inputs_.get());
    H5Eclear2(H5E_DEFAULT);  // an unallocated dataset has no offset: not an error
    if (offset == HADDR_UNDEF) {
      layout_reason_ = "not allocated";
    } else {
      if (offset > file_bytes_ || inputs_bytes_ > file_bytes_ - offset)
        fail(kInputsName,
             fmt::format("truncated: its {} rows need {} bytes from byte {}, but the file has {} "
                         "bytes (re-create the shard)",
                         rows_, inputs_bytes_, offset, file_bytes_));
      inputs_offset_ = offset;
    }
  }
  layout_ = layout_reason_.empty() ? ShardLayout::contiguous : ShardLayout::hdf5;
}

void ShardFile::read_rows(std::span<const std::int64_t> rows,
                          std::span<std::byte* const> dst) const {
  if (rows.empty()) return;
  if (layout_ == ShardLayout::contiguous)
    read_contiguous(rows, dst);
  else
    read_through_hdf5(rows, dst);
}

void ShardFile::read_contiguous(std::span<const std::int64_t> rows,
                                std::span<std::byte* const> dst) const {
  const std::size_t row_bytes = format_.sample_bytes();
  std::vector<iovec> iov;
  iov.reserve(std::min(rows.size(), kMaxIovecs));
  for (std::size_t first = 0; first < rows.size();) {
    std::size_t end = first + 1;
    while (end < rows.size() && rows[end] == rows[end - 1] + 1 && end - first < kMaxIovecs) ++end;
    iov.clear();
    for (std::size_t i = first; i < end; ++i) iov.push_back({dst[i], row_bytes});
    auto offset = static_cast<off_t>(inputs_offset_ + rows[first] * row_bytes);
    std::size_t next = 0;  // first iovec not yet filled
    while (next < iov.size()) {
      // One row is a pread: preadv's iovec import costs ~5% at 12 KB rows.
      const ssize_t n =
          iov.size() - next == 1
              ? ::pread(fd_, iov[next].iov_base, iov[next].iov_len, offset)
              : ::preadv(fd_, iov.data() + next, static_cast<int>(iov.size() - next), offset);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        fail(kInputsName,
             fmt::format("reading rows {}..{} at byte {}: {} (the file changed after it was "
                         "opened; re-create the shard and restart)",
                         rows[first], rows[end - 1] + 1, offset,
                         n < 0 ? std::strerror(errno) : "the file ends there"));
      offset += n;
      auto left = static_cast<std::size_t>(n);
      while (left > 0 && left >= iov[next].iov_len) left -= iov[next++].iov_len;
      if (left > 0) {
        iov[next].iov_base = static_cast<std::byte*>(iov[next].iov_base) + left;
        iov[next].iov_len -= left;
      }
    }
    first = end;
  }
}

void ShardFile::read_through_hdf5(std::span<const std::int64_t> rows,
                                  std::span<std::byte* const> dst) const {
  const std::size_t row_bytes = format_.sample_bytes();
  std::vector<std::byte> scratch(rows.size() * row_bytes);
  {
    Hdf5Lock lock;
    try {
      const Hdf5Id file_space(LOCKSTEP_CHECK_HDF5(H5Dget_space(inputs_.get())));
      std::vector<hsize_t> start(format_.sample_shape.size() + 1, 0);
      std::vector<hsize_t> count{0};
      for (std::int64_t d : format_.sample_shape) count.push_back(static_cast<hsize_t>(d));
      for (std::size_t first = 0; first < rows.size();) {
        std::size_t end = first + 1;
        while (end < rows.size() && rows[end] == rows[end - 1] + 1) ++end;
        start[0] = static_cast<hsize_t>(rows[first]);
        count[0] = end - first;
        LOCKSTEP_CHECK_HDF5(H5Sselect_hyperslab(file_space.get(),
                                                first == 0 ? H5S_SELECT_SET : H5S_SELECT_OR,
                                                start.data(), nullptr, count.data(), nullptr));
        first = end;
      }
      count[0] = rows.size();
      const Hdf5Id memory_space(LOCKSTEP_CHECK_HDF5(
          H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)));
      const Hdf5Id memory = memory_type(format_.input_dtype);
      LOCKSTEP_CHECK_HDF5(H5Dread(inputs_.get(), memory.get(), memory_space.get(), file_space.get(),
                                  H5P_DEFAULT, scratch.data()));
    } catch (const LibraryError& e) {
      fail(kInputsName, fmt::format("reading {} rows ({}): {} (the file is corrupt or changed "
                                    "after it was opened; re-create it)",
                                    rows.size(), layout_reason_, e.what()));
    }
  }
  // HDF5 delivers a union of hyperslabs in file order, which is `rows` order.
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dst[i], scratch.data() + i * row_bytes, row_bytes);
}

}  // namespace lockstep::io::detail
