// CUDA reductions (kernels/reduce.h). Deterministic by construction: a fixed
// grid of kReduceBlocks accumulates in f64 in a fixed order, each block writes
// one partial to the workspace, and one block adds the partials in order.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/reduce.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::block_sum;
using detail::kThreads;
using detail::to_f32;

template <typename T, bool square>
__global__ void partial_sums(const T* x, std::int64_t n, double* partials) {
  double acc = 0.0;
  for (std::int64_t i = blockIdx.x * std::int64_t{kThreads} + threadIdx.x; i < n;
       i += std::int64_t{kReduceBlocks} * kThreads) {
    const double v = to_f32(x[i]);
    acc += square ? v * v : v;
  }
  __shared__ double lanes[kThreads];
  const double total = block_sum(acc, lanes);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

template <typename Out>
__global__ void finish_sum(const double* partials, Out* out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < kReduceBlocks; i += kThreads) acc += partials[i];
  __shared__ double lanes[kThreads];
  const double total = block_sum(acc, lanes);
  if (threadIdx.x == 0) *out = static_cast<Out>(total);
}

template <typename T>
__global__ void nonfinite_kernel(const T* x, std::int64_t n, std::int32_t* flag) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    if (!isfinite(to_f32(x[i]))) *flag = 1;  // every writer stores the same 1
  }
}

template <bool square, typename Out>
void reduce(const void* x, DType type, std::int64_t n, Out* out, void* workspace, CudaStream stream,
            const char* name) {
  detail::dispatch_float(type, name, [&](auto tag) {
    using T = decltype(tag);
    auto* partials = static_cast<double*>(workspace);
    partial_sums<T, square>
        <<<kReduceBlocks, kThreads, 0, stream>>>(static_cast<const T*>(x), n, partials);
    finish_sum<<<1, kThreads, 0, stream>>>(partials, out);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace

void sum(const void* x, DType type, std::int64_t n, float* out, void* workspace,
         CudaStream stream) {
  reduce<false>(x, type, n, out, workspace, stream, "sum");
}

void sum_squares(const void* x, DType type, std::int64_t n, float* out, void* workspace,
                 CudaStream stream) {
  reduce<true>(x, type, n, out, workspace, stream, "sum_squares");
}

void sum_squares(const void* x, DType type, std::int64_t n, double* out, void* workspace,
                 CudaStream stream) {
  reduce<true>(x, type, n, out, workspace, stream, "sum_squares");
}

void flag_nonfinite(const void* x, DType type, std::int64_t n, std::int32_t* flag,
                    CudaStream stream) {
  detail::dispatch_float(type, "flag_nonfinite", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return;
    nonfinite_kernel<T>
        <<<detail::grid_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, flag);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace lockstep::kernels::cuda
