// Argument checks shared by the custom-layer ops (tensor_ops.cpp, dim_ops.cpp):
// each throws InvalidArgument naming the op, the values and the fix.
#pragma once

#include <string>

#include "engine/core/tensor.h"

namespace lockstep::core::detail {

inline void require_defined(const char* op, const Tensor& x, const char* name) {
  if (!x.defined())
    throw InvalidArgument(std::string(op) + ": " + name +
                          " is an undefined tensor (create it with Tensor::empty or an op)");
}

inline void require_float_dtype(const char* op, const Tensor& x) {
  require_defined(op, x, "the input");
  if (!is_floating(x.dtype()))
    throw InvalidArgument(std::string(op) + ": dtype " + dtype_name(x.dtype()) + " of " +
                          shape_str(x.shape()) +
                          " is not a float type (cast it to f32, f16 or bf16 first)");
}

inline void require_same_device(const char* op, const Tensor& a, const Tensor& b) {
  if (!(a.device() == b.device()))
    throw InvalidArgument(std::string(op) + ": " + shape_str(a.shape()) + " on " +
                          a.device().str() + " and " + shape_str(b.shape()) + " on " +
                          b.device().str() + " (move one with .to())");
}

// `dim` in [-rank, rank) as an index in [0, rank).
inline int normalize_dim(const char* op, const Tensor& x, int dim) {
  const int rank = static_cast<int>(x.shape().size());
  if (rank == 0 || dim < -rank || dim >= rank)
    throw InvalidArgument(
        std::string(op) + ": dim " + std::to_string(dim) +
        " is out of range for a tensor of shape " + shape_str(x.shape()) +
        (rank == 0 ? std::string(" (reshape a scalar to [1] first)")
                   : " (use " + std::to_string(-rank) + " to " + std::to_string(rank - 1) + ")"));
  return dim < 0 ? dim + rank : dim;
}

}  // namespace lockstep::core::detail
