// CUDA elementwise ops (kernels/elementwise.h): grid-stride kernels computing
// in f32, with the same conversion rules as the CPU versions.
#include <cstring>
#include <cuda/std/limits>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/elementwise.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::from_f32;
using detail::grid_for;
using detail::kThreads;
using detail::to_f32;

template <typename Int>
__device__ Int saturate_to(double v) {
  if (isnan(v)) return 0;
  const double lo = static_cast<double>(::cuda::std::numeric_limits<Int>::min());
  const double hi = static_cast<double>(::cuda::std::numeric_limits<Int>::max());
  if (v <= lo) return ::cuda::std::numeric_limits<Int>::min();
  if (v >= hi) return ::cuda::std::numeric_limits<Int>::max();
  return static_cast<Int>(v);
}

// The conversion rules of elementwise.h, element by element.
template <typename Dst, typename Src>
__device__ Dst convert(Src v) {
  constexpr bool src_int = std::is_integral_v<Src>, dst_int = std::is_integral_v<Dst>;
  if constexpr (src_int && dst_int) {
    return static_cast<Dst>(static_cast<std::int64_t>(v));
  } else if constexpr (src_int) {
    return from_f32<Dst>(static_cast<float>(static_cast<double>(v)));
  } else if constexpr (dst_int) {
    return saturate_to<Dst>(static_cast<double>(to_f32(v)));
  } else {
    return from_f32<Dst>(to_f32(v));
  }
}

template <typename Word>
__global__ void fill_kernel(Word* dst, std::int64_t n, Word pattern) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    dst[i] = pattern;
}

template <typename Src, typename Dst>
__global__ void cast_kernel(const Src* src, Dst* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    dst[i] = convert<Dst>(src[i]);
}

enum class Binary { add, mul, axpy };

template <typename T, Binary op>
__global__ void binary_kernel(const T* a, const T* b, T* out, std::int64_t n, float alpha) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float x = to_f32(a[i]), y = to_f32(b[i]);
    float r;
    if constexpr (op == Binary::add)
      r = x + y;
    else if constexpr (op == Binary::mul)
      r = x * y;
    else
      r = fmaf(alpha, x, y);
    out[i] = from_f32<T>(r);
  }
}

template <typename T>
__global__ void scale_kernel(T* x, std::int64_t n, float alpha) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    x[i] = from_f32<T>(alpha * to_f32(x[i]));
}

template <Binary op>
void launch_binary(const void* a, const void* b, void* out, DType type, std::int64_t n, float alpha,
                   CudaStream stream, const char* name) {
  detail::dispatch_float(type, name, [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return;
    binary_kernel<T, op><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, alpha);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace

void fill(void* dst, DType type, std::int64_t n, double value, CudaStream stream) {
  if (n == 0) return;
  // The element's bytes come from the CPU rules, so both backends store the same.
  std::uint64_t pattern = 0;
  cpu::fill(&pattern, type, 1, value);
  auto launch = [&](auto word) {
    using Word = decltype(word);
    Word w;
    std::memcpy(&w, &pattern, sizeof w);
    fill_kernel<Word><<<grid_for(n), kThreads, 0, stream>>>(static_cast<Word*>(dst), n, w);
  };
  detail::dispatch_word(dtype_size(type), launch);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void cast(const void* src, DType src_type, void* dst, DType dst_type, std::int64_t n,
          CudaStream stream) {
  if (n == 0) return;
  if (src_type == dst_type) {
    LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(dst, src,
                                        static_cast<std::size_t>(n) * dtype_size(src_type),
                                        cudaMemcpyDeviceToDevice, stream));
    return;
  }
  detail::dispatch_any(src_type, [&](auto src_tag) {
    detail::dispatch_any(dst_type, [&](auto dst_tag) {
      using Src = decltype(src_tag);
      using Dst = decltype(dst_tag);
      cast_kernel<Src, Dst><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const Src*>(src),
                                                                  static_cast<Dst*>(dst), n);
    });
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void add(const void* a, const void* b, void* out, DType type, std::int64_t n, CudaStream stream) {
  launch_binary<Binary::add>(a, b, out, type, n, 1.0f, stream, "add");
}

void mul(const void* a, const void* b, void* out, DType type, std::int64_t n, CudaStream stream) {
  launch_binary<Binary::mul>(a, b, out, type, n, 1.0f, stream, "mul");
}

void axpy(float alpha, const void* x, void* y, DType type, std::int64_t n, CudaStream stream) {
  launch_binary<Binary::axpy>(x, y, y, type, n, alpha, stream, "axpy");
}

void scale(void* x, DType type, std::int64_t n, float alpha, CudaStream stream) {
  detail::dispatch_float(type, "scale", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return;
    scale_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(x), n, alpha);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace lockstep::kernels::cuda
