// Bit-exact conversions between f32 and the 16-bit float types (IEEE binary16
// "f16" and bfloat16 "bf16"), used by the CPU backend to emulate 16-bit storage.
// Rounding is to nearest even; overflow goes to inf; subnormals are kept. NaN
// handling matches PyTorch (c10::Half, c10::BFloat16) so that weights move
// between the two bit for bit: f16 NaN -> sign|0x7e00, bf16 NaN -> 0x7fc0.
#pragma once

#include <cstdint>
#include <cstring>

namespace lockstep::kernels {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds q (a value with `shift` extra low bits in `rest`) to nearest even.
inline std::uint32_t round_nearest_even(std::uint32_t q, std::uint32_t rest, std::uint32_t shift) {
  const std::uint32_t halfway = 1u << (shift - 1);
  return (rest > halfway || (rest == halfway && (q & 1u))) ? q + 1 : q;
}

inline std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  const std::uint32_t biased_exp = ax >> 23;
  if (ax < 0x38800000u) {
    // Below 2^-14: an f16 subnormal q * 2^-24 (or zero). With the implicit bit,
    // the f32 value is m * 2^(biased_exp - 150), so q = m >> (126 - biased_exp).
    if (biased_exp < 102) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to 0
    const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - biased_exp;  // 14..24
    const std::uint32_t q = round_nearest_even(m >> shift, m & ((1u << shift) - 1), shift);
    return static_cast<std::uint16_t>(sign | q);  // q == 0x400 is the smallest normal
  }
  const std::uint32_t mant = ax & 0x7fffffu;
  const std::uint32_t q = ((biased_exp - 112) << 10) | (mant >> 13);
  // A carry out of the mantissa correctly bumps the exponent.
  return static_cast<std::uint16_t>(sign | round_nearest_even(q, mant & 0x1fffu, 13));
}

inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    std::uint32_t biased = 113;  // normalise the subnormal: value = mant * 2^-24
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --biased;
    }
    return bits_float(sign | (biased << 23) | ((mant & 0x3ffu) << 13));
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN, as PyTorch
  // Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry
  // into the exponent gives the next power of two, or inf past the largest.
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_f32(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace lockstep::kernels
