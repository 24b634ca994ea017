// Check macros for CUDA runtime and cuBLASLt calls: on failure they throw
// lockstep::LibraryError naming the call, file:line and the library's own
// error name and text. Included by .cu files and CUDA-only .cpp files.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/error.h"

#define LOCKSTEP_CHECK_CUDA(call) ::lockstep::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define LOCKSTEP_CHECK_CUBLAS(call) \
  ::lockstep::detail::check_cublas((call), #call, __FILE__, __LINE__)

namespace lockstep::detail {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw_library_error("CUDA", status,
                      std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status),
                      call, file, line);
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_library_error(
      "cuBLAS", status,
      std::string(cublasLtGetStatusName(status)) + ": " + cublasLtGetStatusString(status), call,
      file, line);
}

}  // namespace lockstep::detail
