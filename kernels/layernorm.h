// LayerNorm over the last dimension of a row-major f32 [rows, cols] buffer:
// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps) with the
// biased variance (as PyTorch). mean and rstd per row are saved for backward.
// gamma and beta may be null (no affine); dgamma and dbeta accumulate (+=).
// Normalisation stays in f32 under autocast, so only f32 is supported.
#pragma once

#include <cstdint>

#include "kernels/stream.h"

namespace lockstep::kernels {

struct LayerNormShape {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  float eps = 1e-5f;
};

namespace cpu {
void layernorm_forward(const LayerNormShape& s, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd);
void layernorm_backward(const LayerNormShape& s, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* gamma, float* dx, float* dgamma,
                        float* dbeta);
}  // namespace cpu

namespace cuda {
void layernorm_forward(const LayerNormShape& s, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd, CudaStream stream);
void layernorm_backward(const LayerNormShape& s, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* gamma, float* dx, float* dgamma,
                        float* dbeta, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
