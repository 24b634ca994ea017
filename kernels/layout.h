// Memory-layout permutations between NCHW (channels-first, PyTorch's default)
// and NHWC (channels-last): the conversions at the edges of a channels-last
// model and inside the convolution where a library wants the other layout.
// Pure permutations of whole elements (any DType: 1, 2, 4 or 8 bytes), so
// they are bit exact and their CPU and CUDA results are identical.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

// In both directions n, c, h, w are the NCHW sizes: x and y hold n * c * h * w
// elements and must not overlap. nchw_to_nhwc: y[n, h, w, c] = x[n, c, h, w];
// nhwc_to_nchw: y[n, c, h, w] = x[n, h, w, c]. batched_transpose is the
// kernel under both: y[b, j, i] = x[b, i, j] for x of shape [batch, rows,
// cols] (nchw_to_nhwc is batched_transpose(n, c, h * w), the reverse
// batched_transpose(n, h * w, c); a conv weight [K, C, R, S] to [K, R, S, C]
// is batched_transpose(K, C, R * S)).
namespace cpu {
void nchw_to_nhwc(DType type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                  const void* x, void* y);
void nhwc_to_nchw(DType type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                  const void* x, void* y);
void batched_transpose(DType type, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                       const void* x, void* y);
}  // namespace cpu

namespace cuda {
void nchw_to_nhwc(DType type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                  const void* x, void* y, CudaStream stream);
void nhwc_to_nchw(DType type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                  const void* x, void* y, CudaStream stream);
void batched_transpose(DType type, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                       const void* x, void* y, CudaStream stream);
// The f32 transpose-add behind channels-last weight gradients: y[b, j, i] =
// (accumulate ? y[b, j, i] : 0) + x[b, i, j]; with `x_type` f16 or bf16 the
// 16-bit x is widened first (exact), so this is a rounding of x's value once.
void batched_transpose_add_f32(DType x_type, std::int64_t batch, std::int64_t rows,
                               std::int64_t cols, const void* x, float* y, bool accumulate,
                               CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
