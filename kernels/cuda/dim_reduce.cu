// CUDA reductions and softmax along a dimension (kernels/dim_reduce.h), without
// atomics: a row contiguous in memory (inner == 1) gets one block, whose
// threads stride over it and combine in block_reduce's fixed tree; otherwise
// each thread owns one (outer, inner) column and walks it in index order,
// reading neighbouring columns together (coalesced), as the CPU does.
#include <cstdint>
#include <cuda/std/limits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/cuda/grid_index.cuh"
#include "kernels/detail/dim_reduce_math.h"
#include "kernels/dim_reduce.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::block_reduce;
using detail::block_sum;
using detail::first_index;
using detail::from_f32;
using detail::grid_for;
using detail::grid_stride;
using detail::kThreads;
using detail::to_f32;
using detail::with_index;
using kernels::detail::max_nan;

constexpr unsigned kMaxRowBlocks = 65535;  // grid-stride over rows beyond this

unsigned row_grid(std::int64_t rows) {
  return static_cast<unsigned>(rows < kMaxRowBlocks ? rows : kMaxRowBlocks);
}

// The row kernels: row r is x[r * dim, (r + 1) * dim).

template <typename T, typename Index>
__device__ float block_row_max(const T* row, Index dim, double* lanes) {
  float m = -::cuda::std::numeric_limits<float>::infinity();
  for (Index j = threadIdx.x; j < dim; j += kThreads) m = max_nan(m, to_f32(row[j]));
  return static_cast<float>(block_reduce(
      m, lanes, [](double a, double b) { return static_cast<double>(max_nan(a, b)); }));
}

template <typename T, typename Index>
__global__ void reduce_rows(DimReduce op, const T* x, T* out, Index rows, Index dim) {
  __shared__ double lanes[kThreads];
  for (Index r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * dim;
    float result;
    if (op == DimReduce::max) {
      result = block_row_max(row, dim, lanes);
    } else {
      double s = 0.0;
      for (Index j = threadIdx.x; j < dim; j += kThreads) s += to_f32(row[j]);
      s = block_sum(s, lanes);
      result = static_cast<float>(op == DimReduce::mean ? s / static_cast<double>(dim) : s);
    }
    if (threadIdx.x == 0) out[r] = from_f32<T>(result);
  }
}

template <typename T, typename Index>
__global__ void softmax_rows(const T* x, T* y, Index rows, Index dim, bool log) {
  __shared__ double lanes[kThreads];
  for (Index r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * dim;
    const float m = block_row_max(row, dim, lanes);
    double s = 0.0;
    for (Index j = threadIdx.x; j < dim; j += kThreads) s += expf(to_f32(row[j]) - m);
    s = block_sum(s, lanes);
    for (Index j = threadIdx.x; j < dim; j += kThreads)
      y[r * dim + j] = from_f32<T>(kernels::detail::softmax_value(to_f32(row[j]), m, s, log));
  }
}

// The column kernels: column c = (o, i) is x[o * dim * inner + j * inner + i], j < dim.

template <typename T, typename Index>
__device__ float column_max(const T* x, Index base, Index dim, Index inner) {
  float m = -::cuda::std::numeric_limits<float>::infinity();
  for (Index j = 0; j < dim; ++j) m = max_nan(m, to_f32(x[base + j * inner]));
  return m;
}

template <typename T, typename Index>
__global__ void reduce_columns(DimReduce op, const T* x, T* out, Index columns, Index dim,
                               Index inner) {
  for (Index c = first_index<Index>(); c < columns; c += grid_stride<Index>()) {
    const Index base = (c / inner) * dim * inner + c % inner;
    float result;
    if (op == DimReduce::max) {
      result = column_max(x, base, dim, inner);
    } else {
      double s = 0.0;
      for (Index j = 0; j < dim; ++j) s += to_f32(x[base + j * inner]);
      result = static_cast<float>(op == DimReduce::mean ? s / static_cast<double>(dim) : s);
    }
    out[c] = from_f32<T>(result);
  }
}

template <typename T, typename Index>
__global__ void softmax_columns(const T* x, T* y, Index columns, Index dim, Index inner, bool log) {
  for (Index c = first_index<Index>(); c < columns; c += grid_stride<Index>()) {
    const Index base = (c / inner) * dim * inner + c % inner;
    const float m = column_max(x, base, dim, inner);
    double s = 0.0;
    for (Index j = 0; j < dim; ++j) s += expf(to_f32(x[base + j * inner]) - m);
    for (Index j = 0; j < dim; ++j) {
      const Index k = base + j * inner;
      y[k] = from_f32<T>(kernels::detail::softmax_value(to_f32(x[k]), m, s, log));
    }
  }
}

}  // namespace

void reduce_dim(DimReduce op, const void* x, void* out, DType type, const DimExtent& e,
                CudaStream stream) {
  const std::int64_t outputs = e.outer * e.inner;
  if (outputs == 0) return;
  detail::dispatch_float(type, "reduce along a dim", [&](auto tag) {
    using T = decltype(tag);
    // Output rows times dim bounds every index, dim == 0 included.
    with_index(outputs * (e.dim > 0 ? e.dim : 1), [&](auto index) {
      using Index = decltype(index);
      const auto* in = static_cast<const T*>(x);
      auto* o = static_cast<T*>(out);
      if (e.inner == 1)
        reduce_rows<T, Index><<<row_grid(outputs), kThreads, 0, stream>>>(
            op, in, o, static_cast<Index>(outputs), static_cast<Index>(e.dim));
      else
        reduce_columns<T, Index><<<grid_for(outputs), kThreads, 0, stream>>>(
            op, in, o, static_cast<Index>(outputs), static_cast<Index>(e.dim),
            static_cast<Index>(e.inner));
    });
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void softmax_dim(const void* x, void* y, DType type, const DimExtent& e, bool log,
                 CudaStream stream) {
  const std::int64_t rows = e.outer * e.inner;
  if (rows == 0 || e.dim == 0) return;
  detail::dispatch_float(type, "softmax", [&](auto tag) {
    using T = decltype(tag);
    with_index(rows * e.dim, [&](auto index) {
      using Index = decltype(index);
      const auto* in = static_cast<const T*>(x);
      auto* out = static_cast<T*>(y);
      if (e.inner == 1)
        softmax_rows<T, Index><<<row_grid(rows), kThreads, 0, stream>>>(
            in, out, static_cast<Index>(rows), static_cast<Index>(e.dim), log);
      else
        softmax_columns<T, Index><<<grid_for(rows), kThreads, 0, stream>>>(
            in, out, static_cast<Index>(rows), static_cast<Index>(e.dim),
            static_cast<Index>(e.inner), log);
    });
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace lockstep::kernels::cuda
