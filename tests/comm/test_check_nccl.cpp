// LOCKSTEP_CHECK_NCCL names the call, the place and NCCL's error string; the
// string functions need no GPU. CUDA builds only.
#include <catch2/catch.hpp>

#include "comm/detail/check_nccl.h"

TEST_CASE("an NCCL error names the call, the place and NCCL's error text", "[comm][errors]") {
  try {
    LOCKSTEP_CHECK_NCCL(ncclInvalidArgument);
    FAIL("no exception");
  } catch (const lockstep::LibraryError& e) {
    CHECK(e.library() == "NCCL");
    CHECK(e.code() == ncclInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("ncclInvalidArgument") &&
                             Catch::Contains(ncclGetErrorString(ncclInvalidArgument)) &&
                             Catch::Contains("test_check_nccl.cpp"));
  }
  CHECK_NOTHROW(LOCKSTEP_CHECK_NCCL(ncclSuccess));
}
