// exp in f32 written without branches or calls, so that GCC vectorises the
// CPU loops that use it (libm's expf is a scalar call): Cephes' expf, with the
// rounding to the nearest power of two done by adding and subtracting 1.5 x
// 2^23 (plain SSE2 adds, where floor would need SSE4.1). The file that uses
// it must be built with -fno-trapping-math (Note [vector tanh] in
// kernels/cpu/activation.cpp says why). Within 2 ulp of exp on [-87, 88].
#pragma once

#include <bit>
#include <cstdint>

namespace lockstep::kernels::detail {

// e^y for y in [-87, 88]; the caller clamps (exp(-87) is the smallest normal
// float's order, exp(88) the largest finite's).
[[gnu::always_inline]] inline float exp_in_range(float y) {
  constexpr float kRound = 12582912.0f;  // 1.5 x 2^23: v + kRound - kRound rounds v
  const float n = (y * 1.44269504088896341f + kRound) - kRound;
  const float r = y - n * 0.693359375f + n * 2.12194440e-4f;  // y - n ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}

}  // namespace lockstep::kernels::detail
