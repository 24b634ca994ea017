// CPU optimizer steps and unscaling (kernels/optimizer.h). Each segment is a
// branch-free loop over raw pointers, the group's options being loop-invariant
// selects, so GCC vectorises the SGD and unscale loops (behind a run-time
// overlap check). AdamW's loop stays scalar: std::sqrt keeps its errno path,
// which GCC vectorises only under -fno-math-errno, a flag the build does not set.
#include <bit>
#include <cmath>

#include "kernels/optimizer.h"

namespace lockstep::kernels::cpu {
void sgd_step(const OptimizerSegment* segments, std::int64_t segment_count, const SgdGroup* groups,
              int group_count, float* params, const float* grads, float* momentum) {
  validate_segments(segments, segment_count, group_count, "sgd_step");
  for (std::int64_t s = 0; s < segment_count; ++s) {
    const OptimizerSegment& segment = segments[s];
    const SgdGroup& h = groups[segment.group];
    float* p = params + segment.offset;
    const float* g = grads + (segment.offset + segment.grad_shift);
    const std::int64_t n = segment.length;
    const float lr = h.lr, weight_decay = h.weight_decay, mu = h.momentum;
    // PyTorch adds weight_decay * p only when weight_decay != 0 (an inf
    // parameter must not turn into NaN through 0 * inf).
    const bool decay = weight_decay != 0.0f;
    if (mu == 0.0f) {
      for (std::int64_t i = 0; i < n; ++i) {
        const float d = decay ? g[i] + weight_decay * p[i] : g[i];
        p[i] -= lr * d;
      }
      continue;
    }
    float* buf = momentum + segment.state_offset;
    const float keep = h.one_minus_dampening;
    const bool first = h.first_step, nesterov = h.nesterov;
    for (std::int64_t i = 0; i < n; ++i) {
      const float d = decay ? g[i] + weight_decay * p[i] : g[i];
      const float b = first ? d : mu * buf[i] + keep * d;
      buf[i] = b;
      p[i] -= lr * (nesterov ? d + mu * b : b);
    }
  }
}

void adamw_step(const OptimizerSegment* segments, std::int64_t segment_count,
                const AdamwGroup* groups, int group_count, float* params, const float* grads,
                float* exp_avg, float* exp_avg_sq) {
  validate_segments(segments, segment_count, group_count, "adamw_step");
  for (std::int64_t s = 0; s < segment_count; ++s) {
    const OptimizerSegment& segment = segments[s];
    const AdamwGroup& h = groups[segment.group];
    float* p = params + segment.offset;
    const float* g = grads + (segment.offset + segment.grad_shift);
    float* m = exp_avg + segment.state_offset;
    float* v = exp_avg_sq + segment.state_offset;
    const std::int64_t n = segment.length;
    const float decay = h.decay_factor, beta1 = h.beta1, beta2 = h.beta2, eps = h.eps;
    const float one_minus_beta1 = h.one_minus_beta1, one_minus_beta2 = h.one_minus_beta2;
    const float step_size = h.step_size, bias_correction2_sqrt = h.bias_correction2_sqrt;
    for (std::int64_t i = 0; i < n; ++i) {
      const float gi = g[i];
      const float mi = beta1 * m[i] + one_minus_beta1 * gi;
      const float vi = beta2 * v[i] + one_minus_beta2 * (gi * gi);
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) / bias_correction2_sqrt + eps;
      p[i] = p[i] * decay - step_size * (mi / denom);
    }
  }
}

void unscale_and_check(float* grads, std::int64_t n, float inv_scale,
                       std::int32_t* found_nonfinite) {
  // inf and NaN are the floats whose exponent bits are all ones; testing the
  // bits keeps the loop vectorisable.
  constexpr std::uint32_t kExponent = 0x7f800000u;
  std::uint32_t nonfinite = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grads[i];
    nonfinite |=
        static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(g) & kExponent) == kExponent);
    grads[i] = g * inv_scale;
  }
  if (nonfinite) *found_nonfinite = 1;
}

}  // namespace lockstep::kernels::cpu
