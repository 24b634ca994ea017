// The per-row formulas of kernels/dim_reduce.h, shared by the CPU and CUDA
// kernels: a NaN-propagating max, and the softmax of one element given its
// row's max and f64 sum of exponentials.
#pragma once

#include <cmath>

#include "kernels/detail/philox_block.h"  // LOCKSTEP_HOST_DEVICE

namespace lockstep::kernels::detail {

// max(a, b) where a NaN on either side wins, so a row's max is NaN if any
// element is, in any reduction order.
LOCKSTEP_HOST_DEVICE float max_nan(float a, float b) { return a > b || a != a ? a : b; }

// softmax (or log_softmax) of x in a row of max m and sum_exp = sum exp(x_j - m).
LOCKSTEP_HOST_DEVICE float softmax_value(float x, float m, double sum_exp, bool log_softmax) {
  if (log_softmax) return static_cast<float>(static_cast<double>(x - m) - ::log(sum_exp));
  return static_cast<float>(static_cast<double>(expf(x - m)) / sum_exp);
}

}  // namespace lockstep::kernels::detail
