// CUDA activations (kernels/activation.h), with the formulas shared with the
// CPU (kernels/detail/activation_math.h).
#include "kernels/activation.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/detail/activation_math.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::from_f32;
using detail::to_f32;

template <typename T>
__global__ void forward_kernel(Activation act, const T* x, T* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f32<T>(kernels::detail::activation_value(act, to_f32(x[i])));
}

template <typename T>
__global__ void backward_kernel(Activation act, const T* dy, const T* x, T* dx, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    dx[i] = from_f32<T>(kernels::detail::activation_gradient(act, to_f32(dy[i]), to_f32(x[i])));
}

}  // namespace

void activation_forward(Activation act, const void* x, void* y, DType type, std::int64_t n,
                        CudaStream stream) {
  detail::dispatch_float(type, "activation_forward", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return;
    forward_kernel<T><<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
        act, static_cast<const T*>(x), static_cast<T*>(y), n);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void activation_backward(Activation act, const void* dy, const void* x, void* dx, DType type,
                         std::int64_t n, CudaStream stream) {
  detail::dispatch_float(type, "activation_backward", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return;
    backward_kernel<T><<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
        act, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(dx), n);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace lockstep::kernels::cuda
