// The HDF5 helpers io's shards and engine's checkpoints share, in one place:
// LOCKSTEP_CHECK_HDF5 and the lock every HDF5 call is made under, an owning
// identifier whose close is checked, the DType <-> HDF5 type mapping (with
// h5py's IEEE half), and checked reads of files lockstep did not write
// (Note [hostile files]). HDF5 stays a private dependency of lockstep: only
// code that calls HDF5 includes this header.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/dtype.h"
#include "kernels/error.h"

// Evaluates `call` and returns its value; throws LibraryError naming the call,
// file:line and HDF5's error stack when it is negative (HDF5's failure value
// for herr_t, hid_t, htri_t, ssize_t and its enums). Calls that return
// unsigned values (haddr_t, hsize_t) are checked by hand.
#define LOCKSTEP_CHECK_HDF5(call) \
  ::lockstep::io::check_hdf5_result((call), #call, __FILE__, __LINE__)

namespace lockstep::io {

// Note [HDF5 lock]: Debian's libhdf5 is the thread-safe build, which
// serialises every API call on one global mutex. lockstep adds its own lock
// around each sequence of calls (open and inspect a shard, select and read
// rows, write a shard or a checkpoint) so that a sequence is never
// interleaved with another thread's and the per-thread error stack read by
// the check macro belongs to that sequence; it also keeps lockstep correct on
// a non-thread-safe HDF5. Hot reads of contiguous shards take neither lock:
// they pread the file (Note [contiguous reads] in io/detail/shard_file.h).
//
// Constructing an Hdf5Lock also turns off HDF5's automatic printing of error
// stacks for this thread (the stack is per thread): errors are reported once,
// in the exception. The mutex is recursive, so helpers may lock again.
class Hdf5Lock {
 public:
  Hdf5Lock();

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

// This thread's HDF5 error stack, outermost call first, one "function: message
// (major / minor)" per frame joined by "; ", then clears it.
std::string hdf5_error_stack();

[[noreturn]] void throw_hdf5_error(long code, const char* call, const char* file, int line);

template <typename T>
T check_hdf5_result(T value, const char* call, const char* file, int line) {
  static_assert(std::is_signed_v<T> || std::is_enum_v<T>,
                "an unsigned HDF5 result (haddr_t, hsize_t, size_t) has its own failure value");
  if (value < 0) throw_hdf5_error(static_cast<long>(value), call, file, line);
  return value;
}

// Owns one HDF5 identifier (file, group, dataset, attribute, dataspace,
// datatype, property list). close() releases it and throws when HDF5 reports
// a failure (closing a file flushes it: a full disk shows there); the
// destructor releases it too, on paths that are already failing, and cannot
// report.
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
  void close();
  void reset() noexcept;

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
// for types lockstep does not read as they are (f64, i16, strings ...).
std::optional<DType> dtype_of(hid_t type);
// Whether `type` is a 16-bit unsigned integer (u16 tokens, any byte order).
bool is_u16(hid_t type);
// For messages: "f64", "i16", "string", "compound" ...
std::string describe_type(hid_t type);
// Whether `type` is stored in this machine's byte order (1-byte types are).
bool native_order(hid_t type);

// Creates the new HDF5 file `file` (Note [exclusive creation] in hdf5.cpp):
// anything already at the name, a symlink included, is an IoError and is
// never written through; on any failure nothing is left behind. Once it
// returns, the file is the caller's: it closes it with Hdf5Id::close() and
// removes it when a later step fails.
Hdf5Id create_hdf5_file(const std::filesystem::path& file);

// Note [hostile files]: a file that passes its checksum, or a shard or a
// weights file from another writer, may still hold anything: attributes with
// many elements where one is read, datasets of unexpected type, rank or a
// shape whose byte count overflows or dwarfs the file, and structures that
// make HDF5 1.10 itself misbehave. Every read from such a file goes through
// the helpers below: check_hdf5_file() before HDF5 opens it; extent_of()
// before a buffer is sized; read_tensor() and read_scalar_attribute() check
// type class, size, rank and shape first and name the object in every error.
// No HDF5 callback lets an exception through (hdf5.cpp, dataset_names()).

// A dataset may decode to at most this many bytes per byte of its file:
// above deflate's best ratio (1032:1), far below what a damaged extent claims.
inline constexpr std::uint64_t kMaxExpansion = 1100;

// Checks, without HDF5, what lockstep relies on HDF5 to find sane (the list
// is in docs/data-format.md, "Files from other writers"): an HDF5 signature
// at offset 0 or at a user-block boundary, a superblock of version 0 to 3
// with 8-byte addresses and lengths, and an end-of-file address and root
// object address inside the file. Throws IoError naming `file` (called a
// `what` in the message: "shard", "checkpoint", "weights file").
void check_hdf5_file(const std::filesystem::path& file, const std::string& what);
// check_hdf5_file(), then H5Fopen read-only; IoError naming the file on failure.
Hdf5Id open_hdf5_file(const std::filesystem::path& file, const std::string& what);

// Dimensions of a dataset's or attribute's dataspace ({} for a scalar).
// IoError naming `object` for a null dataspace or a rank above H5S_MAX_RANK.
core::Shape extent_of(hid_t dataset_or_attribute, const std::string& object);

// For a contiguous or compact dataset: that its stored bytes are exactly
// what its extent and type need and lie inside the file (HDF5 1.10 reads
// through a NULL buffer otherwise; found by the checkpoint fuzzer), and that
// it keeps no data in external files. IoError naming `object`.
void check_storage(hid_t dataset, const std::string& object);

// Names of every dataset below `group`, relative to it ("fc1.weight",
// "fc1.weight/exp_avg"), in name order; `object` names the group in errors.
std::vector<std::string> dataset_names(hid_t group, const std::string& object);
// Names of the attributes of `object_id`, in name order.
std::vector<std::string> attribute_names(hid_t object_id, const std::string& object);

// Reads dataset `dataset` into a new CPU tensor. IEEE floats of 16, 32 or 64
// bits arrive as f32 (f16 exactly, f64 rounded to nearest); signed 32- and
// 64-bit and unsigned 8-bit integers as i32, i64, u8. Any other type, a null
// dataspace, or a tensor larger than `max_bytes` is an IoError naming `object`.
core::Tensor read_tensor(hid_t dataset, const std::string& object, std::uint64_t max_bytes);

using ScalarAttribute = std::variant<std::int64_t, double, std::string>;
// Reads a one-element attribute: an integer (up to 64 bits) as i64, a float
// as double, a fixed-length string (at most 64 KiB) as text. Variable-length
// strings are refused (Note [global heap] in hdf5_read.cpp).
// Anything else (more elements, compound, array ...) is an IoError naming `object`.
ScalarAttribute read_scalar_attribute(hid_t attribute, const std::string& object);

}  // namespace lockstep::io
