// CUDA embedding lookup and gradient (kernels/embedding.h).
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/embedding.h"

namespace lockstep::kernels::cuda {
namespace {

__device__ std::int64_t index_at(const EmbeddingShape& s, const void* indices, std::int64_t n) {
  return s.index_type == DType::i32 ? static_cast<const std::int32_t*>(indices)[n]
                                    : static_cast<const std::int64_t*>(indices)[n];
}

__global__ void forward_kernel(EmbeddingShape s, const float* weight, const void* indices,
                               float* out) {
  const std::int64_t total = s.count * s.dim;
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t index = index_at(s, indices, k / s.dim);
    out[k] = (index >= 0 && index < s.vocab) ? weight[index * s.dim + k % s.dim] : 0.0f;
  }
}

__global__ void backward_kernel(EmbeddingShape s, const float* dout, const void* indices,
                                float* dweight) {
  for (std::int64_t d = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; d < s.dim;
       d += std::int64_t{gridDim.x} * blockDim.x) {
    for (std::int64_t n = 0; n < s.count; ++n) {
      const std::int64_t index = index_at(s, indices, n);
      if (index >= 0 && index < s.vocab) dweight[index * s.dim + d] += dout[n * s.dim + d];
    }
  }
}

}  // namespace

void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out, CudaStream stream) {
  if (s.count * s.dim == 0) return;
  forward_kernel<<<detail::grid_for(s.count * s.dim), detail::kThreads, 0, stream>>>(s, weight,
                                                                                     indices, out);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void embedding_backward(const EmbeddingShape& s, const float* dout, const void* indices,
                        float* dweight, CudaStream stream) {
  if (s.dim == 0) return;
  backward_kernel<<<detail::grid_for(s.dim), detail::kThreads, 0, stream>>>(s, dout, indices,
                                                                            dweight);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
