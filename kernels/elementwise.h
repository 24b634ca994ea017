// Elementwise ops on raw contiguous buffers of n elements. Arithmetic (add,
// mul, scale, axpy) is on the float types and computed in f32, rounded to the
// storage type once per element; fill and cast cover every DType.
// Float to integer casts truncate toward zero, saturate at the integer range
// and send NaN to 0, the same on CPU and CUDA.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

namespace cpu {
void fill(void* dst, DType type, std::int64_t n, double value);
void cast(const void* src, DType src_type, void* dst, DType dst_type, std::int64_t n);
void add(const void* a, const void* b, void* out, DType type, std::int64_t n);  // out = a + b
void mul(const void* a, const void* b, void* out, DType type, std::int64_t n);  // out = a * b
void scale(void* x, DType type, std::int64_t n, float alpha);                   // x *= alpha
void axpy(float alpha, const void* x, void* y, DType type, std::int64_t n);     // y += alpha x
}  // namespace cpu

namespace cuda {
void fill(void* dst, DType type, std::int64_t n, double value, CudaStream stream);
void cast(const void* src, DType src_type, void* dst, DType dst_type, std::int64_t n,
          CudaStream stream);
void add(const void* a, const void* b, void* out, DType type, std::int64_t n, CudaStream stream);
void mul(const void* a, const void* b, void* out, DType type, std::int64_t n, CudaStream stream);
void scale(void* x, DType type, std::int64_t n, float alpha, CudaStream stream);
void axpy(float alpha, const void* x, void* y, DType type, std::int64_t n, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
