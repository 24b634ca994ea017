// Bulk conversion between the float DTypes' storage and f32, for CPU kernels
// that compute in f32 scratch: the type is dispatched once per call, not per
// element as in cpu_float.h. Widening is exact; narrowing rounds to nearest
// even with overflow to inf (kernels/half.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"
#include "kernels/half.h"

namespace lockstep::kernels::detail {

inline void widen(const void* src, DType type, std::int64_t n, float* dst) {
  const auto* bits = static_cast<const std::uint16_t*>(src);
  if (type == DType::f16)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_bits_to_f32(bits[i]);
  else if (type == DType::bf16)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(bits[i]);
  else
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}

inline void narrow(const float* src, std::int64_t n, DType type, void* dst) {
  auto* bits = static_cast<std::uint16_t*>(dst);
  if (type == DType::f16)
    for (std::int64_t i = 0; i < n; ++i) bits[i] = f32_to_f16_bits(src[i]);
  else if (type == DType::bf16)
    for (std::int64_t i = 0; i < n; ++i) bits[i] = f32_to_bf16_bits(src[i]);
  else
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}

// v rounded to `type` and back (identity for f32).
inline float round_to(DType type, float v) {
  if (type == DType::f16) return f16_bits_to_f32(f32_to_f16_bits(v));
  if (type == DType::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  return v;
}

}  // namespace lockstep::kernels::detail
