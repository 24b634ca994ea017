// Pointwise ops for custom layers on raw buffers of one float type, computed
// in f32 and rounded once to the storage type: unary math (exp, log, sigmoid,
// ...), binary arithmetic with NumPy broadcasting described by strides, and a
// select `where`. engine/core/tensor_ops.h checks shapes and builds the geometry.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

enum class UnaryOp { exp, log, sigmoid, tanh, relu, abs, sqrt, neg };
enum class BinaryOp { add, sub, mul, div, maximum, minimum };

// Note [broadcast geometry]: the output is a contiguous array of sizes[0..rank)
// (outermost first); operand k reads element sum_d coord[d] * strides[k][d], so
// a broadcast dimension has stride 0. Callers merge dimensions first, so equal
// shapes arrive as rank 1 with stride 1 and the kernels stay cheap.
constexpr int kMaxBroadcastDims = 8;
struct BroadcastGeometry {
  int rank = 0;  // 0: one element
  std::int64_t sizes[kMaxBroadcastDims] = {};
  std::int64_t strides[3][kMaxBroadcastDims] = {};  // a, b, and where's condition
};

// A binary op's operands: a null pointer means "the scalar beside it" (x + 1).
struct BinaryOperands {
  const void* a = nullptr;
  float a_scalar = 0.0f;
  const void* b = nullptr;
  float b_scalar = 0.0f;
};

namespace cpu {
void unary(UnaryOp op, const void* x, void* y, DType type, std::int64_t n);
void binary(BinaryOp op, const BinaryOperands& operands, void* out, DType type,
            const BroadcastGeometry& geometry);
// out = cond != 0 ? a : b; cond is u8 or a float type (operand 2 of the geometry).
void where(const void* cond, DType cond_type, const void* a, const void* b, void* out, DType type,
           const BroadcastGeometry& geometry);
}  // namespace cpu

namespace cuda {
void unary(UnaryOp op, const void* x, void* y, DType type, std::int64_t n, CudaStream stream);
void binary(BinaryOp op, const BinaryOperands& operands, void* out, DType type,
            const BroadcastGeometry& geometry, CudaStream stream);
void where(const void* cond, DType cond_type, const void* a, const void* b, void* out, DType type,
           const BroadcastGeometry& geometry, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
