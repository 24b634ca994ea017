// LOCKSTEP_CHECK_NCCL: checks an NCCL call and throws lockstep::LibraryError
// naming the call, file:line, NCCL's error string and its last-error text
// (which says what went wrong, e.g. which peer or transport). CUDA builds only.
#pragma once

#include <nccl.h>

#include <string>

#include "kernels/error.h"

#define LOCKSTEP_CHECK_NCCL(call) \
  ::lockstep::comm::detail::check_nccl((call), #call, __FILE__, __LINE__)

namespace lockstep::comm::detail {

// NCCL documents ncclGetLastError's communicator argument as unused (NULL is
// allowed); the text describes the most recent failure in the process.
inline std::string nccl_error_text(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) text += std::string(": ") + last;
  return text;
}

inline void check_nccl(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  ::lockstep::detail::throw_library_error("NCCL", result, nccl_error_text(result), call, file,
                                          line);
}

}  // namespace lockstep::comm::detail
