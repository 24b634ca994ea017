// libFuzzer harness: the shard reader (tests/fuzz/fuzz_targets.h).
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return lockstep::fuzz::shard_input(data, size);
}
