// libFuzzer harness: the image decoder and crops (tests/fuzz/fuzz_targets.h).
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return lockstep::fuzz::image_input(data, size);
}
