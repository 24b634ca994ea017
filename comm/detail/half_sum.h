// Elementwise sums of 16-bit float arrays, inout[i] = in[i] + inout[i]: the
// reduction behind the MPI ops for f16 and bf16, which MPI does not have.
// Each sum is computed in f32 and rounded once to the 16-bit type. That is the
// correctly rounded 16-bit sum: f32's 24 bits are at least 2p + 2 for p = 11
// (f16) and p = 8 (bf16), which makes the double rounding innocuous (Figueroa).
#pragma once

#include <cstdint>

#include "kernels/half.h"

namespace lockstep::comm::detail {

inline void sum_f16(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    inout[i] = kernels::f32_to_f16_bits(kernels::f16_bits_to_f32(in[i]) +
                                        kernels::f16_bits_to_f32(inout[i]));
}

inline void sum_bf16(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    inout[i] = kernels::f32_to_bf16_bits(kernels::bf16_bits_to_f32(in[i]) +
                                         kernels::bf16_bits_to_f32(inout[i]));
}

}  // namespace lockstep::comm::detail
