// Elementwise sums of 16-bit float arrays, inout[i] = in[i] + inout[i]: the
// reduction behind the MPI ops for f16 and bf16, which MPI does not have.
// Each sum is computed in f32 and rounded once to the 16-bit type. That is the
// correctly rounded 16-bit sum: f32's 24 bits are at least 2p + 2 for p = 11
// (f16) and p = 8 (bf16), which makes the double rounding innocuous (Figueroa).
#pragma once

#include <cstdint>

namespace lockstep::comm::detail {

// On x86-64 CPUs with F16C (f16) or AVX2 (bf16) these run vector code chosen
// at run time (about 50x and 2.5x faster than the portable loops); elsewhere
// they are the portable loops. Results are the same, except the bits of NaNs.
void sum_f16(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n);
void sum_bf16(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n);

// The portable loops (kernels/half.h conversions), for any CPU.
void sum_f16_portable(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n);
void sum_bf16_portable(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n);

}  // namespace lockstep::comm::detail
