// Main of the [gpu] test binary. Catch2 v2 has no SKIP, so without a usable
// GPU this binary exits with LOCKSTEP_SKIP_RETURN_CODE, which CMake registers
// as the test's SKIP_RETURN_CODE: ctest then reports it skipped, not passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "engine/core/device.h"

int main(int argc, char** argv) {
  if (!lockstep::core::cuda_available()) {
    std::printf("no usable GPU: the [gpu] tests are skipped\n");
    return LOCKSTEP_SKIP_RETURN_CODE;
  }
  return Catch::Session().run(argc, argv);
}
