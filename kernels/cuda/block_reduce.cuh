// Block-wide reductions over one f64 value per thread, in a fixed tree order
// (so a given input always gives the same bits), for kernels launched with
// detail::kThreads threads. `lanes` is a __shared__ array of kThreads doubles;
// every thread gets the result, and the array may be reused right after.
#pragma once

#include "kernels/cuda/device_float.cuh"

namespace lockstep::kernels::cuda::detail {

template <typename Combine>
__device__ double block_reduce(double v, double* lanes, Combine combine) {
  lanes[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      lanes[threadIdx.x] = combine(lanes[threadIdx.x], lanes[threadIdx.x + stride]);
    __syncthreads();
  }
  const double result = lanes[0];
  __syncthreads();
  return result;
}

__device__ inline double block_sum(double v, double* lanes) {
  return block_reduce(v, lanes, [](double a, double b) { return a + b; });
}

__device__ inline double block_max(double v, double* lanes) {
  return block_reduce(v, lanes, [](double a, double b) { return fmax(a, b); });
}

}  // namespace lockstep::kernels::cuda::detail
