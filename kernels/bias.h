// Bias of a Linear layer over a row-major [rows, cols] buffer of a float type:
// y[i, j] += b[j] (computed in f32, rounded once to y's type), and its
// gradient db[j] += sum_i dy[i, j] (accumulated in f64 per column, in row
// order: deterministic on both backends). The bias and db are f32.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

namespace cpu {
void add_bias(void* y, DType type, const float* bias, std::int64_t rows, std::int64_t cols);
void bias_grad(const void* dy, DType type, std::int64_t rows, std::int64_t cols, float* db);
}  // namespace cpu

namespace cuda {
void add_bias(void* y, DType type, const float* bias, std::int64_t rows, std::int64_t cols,
              CudaStream stream);
void bias_grad(const void* dy, DType type, std::int64_t rows, std::int64_t cols, float* db,
               CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
