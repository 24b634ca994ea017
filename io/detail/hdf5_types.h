// Helpers the shard reader and writer share: an owning HDF5 identifier, and
// the mapping between lockstep's DTypes and HDF5 types (including IEEE half,
// which HDF5 1.10 has no predefined type for; h5py's definition is used).
#pragma once

#include <hdf5.h>

#include <optional>
#include <string>

#include "kernels/dtype.h"

namespace lockstep::io::detail {

// Owns one HDF5 identifier (file, dataset, dataspace, datatype, property
// list) and releases it, under the HDF5 lock, when destroyed.
class Hdf5Id {
 public:
  Hdf5Id() = default;
  explicit Hdf5Id(hid_t id) : id_(id) {}
  Hdf5Id(Hdf5Id&& other) noexcept : id_(other.release()) {}
  Hdf5Id& operator=(Hdf5Id&& other) noexcept;
  Hdf5Id(const Hdf5Id&) = delete;
  Hdf5Id& operator=(const Hdf5Id&) = delete;
  ~Hdf5Id() { reset(); }

  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// The little-endian file type lockstep writes for `type`: U8LE, I32LE,
// I64LE, F32LE, or h5py's IEEE half (sign 15, exponent 10..14, mantissa 0..9,
// bias 15). A new identifier; the caller owns it.
Hdf5Id file_type(DType type);
// The native-order memory type HDF5 converts into when it reads `type`.
Hdf5Id memory_type(DType type);

// The DType whose values `type` stores exactly (any byte order), or nothing
// for types lockstep does not read (f64, i16, strings, bfloat16 ...).
std::optional<DType> dtype_of(hid_t type);
// Whether `type` is a 16-bit unsigned integer (u16 tokens, any byte order).
bool is_u16(hid_t type);
// For messages: "f64", "i16", "string", "compound" ...
std::string describe_type(hid_t type);
// Whether `type` is stored in this machine's byte order (1-byte types are).
bool native_order(hid_t type);

}  // namespace lockstep::io::detail
