// Test fixtures for the io tests: a temporary directory (tests/temp_dir.h),
// a file's bytes, the expected value of every sample (a formula, independent
// of the reader), and shards written straight through the HDF5 C API in the
// layouts h5py produces (contiguous; chunked with gzip; big-endian; with a
// user block; libver latest), so the reader is tested against files
// lockstep's writer did not make.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/dtype.h"
#include "kernels/half.h"
#include "tests/temp_dir.h"

namespace lockstep::test {

namespace fs = std::filesystem;

// The whole of `path`, byte for byte ("" when it cannot be read).
inline std::string file_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Element j of global sample i, chosen so every dtype holds it exactly.
inline double sample_value(std::int64_t i, std::int64_t j, DType type) {
  switch (type) {
    case DType::u8:
      return static_cast<double>((i * 31 + j * 7 + 3) % 251);
    case DType::f16:
      return static_cast<double>(i % 512) + 0.25 * static_cast<double>(j % 4);
    default:
      return static_cast<double>(i) + static_cast<double>(j) / 1024.0;
  }
}
inline std::int64_t sample_label(std::int64_t i) { return (i * 7) % 10; }

// Storage bytes of samples [first, first + count), in `type`.
inline std::vector<std::uint8_t> sample_bytes(std::int64_t first, std::int64_t count,
                                              std::int64_t values_per_sample, DType type) {
  std::vector<std::uint8_t> out(count * values_per_sample * dtype_size(type));
  for (std::int64_t i = 0; i < count; ++i)
    for (std::int64_t j = 0; j < values_per_sample; ++j) {
      const double v = sample_value(first + i, j, type);
      std::uint8_t* dst = out.data() + (i * values_per_sample + j) * dtype_size(type);
      if (type == DType::u8) {
        *dst = static_cast<std::uint8_t>(v);
      } else if (type == DType::f16) {
        const std::uint16_t h = kernels::f32_to_f16_bits(static_cast<float>(v));
        std::memcpy(dst, &h, 2);
      } else {
        const float f = static_cast<float>(v);
        std::memcpy(dst, &f, 4);
      }
    }
  return out;
}

// How a fixture file is laid out, each as h5py would write it.
struct Layout {
  bool chunked = false;  // chunks of `chunk_rows` rows, gzip level 4 (h5py's default)
  hsize_t chunk_rows = 16;
  bool gzip = true;         // false: chunked without filters (h5py's chunks=True alone)
  bool shuffle = false;     // h5py's shuffle=True
  bool big_endian = false;  // dtype '>f4', '>i8' ...
  hsize_t userblock = 0;    // h5py's userblock_size
  bool libver_latest = false;
};

// h5py's float16 type (h5t.pyx), optionally big-endian.
inline hid_t half_type(bool big_endian) {
  const hid_t t = H5Tcopy(big_endian ? H5T_IEEE_F32BE : H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

inline hid_t storage_type(DType type, bool big_endian) {
  switch (type) {
    case DType::u8:
      return H5Tcopy(H5T_STD_U8LE);
    case DType::f16:
      return half_type(big_endian);
    case DType::f32:
      return H5Tcopy(big_endian ? H5T_IEEE_F32BE : H5T_IEEE_F32LE);
    case DType::i32:
      return H5Tcopy(big_endian ? H5T_STD_I32BE : H5T_STD_I32LE);
    default:
      return H5Tcopy(big_endian ? H5T_STD_I64BE : H5T_STD_I64LE);
  }
}

// Writes `name` [rows, ...sample_shape] from little-endian `data` of `type`.
inline void write_dataset(hid_t file, const char* name, DType type, const core::Shape& shape,
                          const void* data, const Layout& layout) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (layout.chunked && dims[0] > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::min(layout.chunk_rows, dims[0]);
    H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
    if (layout.shuffle) H5Pset_shuffle(dcpl);
    if (layout.gzip) H5Pset_deflate(dcpl, 4);
  }
  const hid_t file_type = storage_type(type, layout.big_endian);
  const hid_t memory_type = storage_type(type, false);
  const hid_t set = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (set < 0) throw std::runtime_error(std::string("fixture: cannot create ") + name);
  if (dims[0] > 0 && H5Dwrite(set, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    throw std::runtime_error(std::string("fixture: cannot write ") + name);
  H5Dclose(set);
  H5Tclose(memory_type);
  H5Tclose(file_type);
  H5Pclose(dcpl);
  H5Sclose(space);
}

inline hid_t create_file(const fs::path& path, const Layout& layout) {
  const hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (layout.userblock) H5Pset_userblock(fcpl, layout.userblock);
  if (layout.libver_latest) H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, fapl);
  H5Pclose(fapl);
  H5Pclose(fcpl);
  if (file < 0) throw std::runtime_error("fixture: cannot create " + path.string());
  return file;
}

// A shard of samples [first, first + rows) with the expected values.
inline void write_shard(const fs::path& path, std::int64_t first, std::int64_t rows,
                        const core::Shape& sample_shape, DType input_type,
                        DType label_type = DType::i64, const Layout& layout = {}) {
  const std::int64_t values = core::shape_numel(sample_shape);
  const auto inputs = sample_bytes(first, rows, values, input_type);
  std::vector<std::int64_t> labels64(rows);
  std::vector<std::int32_t> labels32(rows);
  for (std::int64_t i = 0; i < rows; ++i)
    labels32[i] = static_cast<std::int32_t>(labels64[i] = sample_label(first + i));
  core::Shape shape{rows};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  const hid_t file = create_file(path, layout);
  write_dataset(file, "inputs", input_type, shape, inputs.data(), layout);
  write_dataset(file, "labels", label_type, {rows},
                label_type == DType::i32 ? static_cast<const void*>(labels32.data())
                                         : static_cast<const void*>(labels64.data()),
                layout);
  H5Fclose(file);
}

}  // namespace lockstep::test
