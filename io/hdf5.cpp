// The HDF5 lock, the error-stack walk behind LOCKSTEP_CHECK_HDF5, the owning
// identifier and the DType <-> HDF5 type mapping (io/hdf5.h).
#include "io/hdf5.h"

#include <unistd.h>

#include <bit>
#include <string>

#include "engine/core/output_file.h"

namespace lockstep::io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "lockstep's files are little-endian; a big-endian host needs byte swapping");

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

std::string error_text(hid_t id) {
  char text[256] = {};
  H5E_type_t type;
  if (H5Eget_msg(id, &type, text, sizeof text) < 0) return "?";
  return text;
}

// An H5Ewalk2 callback: no exception may cross it, so a failure to build the
// text (out of memory) ends the walk with what was gathered.
herr_t append_frame(unsigned n, const H5E_error2_t* frame, void* out) noexcept {
  try {
    auto& text = *static_cast<std::string*>(out);
    if (n > 0) text += "; ";
    text += std::string(frame->func_name ? frame->func_name : "?") + ": " +
            (frame->desc && *frame->desc ? frame->desc : "error") + " (" +
            error_text(frame->maj_num) + " / " + error_text(frame->min_num) + ")";
    return 0;
  } catch (...) {
    return -1;
  }
}

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

Hdf5Lock::Hdf5Lock() : lock_(hdf5_mutex()) {
  static thread_local const bool quiet = H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0;
  (void)quiet;
}

std::string hdf5_error_stack() {
  Hdf5Lock lock;
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, append_frame, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "no HDF5 error stack" : text;
}

void throw_hdf5_error(long code, const char* call, const char* file, int line) {
  lockstep::detail::throw_library_error("HDF5", code, hdf5_error_stack(), call, file, line);
}

Hdf5Id& Hdf5Id::operator=(Hdf5Id&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.release();
  }
  return *this;
}

void Hdf5Id::close() {
  if (id_ < 0) return;
  Hdf5Lock lock;
  LOCKSTEP_CHECK_HDF5(H5Idec_ref(release()));
}

void Hdf5Id::reset() noexcept {
  if (id_ < 0) return;
  Hdf5Lock lock;
  // Only failing paths get here with an open identifier (success paths
  // close()); their own error is the one to report, so this result is not.
  H5Idec_ref(release());
}

Hdf5Id create_hdf5_file(const std::filesystem::path& file) {
  // Note [exclusive creation]: H5F_ACC_EXCL alone would first open an
  // existing name (through a symlink) to see whether it is HDF5, and would
  // leave a half-made file behind when its first write fails. So the name is
  // taken with O_EXCL | O_NOFOLLOW here; only then does HDF5 truncate and
  // fill that file, and on failure the file is ours to remove.
  ::close(core::create_exclusive(file));
  Hdf5Lock lock;
  const hid_t id = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) {
    const std::string stack = hdf5_error_stack();
    core::remove_temporary(file);
    throw IoError("cannot create HDF5 file '" + file.string() + "': " + stack +
                  " (check the disk and its free space)");
  }
  return Hdf5Id(id);
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
  throw InvalidArgument(std::string("lockstep's HDF5 files do not store ") + dtype_name(type) +
                        " (they store u8, i32, i64, f16 and f32)");
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
      if (spos == 31 && epos == 23 && esize == 8 && mpos == 0 && msize == 23 &&
          H5Tget_ebias(type) == 127)
        return DType::f32;
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

}  // namespace lockstep::io
