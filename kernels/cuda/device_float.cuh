// Device-side helpers shared by the CUDA kernels: f32 <-> storage conversion
// for the float DTypes, host-side dispatches from DType (or element size) to a
// C++ type, and the launch geometry every grid-stride kernel uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/dtype.h"
#include "kernels/error.h"

namespace lockstep::kernels::cuda::detail {

template <typename T>
__device__ __forceinline__ float to_f32(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls f(T{}) with the C++ type that stores a float DType.
template <typename F>
void dispatch_float(DType type, const char* op, F&& f) {
  switch (type) {
    case DType::f32:
      f(float{});
      return;
    case DType::f16:
      f(__half{});
      return;
    case DType::bf16:
      f(__nv_bfloat16{});
      return;
    default:
      break;
  }
  throw InvalidArgument(std::string(op) + ": dtype " + dtype_name(type) +
                        " is not supported (use f32, f16 or bf16)");
}

// Calls f(T{}) with the C++ type that stores any DType.
template <typename F>
void dispatch_any(DType type, F&& f) {
  switch (type) {
    case DType::i32:
      f(std::int32_t{});
      return;
    case DType::i64:
      f(std::int64_t{});
      return;
    case DType::u8:
      f(std::uint8_t{});
      return;
    default:
      dispatch_float(type, "dispatch", f);
      return;
  }
}

// Calls f(Word{}) with the unsigned integer type of `bytes` (1, 2, 4, else 8)
// bytes: for kernels that move elements without looking at their values.
template <typename F>
void dispatch_word(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      f(std::uint8_t{});
      return;
    case 2:
      f(std::uint16_t{});
      return;
    case 4:
      f(std::uint32_t{});
      return;
    default:
      f(std::uint64_t{});
      return;
  }
}

constexpr int kThreads = 256;

inline unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 8192 ? blocks : 8192);  // grid-stride beyond this
}

}  // namespace lockstep::kernels::cuda::detail
