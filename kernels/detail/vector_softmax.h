// One row's softmax in f32 with vector exponentials
// (kernels/detail/vector_exp.h) and reductions over eight lanes
// (kernels/detail/lane_sum.h), shared by the causal attention softmax and
// the cross-entropy: the same arithmetic wherever lockstep's CPU takes a
// softmax. The file that uses it must be built with -fno-trapping-math and
// -ffp-contract=off (Note [vector tanh] in kernels/cpu/activation.cpp says
// why).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/detail/lane_sum.h"
#include "kernels/detail/vector_exp.h"

namespace lockstep::kernels::detail {

struct SoftmaxRow {
  float max;   // of the scaled inputs
  double sum;  // of exp(scaled input - max), before normalising
};

[[gnu::always_inline]] inline Float8 load8(const float* p) {
  Float8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline void store8(float* p, Float8 v) { std::memcpy(p, &v, sizeof v); }

// exp(y) for y = x scale - max, as softmax_row defines it: 0 below -87, NaN
// kept; for one float or eight.
[[gnu::always_inline]] inline float shifted_exp(float x, float scale, float max) {
  const float y = x * scale - max;
  const float e = exp_in_range(y > -87.0f ? y : -87.0f);
  return y != y ? y : (y < -87.0f ? 0.0f : e);
}
[[gnu::always_inline]] inline Float8 shifted_exp(Float8 x, float scale, float max) {
  const Float8 y = x * scale - max, low = broadcast8(-87.0f);
  const Float8 e = exp_in_range(select8(y > low, y, low));
  return select8(y != y, y, select8(y < low, Float8{}, e));
}

// out[j] = softmax(in * scale)[j] for j < n (n >= 1). Arguments of exp are
// <= 0; below -87 (e^-87 is f32's smallest normal order) the term is 0, so a
// -inf input has probability 0 exactly; a NaN (from a NaN input, or +inf)
// stays NaN, for the loss scaler to see. The max is taken over eight lanes
// (each starting from in[0], so a NaN there stays NaN as in one running max),
// the sum in f64 by detail::lane_sum.
//
// Note [softmax in vectors]: the max's lanes and the exponentials are
// written in Float8 (kernels/detail/vector_exp.h), each lane doing what the
// element-by-element definition does, so the bits are that definition's
// (tests/kernels/test_row_reductions.cpp checks that the vector and scalar
// paths agree; the AVX2 and baseline clones' outputs, attention forward and
// backward at T = 1 to 257 and cross-entropy rows of 1 to 50,304 classes
// with NaN, infinities and -0, were those of the code before). Written
// per element, GCC left the max's eight lanes scalar (vmulss) and ran the
// exponentials one vector's chain of dependent operations at a time; two
// vectors per iteration give the processor two chains to overlap. Measured
// on the 2-vCPU AMD EPYC VM (family 23, model 1, AVX2, gcc 12), the best of 7
// calls in each of 3 interleaved runs: one gpt2 layer's causal softmax (12
// heads, T = 1024) 24.4-24.7 ms before, 21.8-22.2 in Float8;
// the cross-entropy's softmax over 1024 x 50,304 logits 153-155 ms, 144-147.
[[gnu::always_inline]] inline SoftmaxRow softmax_row(const float* in, float scale, std::int64_t n,
                                                     float* out) {
  static_assert(kSumLanes == 8, "the max's lanes are one Float8");
  Float8 lanes = broadcast8(in[0] * scale);
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const Float8 x = load8(in + j) * scale;
    lanes = select8(lanes < x, x, lanes);  // std::max(lane, x)
  }
  float max = lanes[0];
  for (std::int64_t k = 1; k < 8; ++k) max = std::max(max, lanes[k]);
  for (; j < n; ++j) max = std::max(max, in[j] * scale);

  for (j = 0; j + 16 <= n; j += 16) {
    const Float8 a = shifted_exp(load8(in + j), scale, max);
    const Float8 b = shifted_exp(load8(in + j + 8), scale, max);
    store8(out + j, a);
    store8(out + j + 8, b);
  }
  if (j + 8 <= n) {
    store8(out + j, shifted_exp(load8(in + j), scale, max));
    j += 8;
  }
  for (; j < n; ++j) out[j] = shifted_exp(in[j], scale, max);

  const double sum = lane_sum(n, [&](std::int64_t k) { return static_cast<double>(out[k]); });
  const auto inv = static_cast<float>(1.0 / sum);
  for (std::int64_t k = 0; k < n; ++k) out[k] *= inv;
  return {max, sum};
}

}  // namespace lockstep::kernels::detail
