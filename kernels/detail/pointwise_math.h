// The pointwise formulas of kernels/pointwise.h, shared by the CPU and CUDA
// kernels so that both evaluate the same f32 expressions. NaN propagates as in
// PyTorch's torch.* functions: relu, maximum and minimum of a NaN give NaN.
#pragma once

#include <cmath>

#include "kernels/detail/philox_block.h"  // LOCKSTEP_HOST_DEVICE
#include "kernels/pointwise.h"

namespace lockstep::kernels::detail {

LOCKSTEP_HOST_DEVICE float unary_value(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::exp:
      return expf(x);
    case UnaryOp::log:
      return logf(x);
    case UnaryOp::sigmoid:
      return 1.0f / (1.0f + expf(-x));  // exp overflow gives 1 / inf = 0, the limit
    case UnaryOp::tanh:
      return tanhf(x);
    case UnaryOp::relu:
      return x > 0.0f || x != x ? x : 0.0f;
    case UnaryOp::abs:
      return fabsf(x);
    case UnaryOp::sqrt:
      return sqrtf(x);
    case UnaryOp::neg:
      return -x;
  }
  return 0.0f;
}

LOCKSTEP_HOST_DEVICE float binary_value(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::add:
      return a + b;
    case BinaryOp::sub:
      return a - b;
    case BinaryOp::mul:
      return a * b;
    case BinaryOp::div:
      return a / b;
    case BinaryOp::maximum:
      return a > b || a != a ? a : b;  // a NaN b falls to b
    case BinaryOp::minimum:
      return a < b || a != a ? a : b;
  }
  return 0.0f;
}

}  // namespace lockstep::kernels::detail
