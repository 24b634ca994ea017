// Huge-page host buffers (comm/host_buffer.h).
#include "comm/host_buffer.h"

#include <sys/mman.h>

#include <cstdint>

#include "engine/core/log.h"

namespace lockstep::comm {

bool advise_huge_pages(void* data, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (begin + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const std::uintptr_t last = (begin + bytes) / kHugePageBytes * kHugePageBytes;
  if (last <= first) return false;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) != 0) {
    core::log_debug("madvise(MADV_HUGEPAGE) refused for {} bytes: ordinary pages", last - first);
    return false;
  }
  return true;
}

core::Tensor empty_host_buffer(const core::Shape& shape, DType dtype) {
  // glibc serves large allocations (above its mmap threshold, 128 KiB to
  // 32 MiB) with fresh mmap'd pages, untouched until the caller writes them,
  // so the advice takes effect at the first page fault.
  core::Tensor t = core::Tensor::empty(shape, dtype, core::Device::cpu());
  advise_huge_pages(t.data(), t.nbytes());
  return t;
}

}  // namespace lockstep::comm
