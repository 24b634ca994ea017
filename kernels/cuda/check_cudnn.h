// Check macro for cuDNN calls, apart from kernels/cuda/check.h so that only
// the files that use cuDNN pay for its headers.
#pragma once

#include <cudnn.h>

#include <string>

#include "kernels/error.h"

#define LOCKSTEP_CHECK_CUDNN(call) \
  ::lockstep::detail::check_cudnn((call), #call, __FILE__, __LINE__)

namespace lockstep::detail {

inline void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  // cuDNN 9 keeps a more specific message for the last failure on this thread.
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string message = cudnnGetErrorString(status);
  if (detail[0] != '\0') message += std::string(": ") + detail;
  throw_library_error("cuDNN", status, message, call, file, line);
}

}  // namespace lockstep::detail
