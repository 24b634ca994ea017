// Grid-stride index helpers in a chosen index type, for kernels that use
// 32-bit index math when the sizes allow (integer division and multiplication
// are several times cheaper in 32 bits than in 64).
#pragma once

#include <cstdint>

namespace lockstep::kernels::cuda::detail {

// Sizes below this use 32-bit indices: i + grid_stride stays below 2^31 for
// any grid of at most 8192 blocks of 256 threads (detail::grid_for).
constexpr std::int64_t kMaxIndex32 = (std::int64_t{1} << 31) - (std::int64_t{1} << 22);

template <typename Index>
__device__ __forceinline__ Index first_index() {
  return static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) +
         static_cast<Index>(threadIdx.x);
}

template <typename Index>
__device__ __forceinline__ Index grid_stride() {
  return static_cast<Index>(gridDim.x) * static_cast<Index>(blockDim.x);
}

// Calls f(Index{}) with the narrowest index type that covers n elements.
template <typename F>
void with_index(std::int64_t n, F&& f) {
  if (n < kMaxIndex32)
    f(std::int32_t{});
  else
    f(std::int64_t{});
}

}  // namespace lockstep::kernels::cuda::detail
