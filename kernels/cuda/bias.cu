// CUDA bias and bias gradient (kernels/bias.h). The gradient is a two-pass
// column sum (kernels/cuda/column_sum.cuh): tiles of columns x chunks of rows,
// then the chunks in order; deterministic, no atomics.
#include <climits>
#include <cstdint>

#include "kernels/bias.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/device_float.cuh"

namespace lockstep::kernels::cuda {
namespace {

using detail::from_f32;
using detail::to_f32;

// I: 32-bit where rows x cols <= INT32_MAX (the index plus the grid's stride then
// stays below 2^32), as Note [32-bit head moves] in attention.cu; a 64-bit
// modulo per element costs more than the add.
template <typename I, typename T>
__global__ void add_bias_kernel(T* y, const float* bias, I n, I cols) {
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I>(gridDim.x) * blockDim.x)
    y[i] = from_f32<T>(to_f32(y[i]) + bias[i % cols]);
}

template <typename T>
struct BiasGradTerm {
  const T* dy;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i, std::int64_t j, double* acc) const {
    acc[0] += to_f32(dy[i * cols + j]);
  }
};

}  // namespace

void add_bias(void* y, DType type, const float* bias, std::int64_t rows, std::int64_t cols,
              CudaStream stream) {
  detail::dispatch_float(type, "add_bias", [&](auto tag) {
    using T = decltype(tag);
    if (rows * cols == 0) return;
    const std::int64_t n = rows * cols;
    const unsigned grid = detail::grid_for(n);
    if (n <= std::int64_t{INT32_MAX})
      add_bias_kernel<std::uint32_t, T><<<grid, detail::kThreads, 0, stream>>>(
          static_cast<T*>(y), bias, static_cast<std::uint32_t>(n),
          static_cast<std::uint32_t>(cols));
    else
      add_bias_kernel<std::int64_t, T>
          <<<grid, detail::kThreads, 0, stream>>>(static_cast<T*>(y), bias, n, cols);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void bias_grad(const void* dy, DType type, std::int64_t rows, std::int64_t cols, float* db,
               void* workspace, CudaStream stream) {
  detail::dispatch_float(type, "bias_grad", [&](auto tag) {
    using T = decltype(tag);
    detail::ColumnOutputs<1> outputs;
    outputs.out[0] = db;
    detail::column_sums<1>(rows, cols, BiasGradTerm<T>{static_cast<const T*>(dy), cols}, outputs,
                           workspace, stream);
  });
}

}  // namespace lockstep::kernels::cuda
