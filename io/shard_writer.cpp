// ShardWriter and DatasetWriter (io/shard_writer.h): contiguous HDF5 shards
// written under a temporary name, fsynced, then renamed into place.
#include "io/shard_writer.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "io/check_hdf5.h"
#include "io/detail/hdf5_types.h"

namespace lockstep::io {
namespace {

namespace fs = std::filesystem;
using detail::Hdf5Id;

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

// Makes the bytes of `path` durable (after HDF5 has closed it).
void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    throw IoError("cannot fsync " + quoted(path) + ": " + std::strerror(error) +
                  " (check the disk and its free space)");
  }
  ::close(fd);
}

std::vector<hsize_t> dims_of(std::int64_t rows, const core::Shape& sample_shape) {
  std::vector<hsize_t> dims{static_cast<hsize_t>(rows)};
  for (std::int64_t d : sample_shape) dims.push_back(static_cast<hsize_t>(d));
  return dims;
}

// A contiguous dataset whose storage is allocated now, never pre-filled: the
// writer overwrites every byte, and readers may ask for its offset at once.
Hdf5Id create_contiguous(hid_t file, const char* name, DType type,
                         const std::vector<hsize_t>& dims) {
  Hdf5Id space(
      LOCKSTEP_CHECK_HDF5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
  Hdf5Id dcpl(LOCKSTEP_CHECK_HDF5(H5Pcreate(H5P_DATASET_CREATE)));
  LOCKSTEP_CHECK_HDF5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  LOCKSTEP_CHECK_HDF5(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  LOCKSTEP_CHECK_HDF5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  const Hdf5Id type_id = detail::file_type(type);
  return Hdf5Id(LOCKSTEP_CHECK_HDF5(
      H5Dcreate2(file, name, type_id.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)));
}

// Writes `count` rows starting at row `first` of a dataset [rows, ...].
void write_rows(hid_t dataset, DType type, const core::Shape& sample_shape, std::int64_t first,
                std::int64_t count, const void* data) {
  std::vector<hsize_t> start(sample_shape.size() + 1, 0);
  start[0] = static_cast<hsize_t>(first);
  const std::vector<hsize_t> block = dims_of(count, sample_shape);
  Hdf5Id file_space(LOCKSTEP_CHECK_HDF5(H5Dget_space(dataset)));
  LOCKSTEP_CHECK_HDF5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                          block.data(), nullptr));
  Hdf5Id memory_space(
      LOCKSTEP_CHECK_HDF5(H5Screate_simple(static_cast<int>(block.size()), block.data(), nullptr)));
  const Hdf5Id memory_type = detail::memory_type(type);
  LOCKSTEP_CHECK_HDF5(H5Dwrite(dataset, memory_type.get(), memory_space.get(), file_space.get(),
                               H5P_DEFAULT, data));
}

}  // namespace

void check_format(const ShardFormat& format) {
  if (!format.has_labels) {
    if (format.input_dtype != DType::i32 || format.sample_shape.size() != 1 ||
        format.sample_shape[0] < 2)
      throw InvalidArgument(
          "a token shard (no labels) holds i32 windows [N, T+1] with T >= 1, not " + format.str());
    return;
  }
  if (format.input_dtype != DType::u8 && format.input_dtype != DType::f16 &&
      format.input_dtype != DType::f32)
    throw InvalidArgument(std::string("shard inputs must be u8, f16 or f32, not ") +
                          dtype_name(format.input_dtype));
  if (format.label_dtype != DType::i64 && format.label_dtype != DType::i32)
    throw InvalidArgument(std::string("shard labels must be i64 or i32, not ") +
                          dtype_name(format.label_dtype));
  for (std::int64_t d : format.sample_shape)
    if (d < 1)
      throw InvalidArgument("sample shape " + core::shape_str(format.sample_shape) +
                            " has a dimension below 1");
}

struct ShardWriter::Handles {
  Hdf5Id file, inputs, labels;
};

ShardWriter::ShardWriter(fs::path path, const ShardFormat& format, std::int64_t rows)
    : path_(std::move(path)), format_(format), rows_(rows) {
  check_format(format);
  if (rows < 0)
    throw InvalidArgument("shard " + quoted(path_) + ": row count " + std::to_string(rows) +
                          " is negative (pass the number of samples the shard will hold)");
  temp_path_ = path_;
  temp_path_ += ".tmp";
  Hdf5Lock lock;
  handles_ = std::make_unique<Handles>();
  try {
    handles_->file = Hdf5Id(LOCKSTEP_CHECK_HDF5(
        H5Fcreate(temp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
    handles_->inputs = create_contiguous(handles_->file.get(), kInputsName, format.input_dtype,
                                         dims_of(rows, format.sample_shape));
    if (format.has_labels)
      handles_->labels =
          create_contiguous(handles_->file.get(), kLabelsName, format.label_dtype, {hsize_t(rows)});
  } catch (const LibraryError& e) {
    handles_.reset();
    std::error_code ignored;
    fs::remove(temp_path_, ignored);
    throw IoError("cannot create shard " + quoted(temp_path_) + " (" + format.str() + ", " +
                  std::to_string(rows) + " rows): " + e.what() +
                  " (check that the directory exists and is writable)");
  }
}

ShardWriter::~ShardWriter() {
  if (!handles_) return;
  handles_.reset();
  std::error_code ignored;
  fs::remove(temp_path_, ignored);
}

void ShardWriter::append(const void* inputs, const void* labels, std::int64_t count) {
  if (!handles_)
    throw InvalidArgument("shard " + quoted(path_) +
                          " is already closed (append every row before close())");
  if (count < 0 || written_ + count > rows_)
    throw InvalidArgument(fmt::format(
        "shard {}: appending {} rows to {} of {} overflows it (create the writer with the "
        "shard's full row count)",
        quoted(path_), count, written_, rows_));
  if (count == 0) return;
  Hdf5Lock lock;
  try {
    write_rows(handles_->inputs.get(), format_.input_dtype, format_.sample_shape, written_, count,
               inputs);
    if (format_.has_labels)
      write_rows(handles_->labels.get(), format_.label_dtype, {}, written_, count, labels);
  } catch (const LibraryError& e) {
    throw IoError("writing rows " + std::to_string(written_) + ".." +
                  std::to_string(written_ + count) + " of shard " + quoted(temp_path_) + ": " +
                  e.what() + " (check the disk and its free space)");
  }
  written_ += count;
}

void ShardWriter::close() {
  if (!handles_)
    throw InvalidArgument("shard " + quoted(path_) + " is already closed (close it only once)");
  if (written_ != rows_)
    throw InvalidArgument(
        fmt::format("shard {}: closed after {} of its {} rows (append the rest before close())",
                    quoted(path_), written_, rows_));
  {
    Hdf5Lock lock;
    handles_->inputs.reset();
    handles_->labels.reset();
    try {
      LOCKSTEP_CHECK_HDF5(H5Fclose(handles_->file.release()));
    } catch (const LibraryError& e) {
      throw IoError("closing shard " + quoted(temp_path_) + ": " + e.what() +
                    " (check the disk and its free space)");
    }
  }
  fsync_path(temp_path_, false);
  std::error_code error;
  fs::rename(temp_path_, path_, error);
  if (error)
    throw IoError("cannot rename " + quoted(temp_path_) + " to " + quoted(path_) + ": " +
                  error.message());
  handles_.reset();
  fsync_path(path_.has_parent_path() ? path_.parent_path() : fs::path("."), true);
}

DatasetWriter::DatasetWriter(fs::path directory, const ShardFormat& format, std::int64_t total_rows,
                             int shards, std::string prefix)
    : format_(format), total_rows_(total_rows) {
  check_format(format);
  if (shards < 1 || total_rows < shards)
    throw InvalidArgument(
        fmt::format("{} shards for {} samples: need at least one shard and one sample per shard",
                    shards, total_rows));
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) throw IoError("cannot create directory " + quoted(directory) + ": " + error.message());
  for (const auto& entry : fs::directory_iterator(directory))
    if (entry.path().extension() == ".h5")
      throw IoError("directory " + quoted(directory) + " already holds shards (" +
                    entry.path().filename().string() +
                    "); remove them or write to an empty directory");
  for (int i = 0; i < shards; ++i)
    paths_.push_back(directory / fmt::format("{}-{:05d}-of-{:05d}.h5", prefix, i, shards));
}

DatasetWriter::~DatasetWriter() {
  if (closed_) return;
  writer_.reset();
  std::error_code ignored;
  for (int i = 0; i < current_; ++i) fs::remove(paths_[i], ignored);
}

std::int64_t DatasetWriter::shard_end(int shard) const {
  return total_rows_ * (shard + 1) / static_cast<std::int64_t>(paths_.size());
}

void DatasetWriter::append(const void* inputs, const void* labels, std::int64_t count) {
  if (count < 0 || written_ + count > total_rows_)
    throw InvalidArgument(fmt::format(
        "dataset writer: appending {} samples to {} of {} overflows (create the writer with "
        "the dataset's full sample count)",
        count, written_, total_rows_));
  const auto* in = static_cast<const std::byte*>(inputs);
  const auto* lab = static_cast<const std::byte*>(labels);
  while (count > 0) {
    if (!writer_ || writer_->written() == writer_->rows()) {
      if (writer_) writer_->close();
      ++current_;
      const std::int64_t begin = current_ == 0 ? 0 : shard_end(current_ - 1);
      writer_ =
          std::make_unique<ShardWriter>(paths_[current_], format_, shard_end(current_) - begin);
    }
    const std::int64_t n = std::min(count, writer_->rows() - writer_->written());
    writer_->append(in, lab, n);
    in += n * format_.sample_bytes();
    if (lab) lab += n * dtype_size(format_.label_dtype);
    written_ += n;
    count -= n;
  }
}

void DatasetWriter::close() {
  if (written_ != total_rows_)
    throw InvalidArgument(
        fmt::format("dataset writer: closed after {} of its {} samples (append the rest before "
                    "close())",
                    written_, total_rows_));
  if (writer_) writer_->close();
  writer_.reset();
  closed_ = true;
}

}  // namespace lockstep::io
