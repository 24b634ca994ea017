// LOCKSTEP_CHECK_MPI: checks an MPI call and throws lockstep::LibraryError
// naming the call, file:line and MPI's own error text. mpi.h stays out of
// lockstep's public headers, so this lives in detail/.
#pragma once

#include <mpi.h>

#include <string>

#include "kernels/error.h"

#define LOCKSTEP_CHECK_MPI(call) \
  ::lockstep::comm::detail::check_mpi((call), #call, __FILE__, __LINE__)

namespace lockstep::comm::detail {

// MPI_Error_string may only run between MPI_Init and MPI_Finalize (OpenMPI
// aborts the process otherwise), so outside that window the code stands alone.
inline std::string mpi_error_text(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "MPI is not initialized";
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(length));
}

inline void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  ::lockstep::detail::throw_library_error("MPI", code, mpi_error_text(code), call, file, line);
}

}  // namespace lockstep::comm::detail
