// CUDA u8 image normalisation (kernels/image.h): one thread per element of a
// grid-stride loop; __fmul_rn and __fadd_rn keep nvcc from contracting the
// two roundings into one FMA, so the result is the CPU twin's bit for bit.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/image.h"

namespace lockstep::kernels::cuda {
namespace {

__global__ void normalize_u8_kernel(const std::uint8_t* in, float* out, std::int64_t n,
                                    std::int64_t plane, ChannelAffine affine) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>((i / plane) % affine.channels);
    out[i] = __fadd_rn(__fmul_rn(static_cast<float>(in[i]), affine.scale[c]), affine.bias[c]);
  }
}

}  // namespace

void normalize_u8(const std::uint8_t* in, float* out, std::int64_t images, std::int64_t plane,
                  const ChannelAffine& affine, CudaStream stream) {
  const std::int64_t n = images * affine.channels * plane;
  if (n == 0) return;
  normalize_u8_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(in, out, n, plane,
                                                                            affine);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
