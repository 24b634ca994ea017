// CUDA pointwise ops (kernels/pointwise.h): grid-stride kernels computing the
// formulas of kernels/detail/pointwise_math.h in f32. Index math is 32-bit
// when the output allows (kernels/cuda/grid_index.cuh); a broadcast operand
// never holds more elements than the output, so its offsets fit too.
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/cuda/grid_index.cuh"
#include "kernels/detail/pointwise_math.h"
#include "kernels/pointwise.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::first_index;
using detail::from_f32;
using detail::grid_for;
using detail::grid_stride;
using detail::kThreads;
using detail::to_f32;
using detail::with_index;

// BroadcastGeometry in the kernel's index type.
template <typename Index>
struct DeviceGeometry {
  int rank;
  Index sizes[kMaxBroadcastDims];
  Index strides[3][kMaxBroadcastDims];
};

template <typename Index>
DeviceGeometry<Index> device_geometry(const BroadcastGeometry& g) {
  DeviceGeometry<Index> d{};
  d.rank = g.rank;
  for (int i = 0; i < g.rank; ++i) {
    d.sizes[i] = static_cast<Index>(g.sizes[i]);
    for (int k = 0; k < 3; ++k) d.strides[k][i] = static_cast<Index>(g.strides[k][i]);
  }
  return d;
}

// Each operand's element offset for output element i (Note [broadcast geometry]).
template <int operands, typename Index>
__device__ void offsets_of(Index i, const DeviceGeometry<Index>& g, Index* offsets) {
  for (int k = 0; k < operands; ++k) offsets[k] = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    const Index c = i % g.sizes[d];
    i /= g.sizes[d];
    for (int k = 0; k < operands; ++k) offsets[k] += c * g.strides[k][d];
  }
}

template <typename T, typename Index>
__global__ void unary_kernel(UnaryOp op, const T* x, T* y, Index n) {
  for (Index i = first_index<Index>(); i < n; i += grid_stride<Index>())
    y[i] = from_f32<T>(kernels::detail::unary_value(op, to_f32(x[i])));
}

template <typename T, typename Index>
__global__ void binary_kernel(BinaryOp op, const T* a, float a_scalar, const T* b, float b_scalar,
                              T* out, Index n, DeviceGeometry<Index> g) {
  for (Index i = first_index<Index>(); i < n; i += grid_stride<Index>()) {
    Index offsets[2];
    offsets_of<2>(i, g, offsets);
    const float x = a ? to_f32(a[offsets[0]]) : a_scalar;
    const float y = b ? to_f32(b[offsets[1]]) : b_scalar;
    out[i] = from_f32<T>(kernels::detail::binary_value(op, x, y));
  }
}

template <typename C>
__device__ bool is_set(C c) {
  if constexpr (std::is_same_v<C, std::uint8_t>)
    return c != 0;
  else
    return to_f32(c) != 0.0f;
}

template <typename C, typename T, typename Index>
__global__ void where_kernel(const C* cond, const T* a, const T* b, T* out, Index n,
                             DeviceGeometry<Index> g) {
  for (Index i = first_index<Index>(); i < n; i += grid_stride<Index>()) {
    Index offsets[3];
    offsets_of<3>(i, g, offsets);
    out[i] = is_set(cond[offsets[2]]) ? a[offsets[0]] : b[offsets[1]];
  }
}

std::int64_t element_count(const BroadcastGeometry& g) {
  std::int64_t n = 1;
  for (int d = 0; d < g.rank; ++d) n *= g.sizes[d];
  return n;
}

}  // namespace

void unary(UnaryOp op, const void* x, void* y, DType type, std::int64_t n, CudaStream stream) {
  if (n == 0) return;
  detail::dispatch_float(type, "unary op", [&](auto tag) {
    using T = decltype(tag);
    with_index(n, [&](auto index) {
      using Index = decltype(index);
      unary_kernel<T, Index><<<grid_for(n), kThreads, 0, stream>>>(
          op, static_cast<const T*>(x), static_cast<T*>(y), static_cast<Index>(n));
    });
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void binary(BinaryOp op, const BinaryOperands& v, void* out, DType type,
            const BroadcastGeometry& geometry, CudaStream stream) {
  const std::int64_t n = element_count(geometry);
  if (n == 0) return;
  detail::dispatch_float(type, "binary op", [&](auto tag) {
    using T = decltype(tag);
    with_index(n, [&](auto index) {
      using Index = decltype(index);
      binary_kernel<T, Index><<<grid_for(n), kThreads, 0, stream>>>(
          op, static_cast<const T*>(v.a), v.a_scalar, static_cast<const T*>(v.b), v.b_scalar,
          static_cast<T*>(out), static_cast<Index>(n), device_geometry<Index>(geometry));
    });
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void where(const void* cond, DType cond_type, const void* a, const void* b, void* out, DType type,
           const BroadcastGeometry& geometry, CudaStream stream) {
  const std::int64_t n = element_count(geometry);
  if (n == 0) return;
  auto launch = [&](auto cond_tag) {
    using C = decltype(cond_tag);
    detail::dispatch_float(type, "where", [&](auto tag) {
      using T = decltype(tag);
      with_index(n, [&](auto index) {
        using Index = decltype(index);
        where_kernel<C, T, Index><<<grid_for(n), kThreads, 0, stream>>>(
            static_cast<const C*>(cond), static_cast<const T*>(a), static_cast<const T*>(b),
            static_cast<T*>(out), static_cast<Index>(n), device_geometry<Index>(geometry));
      });
    });
  };
  if (cond_type == DType::u8)
    launch(std::uint8_t{});
  else
    detail::dispatch_float(cond_type, "where (condition)", launch);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
