// lockstep's error hierarchy. Every failure the library reports is a
// lockstep::Error; the subclass says which kind, the message says what failed,
// with the values that make it concrete, and what to do.
// It sits at the bottom of the dependency order (kernels/) because the CUDA
// kernels check their own library calls; see docs/architecture.md.
#pragma once

#include <stdexcept>
#include <string>

namespace lockstep {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad arguments from the caller: shapes, dtypes, devices, flags.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Files, datasets and checkpoints: missing, malformed or unwritable.
class IoError : public Error {
 public:
  using Error::Error;
};

// Training produced values it cannot continue from: infs or NaNs that skipping
// steps did not cure, a loss scale at its floor, non-finite weights.
class NumericalError : public Error {
 public:
  using Error::Error;
};

// A call into CUDA, cuBLAS, cuDNN, NCCL, MPI or HDF5 returned an error.
class LibraryError : public Error {
 public:
  LibraryError(std::string library, long code, const std::string& message)
      : Error(message), library_(std::move(library)), code_(code) {}
  const std::string& library() const { return library_; }
  long code() const { return code_; }

 private:
  std::string library_;
  long code_;
};

namespace detail {
// Throws LibraryError: "<library> error <code> (<library_message>) in <call> at file:line".
[[noreturn]] void throw_library_error(const char* library, long code,
                                      const std::string& library_message, const char* call,
                                      const char* file, int line);
}  // namespace detail

}  // namespace lockstep
