// CUDA dropout mask application (kernels/dropout.h).
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/dropout.h"

namespace lockstep::kernels::cuda {
namespace {

template <typename T>
__global__ void apply_mask_kernel(const T* x, const std::uint8_t* mask, T* y, std::int64_t n,
                                  float scale) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = detail::from_f32<T>(mask[i] ? detail::to_f32(x[i]) * scale : 0.0f);
}

}  // namespace

void apply_mask(const void* x, const std::uint8_t* mask, void* y, DType type, std::int64_t n,
                float scale, CudaStream stream) {
  detail::dispatch_float(type, "apply_mask", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return;
    apply_mask_kernel<T><<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
        static_cast<const T*>(x), mask, static_cast<T*>(y), n, scale);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace lockstep::kernels::cuda
