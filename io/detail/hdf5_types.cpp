// DType <-> HDF5 type mapping and the owning identifier (io/detail/hdf5_types.h).
#include "io/detail/hdf5_types.h"

#include <bit>
#include <string>

#include "io/check_hdf5.h"

namespace lockstep::io::detail {
namespace {

static_assert(std::endian::native == std::endian::little,
              "lockstep's shards are little-endian; a big-endian host needs byte swapping");

// h5py's float16 (h5t.pyx): F32LE narrowed to 16 bits with half's fields.
Hdf5Id half_type() {
  Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_IEEE_F32LE)));
  LOCKSTEP_CHECK_HDF5(H5Tset_fields(type.get(), 15, 10, 5, 0, 10));
  LOCKSTEP_CHECK_HDF5(H5Tset_size(type.get(), 2));
  LOCKSTEP_CHECK_HDF5(H5Tset_ebias(type.get(), 15));
  return type;
}

bool is_half(hid_t type) {
  std::size_t spos, epos, esize, mpos, msize;
  if (H5Tget_size(type) != 2) return false;
  LOCKSTEP_CHECK_HDF5(H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize));
  return spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 &&
         H5Tget_ebias(type) == 15;
}

}  // namespace

Hdf5Id& Hdf5Id::operator=(Hdf5Id&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.release();
  }
  return *this;
}

void Hdf5Id::reset() {
  if (id_ < 0) return;
  Hdf5Lock lock;
  // Releasing an identifier fails only when it is already invalid, which
  // would be a bug here; a destructor has no one to report it to.
  H5Idec_ref(id_);
  id_ = H5I_INVALID_HID;
}

Hdf5Id file_type(DType type) {
  Hdf5Lock lock;
  switch (type) {
    case DType::u8:
      return Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_STD_U8LE)));
    case DType::i32:
      return Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_STD_I32LE)));
    case DType::i64:
      return Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_STD_I64LE)));
    case DType::f32:
      return Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_IEEE_F32LE)));
    case DType::f16:
      return half_type();
    case DType::bf16:
      break;
  }
  throw InvalidArgument(std::string("shards do not store ") + dtype_name(type) +
                        " (inputs are u8, f16 or f32; labels i32 or i64)");
}

Hdf5Id memory_type(DType type) {
  // Every file type lockstep writes is little-endian, which is native here.
  return file_type(type);
}

std::optional<DType> dtype_of(hid_t type) {
  Hdf5Lock lock;
  const H5T_class_t type_class = LOCKSTEP_CHECK_HDF5(H5Tget_class(type));
  const std::size_t size = H5Tget_size(type);
  if (type_class == H5T_INTEGER) {
    const bool is_signed = LOCKSTEP_CHECK_HDF5(H5Tget_sign(type)) == H5T_SGN_2;
    if (size == 1 && !is_signed) return DType::u8;
    if (size == 4 && is_signed) return DType::i32;
    if (size == 8 && is_signed) return DType::i64;
  } else if (type_class == H5T_FLOAT) {
    if (size == 4 && H5Tget_precision(type) == 32) {
      std::size_t spos, epos, esize, mpos, msize;
      LOCKSTEP_CHECK_HDF5(H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize));
      if (spos == 31 && epos == 23 && esize == 8 && mpos == 0 && msize == 23) return DType::f32;
    }
    if (is_half(type)) return DType::f16;
  }
  return std::nullopt;
}

bool is_u16(hid_t type) {
  Hdf5Lock lock;
  return LOCKSTEP_CHECK_HDF5(H5Tget_class(type)) == H5T_INTEGER && H5Tget_size(type) == 2 &&
         LOCKSTEP_CHECK_HDF5(H5Tget_sign(type)) == H5T_SGN_NONE;
}

std::string describe_type(hid_t type) {
  Hdf5Lock lock;
  const std::string bits = std::to_string(8 * H5Tget_size(type));
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_2 ? "i" : "u") + bits;
    case H5T_FLOAT:
      return is_half(type)            ? "f16"
             : H5Tget_size(type) == 2 ? "a 16-bit float that is not IEEE half"
                                      : "f" + bits;
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    default:
      return "an HDF5 type of class " + std::to_string(static_cast<int>(H5Tget_class(type)));
  }
}

bool native_order(hid_t type) {
  Hdf5Lock lock;
  if (H5Tget_size(type) <= 1) return true;
  return LOCKSTEP_CHECK_HDF5(H5Tget_order(type)) == H5T_ORDER_LE;
}

}  // namespace lockstep::io::detail
