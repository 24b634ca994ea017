// CPU attention pieces (kernels/attention.h): head moves as plain copies of
// D-element runs, and the causal softmax in f32 with f64 row sums, the
// reference the CUDA kernels are tested against. Its rows are
// kernels/detail/vector_softmax.h's, vectorised (this file is built with
// -fno-trapping-math, kernels/CMakeLists.txt); libm's scalar expf took most of
// the softmax's time at gpt2's T = 1024.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/detail/vector_softmax.h"

namespace lockstep::kernels::cpu {
namespace {

// Calls f(row_offset, head_offset) for every run of D elements, in elements.
template <typename F>
void for_each_run(const AttentionShape& s, F&& f) {
  const std::int64_t width = s.heads * s.head_dim;
  for (std::int64_t p = 0; p < s.parts; ++p)
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        for (std::int64_t t = 0; t < s.seq; ++t) {
          const std::int64_t row = ((b * s.seq + t) * s.parts + p) * width + h * s.head_dim;
          const std::int64_t head = (((p * s.batch + b) * s.heads + h) * s.seq + t) * s.head_dim;
          f(row, head);
        }
}

}  // namespace

void split_heads(const AttentionShape& s, const void* rows, void* heads) {
  validate_attention(s);
  const std::size_t size = dtype_size(s.type), run = s.head_dim * size;
  for_each_run(s, [&](std::int64_t row, std::int64_t head) {
    std::memcpy(static_cast<char*>(heads) + head * size,
                static_cast<const char*>(rows) + row * size, run);
  });
}

void merge_heads(const AttentionShape& s, const void* heads, void* rows) {
  validate_attention(s);
  const std::size_t size = dtype_size(s.type), run = s.head_dim * size;
  for_each_run(s, [&](std::int64_t row, std::int64_t head) {
    std::memcpy(static_cast<char*>(rows) + row * size,
                static_cast<const char*>(heads) + head * size, run);
  });
}

// AVX-512 and AVX2 clones besides the baseline one, as the activations have
// (Note [AVX-512 clones] in cpu/activation.cpp): the same bits, 16 or 8
// exponentials at a time.
namespace {

[[gnu::target_clones("avx512f", "avx2", "default")]] void causal_softmax_forward_clones(
    std::int64_t matrices, std::int64_t seq, float scale, const float* scores, float* probs) {
  for (std::int64_t r = 0; r < matrices * seq; ++r) {
    const std::int64_t i = r % seq;  // this row attends to columns 0..i
    const float* in = scores + r * seq;
    float* out = probs + r * seq;
    detail::softmax_row(in, scale, i + 1, out);
    std::fill(out + i + 1, out + seq, 0.0f);
  }
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void causal_softmax_forward(std::int64_t matrices, std::int64_t seq, float scale,
                            const float* scores, float* probs) {
  causal_softmax_forward_clones(matrices, seq, scale, scores, probs);
}

namespace {

[[gnu::target_clones("avx512f", "avx2", "default")]] void causal_softmax_backward_clones(
    std::int64_t matrices, std::int64_t seq, float scale, const float* probs, const float* dprobs,
    float* dscores) {
  for (std::int64_t r = 0; r < matrices * seq; ++r) {
    const std::int64_t i = r % seq;
    const float *p = probs + r * seq, *dp = dprobs + r * seq;
    float* out = dscores + r * seq;
    const auto d = static_cast<float>(
        detail::lane_sum(i + 1, [&](std::int64_t j) { return static_cast<double>(p[j]) * dp[j]; }));
    for (std::int64_t j = 0; j <= i; ++j) out[j] = scale * p[j] * (dp[j] - d);
    std::fill(out + i + 1, out + seq, 0.0f);
  }
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void causal_softmax_backward(std::int64_t matrices, std::int64_t seq, float scale,
                             const float* probs, const float* dprobs, float* dscores) {
  causal_softmax_backward_clones(matrices, seq, scale, probs, dprobs, dscores);
}

}  // namespace lockstep::kernels::cpu
