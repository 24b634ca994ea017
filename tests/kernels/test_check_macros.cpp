// The CUDA, cuBLAS and cuDNN check macros name the call, the place and the
// library's own error text. The error-string functions need no GPU.
#include <catch2/catch.hpp>

#include "kernels/cuda/check.h"
#include "kernels/cuda/check_cudnn.h"

using lockstep::LibraryError;

TEST_CASE("check macros report the library, the call and the error name", "[kernels][errors]") {
  try {
    LOCKSTEP_CHECK_CUDA(cudaErrorInvalidValue);
    FAIL("no exception");
  } catch (const LibraryError& e) {
    CHECK(e.library() == "CUDA");
    CHECK_THAT(e.what(), Catch::Contains("cudaErrorInvalidValue") &&
                             Catch::Contains("test_check_macros.cpp"));
  }
  CHECK_THROWS_WITH(LOCKSTEP_CHECK_CUBLAS(CUBLAS_STATUS_INVALID_VALUE),
                    Catch::Contains("CUBLAS_STATUS_INVALID_VALUE") && Catch::Contains("cuBLAS"));
  CHECK_THROWS_WITH(LOCKSTEP_CHECK_CUDNN(CUDNN_STATUS_BAD_PARAM),
                    Catch::Contains("CUDNN_STATUS_BAD_PARAM") && Catch::Contains("cuDNN"));
  CHECK_NOTHROW(LOCKSTEP_CHECK_CUDA(cudaSuccess));
}
