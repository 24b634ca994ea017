// LOCKSTEP_CHECK_MPI outside MPI's lifetime: the unit tests never start MPI,
// and the macro must still throw a LibraryError naming the call and place
// (MPI_Error_string itself would abort the process there). The message with
// MPI's own error text is tested under mpiexec (tests/mpi).
#include <catch2/catch.hpp>

#include "comm/detail/check_mpi.h"

TEST_CASE("an MPI error before MPI_Init names the call, the place and the state",
          "[comm][errors]") {
  try {
    LOCKSTEP_CHECK_MPI(MPI_ERR_COUNT);
    FAIL("no exception");
  } catch (const lockstep::LibraryError& e) {
    CHECK(e.library() == "MPI");
    CHECK(e.code() == MPI_ERR_COUNT);
    CHECK_THAT(e.what(), Catch::Contains("MPI_ERR_COUNT") &&
                             Catch::Contains("MPI is not initialized") &&
                             Catch::Contains("test_check_mpi.cpp"));
  }
  CHECK_NOTHROW(LOCKSTEP_CHECK_MPI(MPI_SUCCESS));
}
