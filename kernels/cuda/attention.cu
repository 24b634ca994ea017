// CUDA attention pieces (kernels/attention.h): head moves one thread per
// element, and the causal softmax one warp per row (llm.c's non-cuDNN path):
// max and sum are warp-shuffle trees in a fixed order, so results are
// deterministic; columns past the diagonal are written as zeros.
#include <cfloat>
#include <climits>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"

namespace lockstep::kernels::cuda {
namespace {

using detail::kThreads;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;

// Element e of the heads layout [P, B, H, T, D] and its place in [B, T, P, H, D],
// in the index type I: 32-bit where the element count allows (Note [32-bit
// head moves]), since five 64-bit divisions per element cost more than the move.
template <typename I>
__device__ I row_index(const AttentionShape& s, I e) {
  const auto head_dim = static_cast<I>(s.head_dim), seq = static_cast<I>(s.seq);
  const auto heads = static_cast<I>(s.heads), batch = static_cast<I>(s.batch);
  const auto parts = static_cast<I>(s.parts);
  const I d = e % head_dim;
  I rest = e / head_dim;
  const I t = rest % seq;
  rest /= seq;
  const I h = rest % heads;
  rest /= heads;
  const I b = rest % batch;
  const I p = rest / batch;
  return ((b * seq + t) * parts + p) * heads * head_dim + h * head_dim + d;
}

template <typename I, typename T>
__global__ void split_kernel(AttentionShape s, I n, const T* rows, T* heads) {
  for (I e = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<I>(gridDim.x) * blockDim.x)
    heads[e] = rows[row_index(s, e)];
}

template <typename I, typename T>
__global__ void merge_kernel(AttentionShape s, I n, const T* heads, T* rows) {
  for (I e = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<I>(gridDim.x) * blockDim.x)
    rows[row_index(s, e)] = heads[e];
}

// Note [32-bit head moves]: with n <= INT32_MAX elements every index and
// intermediate product in row_index is below n, and e plus the grid's stride
// (at most 8192 x 256 = 2^21) stays below 2^32, so unsigned 32-bit math is
// exact; larger tensors take the 64-bit path.
bool fits_32_bits(std::int64_t n) { return n <= std::int64_t{INT32_MAX}; }

__device__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void softmax_forward_kernel(std::int64_t rows, std::int64_t seq, float scale,
                                       const float* scores, float* probs) {
  const std::int64_t r =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const std::int64_t i = r % seq;
  const float* in = scores + r * seq;
  float* out = probs + r * seq;
  float max = -FLT_MAX;
  for (std::int64_t j = lane; j <= i; j += kWarp) max = fmaxf(max, in[j] * scale);
  max = warp_max(max);
  float sum = 0.0f;
  for (std::int64_t j = lane; j <= i; j += kWarp) sum += expf(in[j] * scale - max);
  const float inv = 1.0f / warp_sum(sum);
  for (std::int64_t j = lane; j < seq; j += kWarp)
    out[j] = j <= i ? expf(in[j] * scale - max) * inv : 0.0f;
}

__global__ void softmax_backward_kernel(std::int64_t rows, std::int64_t seq, float scale,
                                        const float* probs, const float* dprobs, float* dscores) {
  const std::int64_t r =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const std::int64_t i = r % seq;
  const float *p = probs + r * seq, *dp = dprobs + r * seq;
  float* out = dscores + r * seq;
  float dot = 0.0f;
  for (std::int64_t j = lane; j <= i; j += kWarp) dot += p[j] * dp[j];
  dot = warp_sum(dot);
  for (std::int64_t j = lane; j < seq; j += kWarp)
    out[j] = j <= i ? scale * p[j] * (dp[j] - dot) : 0.0f;
}

unsigned softmax_grid(std::int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

std::int64_t elements(const AttentionShape& s) {
  return s.parts * s.batch * s.heads * s.seq * s.head_dim;
}

}  // namespace

void split_heads(const AttentionShape& s, const void* rows, void* heads, CudaStream stream) {
  validate_attention(s);
  const std::int64_t n = elements(s);
  detail::dispatch_float(s.type, "split_heads", [&](auto t) {
    using T = decltype(t);
    const auto* in = static_cast<const T*>(rows);
    auto* out = static_cast<T*>(heads);
    if (fits_32_bits(n))
      split_kernel<std::uint32_t, T>
          <<<detail::grid_for(n), kThreads, 0, stream>>>(s, static_cast<std::uint32_t>(n), in, out);
    else
      split_kernel<std::int64_t, T><<<detail::grid_for(n), kThreads, 0, stream>>>(s, n, in, out);
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void merge_heads(const AttentionShape& s, const void* heads, void* rows, CudaStream stream) {
  validate_attention(s);
  const std::int64_t n = elements(s);
  detail::dispatch_float(s.type, "merge_heads", [&](auto t) {
    using T = decltype(t);
    const auto* in = static_cast<const T*>(heads);
    auto* out = static_cast<T*>(rows);
    if (fits_32_bits(n))
      merge_kernel<std::uint32_t, T>
          <<<detail::grid_for(n), kThreads, 0, stream>>>(s, static_cast<std::uint32_t>(n), in, out);
    else
      merge_kernel<std::int64_t, T><<<detail::grid_for(n), kThreads, 0, stream>>>(s, n, in, out);
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void causal_softmax_forward(std::int64_t matrices, std::int64_t seq, float scale,
                            const float* scores, float* probs, CudaStream stream) {
  const std::int64_t rows = matrices * seq;
  if (rows == 0) return;
  softmax_forward_kernel<<<softmax_grid(rows), kThreads, 0, stream>>>(rows, seq, scale, scores,
                                                                      probs);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void causal_softmax_backward(std::int64_t matrices, std::int64_t seq, float scale,
                             const float* probs, const float* dprobs, float* dscores,
                             CudaStream stream) {
  const std::int64_t rows = matrices * seq;
  if (rows == 0) return;
  softmax_backward_kernel<<<softmax_grid(rows), kThreads, 0, stream>>>(rows, seq, scale, probs,
                                                                       dprobs, dscores);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
