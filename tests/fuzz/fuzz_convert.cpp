// libFuzzer harness: lockstep-shard's IDX and text readers (tests/fuzz/fuzz_targets.h).
#include <cstdio>

#include "tests/fuzz/fuzz_targets.h"

// The converters print their progress and what they wrote: not libFuzzer's output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (std::freopen("/dev/null", "w", stdout) == nullptr) std::perror("fuzz_convert: stdout");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return lockstep::fuzz::convert_input(data, size);
}
