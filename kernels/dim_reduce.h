// Reductions and softmax along one dimension of a contiguous tensor, seen as
// [outer, dim, inner]: sum, mean and max to [outer, inner], softmax and
// log-softmax to [outer, dim, inner]. Float types; elements are read as f32,
// sums accumulate in f64 in a fixed order (so a given input always gives the
// same bits on a backend), and each result is rounded once to the storage type.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

// max propagates NaN (as torch.max); mean over an empty dim is NaN (0 / 0).
enum class DimReduce { sum, mean, max };

// The shape of a reduction: outer * dim * inner elements, contiguous.
struct DimExtent {
  std::int64_t outer = 1;
  std::int64_t dim = 1;
  std::int64_t inner = 1;
};

namespace cpu {
void reduce_dim(DimReduce op, const void* x, void* out, DType type, const DimExtent& extent);
// y = softmax(x) along dim, or log_softmax(x) when `log`; y has x's shape.
void softmax_dim(const void* x, void* y, DType type, const DimExtent& extent, bool log);
}  // namespace cpu

namespace cuda {
void reduce_dim(DimReduce op, const void* x, void* out, DType type, const DimExtent& extent,
                CudaStream stream);
void softmax_dim(const void* x, void* y, DType type, const DimExtent& extent, bool log,
                 CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
