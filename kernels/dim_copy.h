// Copies of row blocks between contiguous buffers, the kernel behind slicing
// and concatenation along a dimension: seen as [outer, dim, inner], a slice
// or one part of a concatenation is `rows` = outer runs of `row_elems`
// elements, at a fixed element stride in the source and in the destination.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/stream.h"

namespace lockstep::kernels {

struct RowCopy {
  const void* src = nullptr;
  std::int64_t src_stride = 0;  // elements between the starts of two source rows
  void* dst = nullptr;
  std::int64_t dst_stride = 0;
  std::int64_t rows = 0;
  std::int64_t row_elems = 0;
  std::size_t element_bytes = 4;  // 1, 2, 4 or 8: any DType
};

namespace cpu {
void copy_rows(const RowCopy& copy);
}  // namespace cpu

namespace cuda {
void copy_rows(const RowCopy& copy, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
