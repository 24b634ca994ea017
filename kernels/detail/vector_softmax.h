// One row's softmax in f32 with exponentials GCC vectorises
// (kernels/detail/vector_exp.h) and reductions over eight lanes
// (kernels/detail/lane_sum.h), shared by the causal attention softmax and
// the cross-entropy: the same arithmetic wherever lockstep's CPU takes a
// softmax. The file that uses it must be built with -fno-trapping-math
// (Note [vector tanh] in kernels/cpu/activation.cpp says why).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/detail/lane_sum.h"
#include "kernels/detail/vector_exp.h"

namespace lockstep::kernels::detail {

struct SoftmaxRow {
  float max;   // of the scaled inputs
  double sum;  // of exp(scaled input - max), before normalising
};

// out[j] = softmax(in * scale)[j] for j < n (n >= 1). Arguments of exp are
// <= 0; below -87 (e^-87 is f32's smallest normal order) the term is 0, so a
// -inf input has probability 0 exactly; a NaN (from a NaN input, or +inf)
// stays NaN, for the loss scaler to see. The max is taken over eight lanes
// (each starting from in[0], so a NaN there stays NaN as in one running max),
// the sum in f64 by detail::lane_sum.
[[gnu::always_inline]] inline SoftmaxRow softmax_row(const float* in, float scale, std::int64_t n,
                                                     float* out) {
  float lane[kSumLanes];
  std::fill(lane, lane + kSumLanes, in[0] * scale);
  const std::int64_t whole = n - n % kSumLanes;
  for (std::int64_t j = 0; j < whole; j += kSumLanes)
    for (std::int64_t k = 0; k < kSumLanes; ++k) lane[k] = std::max(lane[k], in[j + k] * scale);
  float max = lane[0];
  for (std::int64_t k = 1; k < kSumLanes; ++k) max = std::max(max, lane[k]);
  for (std::int64_t j = whole; j < n; ++j) max = std::max(max, in[j] * scale);
  for (std::int64_t j = 0; j < n; ++j) {
    const float y = in[j] * scale - max;
    const float e = exp_in_range(y > -87.0f ? y : -87.0f);
    out[j] = y != y ? y : (y < -87.0f ? 0.0f : e);
  }
  const double sum = lane_sum(n, [&](std::int64_t j) { return static_cast<double>(out[j]); });
  const auto inv = static_cast<float>(1.0 / sum);
  for (std::int64_t j = 0; j < n; ++j) out[j] *= inv;
  return {max, sum};
}

}  // namespace lockstep::kernels::detail
