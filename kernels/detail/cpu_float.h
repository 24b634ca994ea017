// Loads and stores of the float DTypes as f32, for the CPU kernels: the one
// place where 16-bit storage is widened and rounded (see kernels/half.h).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace lockstep::kernels::detail {

inline float load_f32(const void* base, DType type, std::int64_t i) {
  switch (type) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::f16:
      return f16_bits_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    case DType::bf16:
      return bf16_bits_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    default:
      break;
  }
  throw InvalidArgument(std::string("expected a float dtype (f32, f16, bf16), got ") +
                        dtype_name(type));
}

inline void store_f32(void* base, DType type, std::int64_t i, float v) {
  switch (type) {
    case DType::f32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::f16:
      static_cast<std::uint16_t*>(base)[i] = f32_to_f16_bits(v);
      return;
    case DType::bf16:
      static_cast<std::uint16_t*>(base)[i] = f32_to_bf16_bits(v);
      return;
    default:
      break;
  }
  throw InvalidArgument(std::string("expected a float dtype (f32, f16, bf16), got ") +
                        dtype_name(type));
}

inline void require_float(DType type, const char* op) {
  if (!is_floating(type)) {
    throw InvalidArgument(std::string(op) + ": dtype " + dtype_name(type) +
                          " is not supported (use f32, f16 or bf16)");
  }
}

}  // namespace lockstep::kernels::detail
