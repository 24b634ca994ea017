// Host memory for communication buffers, backed by transparent huge pages.
// OpenMPI's shared-memory transport copies large messages markedly faster out
// of 2 MiB pages than out of 4 KiB ones (here, a 16 MiB allreduce: about
// 7.7 GB/s instead of 4.6), and Linux gives them only to memory that asks
// (THP mode "madvise"). The gradient synchroniser's host scratch comes from
// here; a trainer on the CPU should allocate its flat gradient buffer here too.
#pragma once

#include <cstddef>

#include "engine/core/tensor.h"

namespace lockstep::comm {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// Asks for huge pages (madvise MADV_HUGEPAGE) on the 2 MiB-aligned pages
// inside [data, data + bytes). Pages touched before the call keep their
// size until the kernel's khugepaged merges them, so call it on fresh memory.
// Returns false (and changes nothing) where the kernel refuses.
bool advise_huge_pages(void* data, std::size_t bytes);

// An uninitialised CPU tensor whose storage asks for huge pages before its
// first touch. Below 2 MiB it is an ordinary tensor.
core::Tensor empty_host_buffer(const core::Shape& shape, DType dtype);

}  // namespace lockstep::comm
