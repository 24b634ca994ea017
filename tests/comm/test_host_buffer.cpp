// Huge-page host buffers: the advice covers the whole 2 MiB pages inside a
// buffer, checked in the kernel's own record of the mapping (the "hg" flag of
// /proc/self/smaps), not by the return value alone.
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "comm/host_buffer.h"

using namespace lockstep;

namespace {

// The VmFlags of the mapping that holds `address`, from /proc/self/smaps.
std::string vm_flags(const void* address) {
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-' &&
        line.find(':') > line.find(' '))  // a mapping's header line
      inside = begin <= a && a < end;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}

}  // namespace

TEST_CASE("host buffers ask for huge pages on their whole 2 MiB pages", "[comm][memory]") {
  const core::Tensor big = comm::empty_host_buffer({std::int64_t{4} << 20}, DType::f32);  // 16 MiB
  const auto data = reinterpret_cast<std::uintptr_t>(big.data());
  const auto first_page =
      (data + comm::kHugePageBytes - 1) / comm::kHugePageBytes * comm::kHugePageBytes;
  CHECK_THAT(vm_flags(reinterpret_cast<const void*>(first_page)), Catch::Contains(" hg"));
  CHECK(comm::advise_huge_pages(big.data(), big.nbytes()));

  // No whole huge page inside a 1 MiB buffer: nothing to ask for.
  const core::Tensor small = comm::empty_host_buffer({std::int64_t{256} << 10}, DType::f32);
  CHECK_FALSE(comm::advise_huge_pages(small.data(), small.nbytes()));
  CHECK(small.numel() == 256 << 10);
}
