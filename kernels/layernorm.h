// LayerNorm over the last dimension of a row-major f32 [rows, cols] buffer:
// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps) with the
// biased variance (as PyTorch). mean and rstd per row are saved for backward.
// gamma and beta may be null (no affine); dgamma and dbeta accumulate (+=),
// summed over rows in f64 (on CUDA in chunks of rows added in order: Note
// [column chunks]). Normalisation stays in f32 under autocast, so only f32 is
// supported.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/detail/column_chunks.h"

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
// Device scratch layernorm_backward needs for dgamma and dbeta.
inline std::size_t layernorm_backward_workspace_bytes(const LayerNormShape& s) {
  return kernels::detail::column_sums_workspace_bytes(s.rows, s.cols, 2);
}
void layernorm_forward(const LayerNormShape& s, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd, CudaStream stream);
void layernorm_backward(const LayerNormShape& s, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* gamma, float* dx, float* dgamma,
                        float* dbeta, void* workspace, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
