// Reductions over raw buffers of a float type: sum and sum of squares (for
// global gradient norms), accumulated in f64 and written as one f32, or, for
// the sum of squares, as the f64 total itself (a gradient norm's, which may
// exceed FLT_MAX while every element is finite: Note [non-finite steps],
// engine/data_parallel_step.h), and a
// non-finite check that sets a flag when any element is inf or NaN (for the
// loss scaler). The CUDA versions are deterministic: a fixed grid writes
// per-block partials to the workspace and one block adds them in order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

namespace cpu {
void sum(const void* x, DType type, std::int64_t n, float* out);
void sum_squares(const void* x, DType type, std::int64_t n, float* out);
void sum_squares(const void* x, DType type, std::int64_t n, double* out);
// Sets *flag to 1 if any element is inf or NaN; otherwise leaves it unchanged,
// so that one flag can collect several buffers.
void flag_nonfinite(const void* x, DType type, std::int64_t n, std::int32_t* flag);
}  // namespace cpu

namespace cuda {
constexpr int kReduceBlocks = 264;  // a multiple of the H200's 132 SMs
constexpr std::size_t kReduceWorkspaceBytes = kReduceBlocks * sizeof(double);
// out, flag and workspace are device memory.
void sum(const void* x, DType type, std::int64_t n, float* out, void* workspace, CudaStream stream);
void sum_squares(const void* x, DType type, std::int64_t n, float* out, void* workspace,
                 CudaStream stream);
void sum_squares(const void* x, DType type, std::int64_t n, double* out, void* workspace,
                 CudaStream stream);
void flag_nonfinite(const void* x, DType type, std::int64_t n, std::int32_t* flag,
                    CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
