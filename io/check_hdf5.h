// LOCKSTEP_CHECK_HDF5 and the lock every HDF5 call in lockstep is made under.
// The macro throws lockstep::LibraryError naming the call, file:line and
// HDF5's own error stack (walked with H5Ewalk2), the way kernels/cuda/check.h
// does for CUDA. Included by the .cpp files that call HDF5 (io/, checkpoints).
#pragma once

#include <hdf5.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/error.h"

// Evaluates `call` and returns its value; throws when it is negative (HDF5's
// failure value for herr_t, hid_t, htri_t, ssize_t and its enums). Calls that
// return unsigned values (haddr_t, hsize_t) are checked by hand.
#define LOCKSTEP_CHECK_HDF5(call) \
  ::lockstep::io::detail::check_hdf5((call), #call, __FILE__, __LINE__)

namespace lockstep::io {

// Note [HDF5 lock]: Debian's libhdf5 is the thread-safe build, which
// serialises every API call on one global mutex. lockstep adds its own lock
// around each sequence of calls (open and inspect a shard, select and read
// rows, write a shard) so that a sequence is never interleaved with another
// thread's and the per-thread error stack read by the check macro belongs to
// that sequence; it also keeps lockstep correct on a non-thread-safe HDF5.
// Hot reads of contiguous shards take neither lock: they pread the file
// (Note [contiguous reads] in io/detail/shard_file.h).
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

namespace detail {

// This thread's HDF5 error stack, outermost call first, one "function: message
// (major / minor)" per frame joined by "; ", then clears it.
std::string hdf5_error_stack();

[[noreturn]] void throw_hdf5_error(long code, const char* call, const char* file, int line);

template <typename T>
T check_hdf5(T value, const char* call, const char* file, int line) {
  static_assert(std::is_signed_v<T> || std::is_enum_v<T>,
                "an unsigned HDF5 result (haddr_t, hsize_t, size_t) has its own failure value");
  if (value < 0) throw_hdf5_error(static_cast<long>(value), call, file, line);
  return value;
}

}  // namespace detail
}  // namespace lockstep::io
