// exp in f32 written without branches or calls, so that GCC vectorises the
// CPU loops that use it (libm's expf is a scalar call): Cephes' expf, with the
// rounding to the nearest power of two done by adding and subtracting 1.5 x
// 2^23 (plain SSE2 adds, where floor would need SSE4.1). The file that uses
// it must be built with -fno-trapping-math and -ffp-contract=off (Note
// [vector tanh] and Note [AVX-512 clones] in kernels/cpu/activation.cpp say
// why). Within 2 ulp of exp on [-87, 88]. One definition serves a float and
// eight at a time (detail::Float8), with the same operations in the same
// order, so both give the same bits.
#pragma once

#include <bit>
#include <cstdint>

namespace lockstep::kernels::detail {

// Eight floats and eight int32s in the GCC vector extension (which clang
// has too): one AVX2 register, or two SSE2 ones in the baseline clones. A
// comparison gives an Int8 of -1 (true) and 0 lanes.
using Float8 = float __attribute__((vector_size(32)));
using Int8 = std::int32_t __attribute__((vector_size(32)));

[[gnu::always_inline]] inline Float8 broadcast8(float v) { return Float8{v, v, v, v, v, v, v, v}; }

// mask ? a : b lane by lane (mask lanes -1 or 0), by bits.
[[gnu::always_inline]] inline Float8 select8(Int8 mask, Float8 a, Float8 b) {
  return reinterpret_cast<Float8>((mask & reinterpret_cast<Int8>(a)) |
                                  (~mask & reinterpret_cast<Int8>(b)));
}

// 2^n for integral n in [-126, 127].
[[gnu::always_inline]] inline float power_of_two(float n) {
  return std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}
[[gnu::always_inline]] inline Float8 power_of_two(Float8 n) {
  return reinterpret_cast<Float8>((__builtin_convertvector(n, Int8) + 127) << 23);
}

// e^y for y in [-87, 88]; the caller clamps (exp(-87) is the smallest normal
// float's order, exp(88) the largest finite's). F is float or Float8.
template <typename F>
[[gnu::always_inline]] inline F exp_in_range(F y) {
  constexpr float kRound = 12582912.0f;  // 1.5 x 2^23: v + kRound - kRound rounds v
  const F n = (y * 1.44269504088896341f + kRound) - kRound;
  const F r = y - n * 0.693359375f + n * 2.12194440e-4f;  // y - n ln 2, in two parts
  F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * power_of_two(n);
}

}  // namespace lockstep::kernels::detail
