// EncodedShardWriter (io/encoded_shard_writer.h): one contiguous HDF5 shard of
// encoded images, written under a temporary name, fsynced, then renamed.
#include "io/encoded_shard_writer.h"

#include <fmt/core.h>

#include "engine/core/log.h"
#include "engine/core/output_file.h"
#include "io/hdf5.h"
#include "io/shard_format.h"
#include "kernels/checked_math.h"

namespace lockstep::io {
namespace {

namespace fs = std::filesystem;

// A 1-D contiguous dataset of `count` elements, allocated now and never
// pre-filled (the writer overwrites every byte), as ShardWriter's are.
Hdf5Id create_vector(hid_t file, const char* name, DType type, std::int64_t count) {
  const hsize_t dims = static_cast<hsize_t>(count);
  const Hdf5Id space(LOCKSTEP_CHECK_HDF5(H5Screate_simple(1, &dims, nullptr)));
  const Hdf5Id dcpl(LOCKSTEP_CHECK_HDF5(H5Pcreate(H5P_DATASET_CREATE)));
  LOCKSTEP_CHECK_HDF5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  LOCKSTEP_CHECK_HDF5(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  LOCKSTEP_CHECK_HDF5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  const Hdf5Id file_type = io::file_type(type);
  return Hdf5Id(LOCKSTEP_CHECK_HDF5(
      H5Dcreate2(file, name, file_type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)));
}

// Writes `count` elements of `type` at element `first` of a 1-D dataset.
void write_range(hid_t dataset, DType type, std::int64_t first, std::int64_t count,
                 const void* data) {
  const hsize_t start = static_cast<hsize_t>(first), size = static_cast<hsize_t>(count);
  const Hdf5Id file_space(LOCKSTEP_CHECK_HDF5(H5Dget_space(dataset)));
  LOCKSTEP_CHECK_HDF5(
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &size, nullptr));
  const Hdf5Id memory_space(LOCKSTEP_CHECK_HDF5(H5Screate_simple(1, &size, nullptr)));
  const Hdf5Id memory = memory_type(type);
  LOCKSTEP_CHECK_HDF5(
      H5Dwrite(dataset, memory.get(), memory_space.get(), file_space.get(), H5P_DEFAULT, data));
}

}  // namespace

struct EncodedShardWriter::Handles {
  Hdf5Id file, inputs, offsets, labels;
};

EncodedShardWriter::EncodedShardWriter(fs::path path, std::span<const std::int64_t> image_bytes)
    : path_(std::move(path)) {
  offsets_.reserve(image_bytes.size() + 1);
  offsets_.push_back(0);
  for (std::size_t i = 0; i < image_bytes.size(); ++i) {
    if (image_bytes[i] < 1)
      throw InvalidArgument(
          fmt::format("encoded shard '{}': image {} has {} bytes (an image "
                      "holds at least one)",
                      path_.string(), i, image_bytes[i]));
    offsets_.push_back(checked_add(offsets_.back(), image_bytes[i], "encoded shard bytes"));
  }
  temp_path_ = path_;
  temp_path_ += ".tmp";
  Hdf5Lock lock;
  if (core::remove_temporary(temp_path_))
    core::log_warn("removed the leftover temporary '{}' (an earlier write was cut short)",
                   temp_path_.string());
  handles_ = std::make_unique<Handles>();
  try {
    handles_->file = create_hdf5_file(temp_path_);
    const hid_t file = handles_->file.get();
    handles_->inputs = create_vector(file, kInputsName, DType::u8, offsets_.back());
    handles_->offsets = create_vector(file, kOffsetsName, DType::i64, rows() + 1);
    handles_->labels = create_vector(file, kLabelsName, DType::i64, rows());
    write_range(handles_->offsets.get(), DType::i64, 0, rows() + 1, offsets_.data());
  } catch (const Error& e) {
    const bool created = static_cast<bool>(handles_->file);
    handles_.reset();
    if (created) core::remove_temporary(temp_path_);
    throw IoError(
        fmt::format("cannot create shard '{}' ({} encoded images, {} bytes): {} (check "
                    "that the directory exists and is writable)",
                    temp_path_.string(), rows(), offsets_.back(), e.what()));
  }
}

EncodedShardWriter::~EncodedShardWriter() {
  if (!handles_) return;
  handles_.reset();
  core::remove_temporary(temp_path_);
}

void EncodedShardWriter::append(std::span<const std::uint8_t> image, std::int64_t label) {
  if (!handles_ || written() == rows())
    throw InvalidArgument(
        fmt::format("encoded shard '{}': appending image {} of {} (append "
                    "exactly the images the writer was made for, before close())",
                    path_.string(), written(), rows()));
  const std::int64_t row = written();
  const std::int64_t size = offsets_[row + 1] - offsets_[row];
  if (static_cast<std::int64_t>(image.size()) != size)
    throw InvalidArgument(
        fmt::format("encoded shard '{}': image {} has {} bytes, but the writer "
                    "was told {} (the file changed while it was packed?)",
                    path_.string(), row, image.size(), size));
  Hdf5Lock lock;
  try {
    write_range(handles_->inputs.get(), DType::u8, offsets_[row], size, image.data());
  } catch (const LibraryError& e) {
    throw IoError(
        fmt::format("writing image {} of shard '{}': {} (check the disk and its free "
                    "space)",
                    row, temp_path_.string(), e.what()));
  }
  labels_.push_back(label);
}

void EncodedShardWriter::close() {
  if (!handles_)
    throw InvalidArgument("encoded shard '" + path_.string() +
                          "' is already closed (close it only once)");
  if (written() != rows())
    throw InvalidArgument(
        fmt::format("encoded shard '{}': closed after {} of its {} images "
                    "(append the rest before close())",
                    path_.string(), written(), rows()));
  try {
    Hdf5Lock lock;
    if (rows() > 0) write_range(handles_->labels.get(), DType::i64, 0, rows(), labels_.data());
    handles_->inputs.close();
    handles_->offsets.close();
    handles_->labels.close();
    handles_->file.close();
  } catch (const LibraryError& e) {
    throw IoError("closing shard '" + temp_path_.string() + "': " + e.what() +
                  " (check the disk and its free space)");
  }
  core::fsync_path(temp_path_, false);
  core::commit_rename(temp_path_, path_);
  handles_.reset();
}

}  // namespace lockstep::io
