// CUDA bias and bias gradient (kernels/bias.h). The gradient gives each
// thread one column and walks the rows in order: deterministic, and adjacent
// threads read adjacent addresses.
#include "kernels/bias.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"

namespace lockstep::kernels::cuda {
namespace {

using detail::from_f32;
using detail::to_f32;

template <typename T>
__global__ void add_bias_kernel(T* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f32<T>(to_f32(y[i]) + bias[i % cols]);
}

template <typename T>
__global__ void bias_grad_kernel(const T* dy, std::int64_t rows, std::int64_t cols, float* db) {
  for (std::int64_t j = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; j < cols;
       j += std::int64_t{gridDim.x} * blockDim.x) {
    double acc = 0.0;
    for (std::int64_t i = 0; i < rows; ++i) acc += to_f32(dy[i * cols + j]);
    db[j] = static_cast<float>(db[j] + acc);
  }
}

}  // namespace

void add_bias(void* y, DType type, const float* bias, std::int64_t rows, std::int64_t cols,
              CudaStream stream) {
  detail::dispatch_float(type, "add_bias", [&](auto tag) {
    using T = decltype(tag);
    if (rows * cols == 0) return;
    add_bias_kernel<T><<<detail::grid_for(rows * cols), detail::kThreads, 0, stream>>>(
        static_cast<T*>(y), bias, rows, cols);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void bias_grad(const void* dy, DType type, std::int64_t rows, std::int64_t cols, float* db,
               CudaStream stream) {
  detail::dispatch_float(type, "bias_grad", [&](auto tag) {
    using T = decltype(tag);
    if (cols == 0) return;
    bias_grad_kernel<T><<<detail::grid_for(cols), detail::kThreads, 0, stream>>>(
        static_cast<const T*>(dy), rows, cols, db);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace lockstep::kernels::cuda
