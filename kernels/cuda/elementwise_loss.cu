// CUDA elementwise losses (kernels/elementwise_loss.h). A fixed grid of blocks
// writes one f64 partial sum each into the workspace; one block then adds the
// partials in block order: the same bits run to run, no atomics, no host sync.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/detail/elementwise_loss_math.h"
#include "kernels/elementwise_loss.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::kThreads;

__global__ void loss_partials(ElementwiseLossShape s, const float* prediction, const float* target,
                              double* partials) {
  __shared__ double lanes[kThreads];
  double v = 0.0;
  for (std::int64_t i = blockIdx.x * std::int64_t{kThreads} + threadIdx.x; i < s.n;
       i += std::int64_t{gridDim.x} * kThreads)
    v += kernels::detail::elementwise_loss_value(s, prediction[i], target[i]);
  const double block = detail::block_sum(v, lanes);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

__global__ void loss_mean(const double* partials, unsigned blocks, std::int64_t n, float* loss) {
  __shared__ double lanes[kThreads];
  double v = 0.0;
  for (unsigned b = threadIdx.x; b < blocks; b += kThreads) v += partials[b];
  const double total = detail::block_sum(v, lanes);
  if (threadIdx.x == 0) *loss = n > 0 ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
}

__global__ void loss_backward(ElementwiseLossShape s, const float* prediction, const float* target,
                              float scale, float* dprediction) {
  for (std::int64_t i = blockIdx.x * std::int64_t{kThreads} + threadIdx.x; i < s.n;
       i += std::int64_t{gridDim.x} * kThreads)
    dprediction[i] =
        kernels::detail::elementwise_loss_derivative(s, prediction[i], target[i]) * scale;
}

// At most 1024 partials: the final block adds each of its 256 lanes' few.
unsigned partial_blocks(std::int64_t n) {
  const unsigned blocks = detail::grid_for(n);
  return blocks < 1024 ? (blocks > 0 ? blocks : 1) : 1024;
}

}  // namespace

std::size_t elementwise_loss_workspace_bytes(std::int64_t n) {
  return partial_blocks(n) * sizeof(double);
}

void elementwise_loss_forward(const ElementwiseLossShape& s, const float* prediction,
                              const float* target, float* loss, void* workspace,
                              CudaStream stream) {
  const unsigned blocks = partial_blocks(s.n);
  auto* partials = static_cast<double*>(workspace);
  loss_partials<<<blocks, kThreads, 0, stream>>>(s, prediction, target, partials);
  loss_mean<<<1, kThreads, 0, stream>>>(partials, blocks, s.n, loss);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void elementwise_loss_backward(const ElementwiseLossShape& s, const float* prediction,
                               const float* target, float dloss, float* dprediction,
                               CudaStream stream) {
  if (s.n == 0) return;
  const float scale = dloss / static_cast<float>(s.n);
  loss_backward<<<detail::grid_for(s.n), kThreads, 0, stream>>>(s, prediction, target, scale,
                                                                dprediction);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
