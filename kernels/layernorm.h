// LayerNorm over the last dimension of a row-major [rows, cols] buffer:
// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps) with the
// biased variance (as PyTorch). mean and rstd per row are saved for backward.
// gamma and beta may be null (no affine); dgamma and dbeta accumulate (+=),
// summed over rows in f64 (on CUDA in chunks of rows added in order: Note
// [column chunks]). Besides the f32 calls, the mixed-type ones of Note
// [low-type LayerNorm] read and write f16/bf16, and fuse the residual add.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/detail/column_chunks.h"
#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

struct LayerNormShape {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  float eps = 1e-5f;
};

// Note [low-type LayerNorm]: under autocast a transformer's residual stream
// stays f32 (as PyTorch AMP keeps it) while each branch computes and returns
// the low type (f16/bf16), and the LayerNorms feed Linears that would cast
// their input to the low type anyway. The mixed calls below read each tensor
// in its own type (f32, f16 or bf16) and round each output to its type once,
// so that a LayerNorm's input or output never makes an extra f32 round trip:
// - the arithmetic is the f32 calls': x widened to f32 exactly, row
//   statistics in f64, each output computed in f32 (dx in f64) and rounded
//   to its type to nearest even, as a cast of the f32 result would be;
// - add_layernorm_forward is a residual add and the next LayerNorm in one
//   pass: sum = residual + branch (f32, the same bits as the unfused add),
//   y = LayerNorm(sum), sum written back for the stream and kept for backward;
// - layernorm_backward_mixed adds `dresidual` (the gradient that reaches the
//   LayerNorm's input through the residual stream; null: none) to dx in the
//   same pass, so the backward of the add and the LayerNorm is one kernel
//   (plus the column sums of dgamma and dbeta, deterministic as the f32 call's).
// The CPU versions compose the f32 calls and casts, in the order the unfused
// modules run them: they are the twins the CUDA kernels are tested against,
// and a CPU model computes the same bits through either path.

namespace cpu {
void layernorm_forward(const LayerNormShape& s, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd);
void layernorm_backward(const LayerNormShape& s, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* gamma, float* dx, float* dgamma,
                        float* dbeta);
// Note [low-type LayerNorm]. x in x_type, y in y_type (each f32, f16 or bf16).
void layernorm_forward_mixed(const LayerNormShape& s, const void* x, DType x_type,
                             const float* gamma, const float* beta, void* y, DType y_type,
                             float* mean, float* rstd);
// sum = residual + branch (branch in branch_type; sum may alias residual),
// y = LayerNorm(sum) in y_type.
void add_layernorm_forward(const LayerNormShape& s, const float* residual, const void* branch,
                           DType branch_type, const float* gamma, const float* beta, float* sum,
                           void* y, DType y_type, float* mean, float* rstd);
// dx = dresidual (f32, or null) + the LayerNorm's input gradient, in x_type
// (the input's type, as a module returns it); dy in dy_type. dx may alias
// dresidual when x_type is f32.
void layernorm_backward_mixed(const LayerNormShape& s, const void* dy, DType dy_type, const void* x,
                              DType x_type, const float* mean, const float* rstd,
                              const float* gamma, const float* dresidual, void* dx, float* dgamma,
                              float* dbeta);
// out = residual + branch over n elements (f32 + branch_type, f32 out; out may
// alias residual): a residual add that no LayerNorm follows.
void residual_add(std::int64_t n, const float* residual, const void* branch, DType branch_type,
                  float* out);
}  // namespace cpu

namespace cuda {
// Device scratch layernorm_backward and layernorm_backward_mixed need for
// dgamma and dbeta.
inline std::size_t layernorm_backward_workspace_bytes(const LayerNormShape& s) {
  return kernels::detail::column_sums_workspace_bytes(s.rows, s.cols, 2);
}
void layernorm_forward(const LayerNormShape& s, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd, CudaStream stream);
void layernorm_backward(const LayerNormShape& s, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* gamma, float* dx, float* dgamma,
                        float* dbeta, void* workspace, CudaStream stream);
// Note [low-type LayerNorm]; the arguments are the CPU calls'. One warp per row.
void layernorm_forward_mixed(const LayerNormShape& s, const void* x, DType x_type,
                             const float* gamma, const float* beta, void* y, DType y_type,
                             float* mean, float* rstd, CudaStream stream);
void add_layernorm_forward(const LayerNormShape& s, const float* residual, const void* branch,
                           DType branch_type, const float* gamma, const float* beta, float* sum,
                           void* y, DType y_type, float* mean, float* rstd, CudaStream stream);
void layernorm_backward_mixed(const LayerNormShape& s, const void* dy, DType dy_type, const void* x,
                              DType x_type, const float* mean, const float* rstd,
                              const float* gamma, const float* dresidual, void* dx, float* dgamma,
                              float* dbeta, void* workspace, CudaStream stream);
void residual_add(std::int64_t n, const float* residual, const void* branch, DType branch_type,
                  float* out, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
