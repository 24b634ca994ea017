// Dropout's elementwise part: y = x * mask * scale over a float type, with a
// u8 keep-mask (1 keeps) that Philox drew (kernels/philox.h bernoulli_mask).
// The same call computes the backward (dx = dy * mask * scale).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

namespace cpu {
void apply_mask(const void* x, const std::uint8_t* mask, void* y, DType type, std::int64_t n,
                float scale);
}  // namespace cpu

namespace cuda {
void apply_mask(const void* x, const std::uint8_t* mask, void* y, DType type, std::int64_t n,
                float scale, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
