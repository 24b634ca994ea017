// Reference f16 and bf16 roundings that share no code with kernels/half.h,
// for the conversion and communication tests: a pattern's value from its IEEE
// fields by std::ldexp, and nearest-even rounding of a double by a search over
// the patterns in f64 (GCC's _Float16 was the f16 reference until clang-14,
// which has no _Float16 on x86, built the tests for CI's sanitizer stage).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace lockstep::test {

// The value of a binary16 (5, 10) or bfloat16 (8, 7) pattern, in f64.
inline double decode_fields(std::uint16_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int exp = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mant = bits & ((1 << mantissa_bits) - 1);
  const double sign = (bits >> 15) ? -1.0 : 1.0;
  if (exp == (1 << exponent_bits) - 1)
    return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, 1 - bias - mantissa_bits);
  return sign * std::ldexp(mant + (1 << mantissa_bits), exp - bias - mantissa_bits);
}

// The pattern nearest to x (not NaN), ties to the even pattern; past the
// largest finite value's rounding boundary, (2 - 2^-(mantissa_bits + 1))
// 2^max_exponent, inf.
inline std::uint16_t nearest_even_bits(double x, int exponent_bits, int mantissa_bits) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const auto inf = static_cast<std::uint16_t>(((1 << exponent_bits) - 1) << mantissa_bits);
  const double ax = std::fabs(x);
  const int max_exponent = (1 << (exponent_bits - 1)) - 1;
  if (ax >= std::ldexp(2.0 - std::ldexp(1.0, -mantissa_bits - 1), max_exponent)) return sign | inf;
  std::uint16_t lo = 0, hi = inf - 1;  // the largest pattern whose value <= ax
  while (lo < hi) {
    const auto mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
    if (decode_fields(mid, exponent_bits, mantissa_bits) <= ax)
      lo = mid;
    else
      hi = static_cast<std::uint16_t>(mid - 1);
  }
  const double below = decode_fields(lo, exponent_bits, mantissa_bits);
  const double above = decode_fields(lo + 1, exponent_bits, mantissa_bits);
  std::uint16_t pick;
  if (ax - below < above - ax)
    pick = lo;
  else if (ax - below > above - ax)
    pick = static_cast<std::uint16_t>(lo + 1);
  else
    pick = (lo & 1) ? static_cast<std::uint16_t>(lo + 1) : lo;
  return sign | pick;
}

inline double round_f16(double x) {
  return std::isnan(x) ? x : decode_fields(nearest_even_bits(x, 5, 10), 5, 10);
}

inline double round_bf16(double x) {
  return std::isnan(x) ? x : decode_fields(nearest_even_bits(x, 8, 7), 8, 7);
}

}  // namespace lockstep::test
