// ShardWriter and DatasetWriter (io/shard_writer.h): contiguous HDF5 shards
// written under a temporary name that holds its space from the start, fsynced,
// then renamed into place.
//
// Note [reserved shard]: a shard's temporary takes all the disk space it will
// need (posix_fallocate up to HDF5's end of allocation, the datasets being
// allocated early) before HDF5 has written a byte to it. A full disk or a
// quota then fails there, as an IoError naming the shard and the cause, and
// no later write of HDF5's can fail for space. Without it, a disk that filled
// as HDF5 flushed a dataset on close left that identifier open, and HDF5
// crashed at exit in its library shutdown (SIGSEGV), as checkpoint saves once
// did (Note [checkpoint image] in engine/checkpoint_file.cpp, which builds its
// files in memory instead: shards can be larger than memory).
#include "io/shard_writer.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "engine/core/log.h"
#include "engine/core/output_file.h"
#include "io/hdf5.h"

namespace lockstep::io {
namespace {

namespace fs = std::filesystem;

std::string quoted(const fs::path& path) { return fmt::format("'{}'", path.string()); }

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
  Hdf5Id type_id = file_type(type);
  Hdf5Id dataset(LOCKSTEP_CHECK_HDF5(
      H5Dcreate2(file, name, type_id.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)));
  type_id.close();
  dcpl.close();
  space.close();
  return dataset;
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
  Hdf5Id memory_type = io::memory_type(type);
  LOCKSTEP_CHECK_HDF5(H5Dwrite(dataset, memory_type.get(), memory_space.get(), file_space.get(),
                               H5P_DEFAULT, data));
  memory_type.close();
  memory_space.close();
  file_space.close();
}

// Note [reserved shard]: allocates the file's whole size, as HDF5's end of
// allocation says, on disk now.
void reserve_space(hid_t file, const fs::path& temp_path, const fs::path& path) {
  haddr_t bytes = 0;
  LOCKSTEP_CHECK_HDF5(H5Fget_eoa(file, &bytes));
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  const int error = fd < 0 ? errno : ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (fd >= 0) ::close(fd);
  if (error != 0)
    throw IoError(fmt::format(
        "shard {}: reserving its {} bytes on disk for {} failed: {} (free space on that disk, "
        "or write the shards elsewhere)",
        quoted(path), bytes, quoted(temp_path), std::strerror(error)));
}

}  // namespace

void check_format(const ShardFormat& format) {
  if (format.has_targets)
    throw InvalidArgument(
        "ShardWriter writes shards of labels and of tokens; write a shard of float 'targets' with "
        "h5py (docs/data-format.md shows the lines)");
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
  if (core::remove_temporary(temp_path_))
    core::log_warn("removed the leftover temporary {} (an earlier write was cut short)",
                   quoted(temp_path_));
  handles_ = std::make_unique<Handles>();
  try {
    handles_->file = create_hdf5_file(temp_path_);
    handles_->inputs = create_contiguous(handles_->file.get(), kInputsName, format.input_dtype,
                                         dims_of(rows, format.sample_shape));
    if (format.has_labels)
      handles_->labels =
          create_contiguous(handles_->file.get(), kLabelsName, format.label_dtype, {hsize_t(rows)});
  } catch (const Error& e) {
    const bool created = static_cast<bool>(handles_->file);
    handles_.reset();
    if (created) core::remove_temporary(temp_path_);
    throw IoError("cannot create shard " + quoted(temp_path_) + " (" + format.str() + ", " +
                  std::to_string(rows) + " rows): " + e.what() +
                  " (check that the directory exists and is writable)");
  }
  try {
    reserve_space(handles_->file.get(), temp_path_, path_);
  } catch (const Error&) {
    handles_.reset();
    core::remove_temporary(temp_path_);
    throw;
  }
}

ShardWriter::~ShardWriter() {
  if (!handles_) return;
  handles_.reset();
  core::remove_temporary(temp_path_);
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
  try {
    Hdf5Lock lock;
    handles_->inputs.close();
    handles_->labels.close();
    handles_->file.close();
  } catch (const LibraryError& e) {
    throw IoError("closing shard " + quoted(temp_path_) + ": " + e.what() +
                  " (check the disk and its free space)");
  }
  core::fsync_path(temp_path_, false);
  core::commit_rename(temp_path_, path_);
  handles_.reset();
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
