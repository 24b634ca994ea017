// Handing the memory that CUDA's default stream-ordered pool caches back to
// the device, for the callers that need it free outside the pool: our own
// allocator when cudaMallocAsync runs out (engine/core/memory.cpp).
#pragma once

#include "kernels/cuda/check.h"

namespace lockstep::kernels::cuda::detail {

// `device` must be the calling thread's current device. Waits for all its
// work first, so that stream-ordered frees still queued have happened and
// their blocks can be released too (as PyTorch's allocator frees its cached
// blocks before retrying a failed allocation).
inline void release_pool_memory(int device) {
  LOCKSTEP_CHECK_CUDA(cudaDeviceSynchronize());
  cudaMemPool_t pool = nullptr;
  LOCKSTEP_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
  LOCKSTEP_CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
}

}  // namespace lockstep::kernels::cuda::detail
