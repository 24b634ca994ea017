// CUDA Philox generators (kernels/philox.h). Each thread computes one Philox
// block (four words) of the stream, so no block is computed twice; the bits
// equal the CPU generator's because both use kernels/detail/philox_block.h.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/detail/philox_block.h"
#include "kernels/philox.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::kThreads;
namespace shared = ::lockstep::kernels::detail;

enum class Transform { words, uniform, bernoulli };

// Thread t covers stream block (offset / 4) + t: words [4b, 4b + 4) clipped to
// the request [offset, offset + n).
template <Transform transform, typename Out>
__global__ void stream_kernel(PhiloxKey key, std::uint64_t offset, Out* out, std::int64_t n,
                              float keep_prob, std::int64_t blocks) {
  for (std::int64_t t = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; t < blocks;
       t += std::int64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t block = offset / 4 + static_cast<std::uint64_t>(t);
    const shared::PhiloxBlock r = shared::philox_stream_block(key.seed, key.stream, block);
    for (int lane = 0; lane < 4; ++lane) {
      const std::uint64_t word_index = block * 4 + lane;
      if (word_index < offset || word_index >= offset + static_cast<std::uint64_t>(n)) continue;
      const std::uint32_t w = r.v[lane];
      Out& dst = out[word_index - offset];
      if constexpr (transform == Transform::words)
        dst = w;
      else if constexpr (transform == Transform::uniform)
        dst = shared::word_to_uniform(w);
      else
        dst = shared::word_to_uniform(w) < keep_prob ? 1 : 0;
    }
  }
}

__global__ void normal_kernel(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n,
                              float mean, float stddev) {
  constexpr float kTwoPi = 6.283185307179586f;
  const std::int64_t pairs = (n + 1) / 2;
  for (std::int64_t p = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; p < pairs;
       p += std::int64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t w = offset + 2 * p;
    const float u1 = shared::word_to_uniform_open0(shared::philox_word(key.seed, key.stream, w));
    const float u2 = shared::word_to_uniform(shared::philox_word(key.seed, key.stream, w + 1));
    const float radius = sqrtf(-2.0f * logf(u1));
    out[2 * p] = mean + stddev * radius * cosf(kTwoPi * u2);
    if (2 * p + 1 < n) out[2 * p + 1] = mean + stddev * radius * sinf(kTwoPi * u2);
  }
}

template <Transform transform, typename Out>
void launch_stream(PhiloxKey key, std::uint64_t offset, Out* out, std::int64_t n, float keep_prob,
                   CudaStream stream) {
  if (n == 0) return;
  const auto blocks = static_cast<std::int64_t>((offset + n + 3) / 4 - offset / 4);
  stream_kernel<transform, Out>
      <<<detail::grid_for(blocks), kThreads, 0, stream>>>(key, offset, out, n, keep_prob, blocks);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace

void random_words(PhiloxKey key, std::uint64_t offset, std::uint32_t* out, std::int64_t n,
                  CudaStream stream) {
  launch_stream<Transform::words>(key, offset, out, n, 0.0f, stream);
}

void uniform(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n, CudaStream stream) {
  launch_stream<Transform::uniform>(key, offset, out, n, 0.0f, stream);
}

void bernoulli_mask(PhiloxKey key, std::uint64_t offset, std::uint8_t* out, std::int64_t n,
                    float keep_prob, CudaStream stream) {
  launch_stream<Transform::bernoulli>(key, offset, out, n, keep_prob, stream);
}

void normal(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n, float mean,
            float stddev, CudaStream stream) {
  if (n == 0) return;
  normal_kernel<<<detail::grid_for((n + 1) / 2), kThreads, 0, stream>>>(key, offset, out, n, mean,
                                                                        stddev);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
