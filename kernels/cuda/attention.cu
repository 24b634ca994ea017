// CUDA attention pieces (kernels/attention.h): head moves one thread per
// element, and the causal softmax one warp per row (llm.c's non-cuDNN path):
// max and sum are warp-shuffle trees in a fixed order, so results are
// deterministic; columns past the diagonal are written as zeros.
#include <cfloat>

#include "kernels/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"

namespace lockstep::kernels::cuda {
namespace {

using detail::kThreads;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;

// Element e of the heads layout [P, B, H, T, D] and its place in [B, T, P, H, D].
__device__ std::int64_t row_index(const AttentionShape& s, std::int64_t e) {
  const std::int64_t d = e % s.head_dim;
  std::int64_t rest = e / s.head_dim;
  const std::int64_t t = rest % s.seq;
  rest /= s.seq;
  const std::int64_t h = rest % s.heads;
  rest /= s.heads;
  const std::int64_t b = rest % s.batch;
  const std::int64_t p = rest / s.batch;
  return ((b * s.seq + t) * s.parts + p) * s.heads * s.head_dim + h * s.head_dim + d;
}

template <typename T>
__global__ void split_kernel(AttentionShape s, std::int64_t n, const T* rows, T* heads) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    heads[e] = rows[row_index(s, e)];
}

template <typename T>
__global__ void merge_kernel(AttentionShape s, std::int64_t n, const T* heads, T* rows) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    rows[row_index(s, e)] = heads[e];
}

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
    split_kernel<T><<<detail::grid_for(n), kThreads, 0, stream>>>(s, n, static_cast<const T*>(rows),
                                                                  static_cast<T*>(heads));
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void merge_heads(const AttentionShape& s, const void* heads, void* rows, CudaStream stream) {
  validate_attention(s);
  const std::int64_t n = elements(s);
  detail::dispatch_float(s.type, "merge_heads", [&](auto t) {
    using T = decltype(t);
    merge_kernel<T><<<detail::grid_for(n), kThreads, 0, stream>>>(
        s, n, static_cast<const T*>(heads), static_cast<T*>(rows));
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
