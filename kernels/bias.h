// Bias of a Linear layer over a row-major [rows, cols] buffer of a float type:
// y[i, j] += b[j] (computed in f32, rounded once to y's type), and its
// gradient db[j] += sum_i dy[i, j] (accumulated in f64 per column:
// deterministic on both backends; in row order on the CPU, on CUDA in chunks
// of rows added in order, Note [column chunks]). The bias and db are f32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/detail/column_chunks.h"

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

namespace cpu {
void add_bias(void* y, DType type, const float* bias, std::int64_t rows, std::int64_t cols);
void bias_grad(const void* dy, DType type, std::int64_t rows, std::int64_t cols, float* db);
}  // namespace cpu

namespace cuda {
// Device scratch bias_grad needs (0 bytes when rows is 0).
inline std::size_t bias_grad_workspace_bytes(std::int64_t rows, std::int64_t cols) {
  return kernels::detail::column_sums_workspace_bytes(rows, cols, 1);
}
void add_bias(void* y, DType type, const float* bias, std::int64_t rows, std::int64_t cols,
              CudaStream stream);
void bias_grad(const void* dy, DType type, std::int64_t rows, std::int64_t cols, float* db,
               void* workspace, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
