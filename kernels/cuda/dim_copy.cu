// CUDA row-block copies (kernels/dim_copy.h): one grid-stride kernel over the
// copied elements, moving whole elements as 1-, 2-, 4- or 8-byte words. (A
// cudaMemcpy2DAsync would do, but its pitches are capped by the device.)
#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/cuda/grid_index.cuh"
#include "kernels/dim_copy.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::first_index;
using detail::grid_stride;

template <typename Word, typename Index>
__global__ void copy_rows_kernel(const Word* src, Index src_stride, Word* dst, Index dst_stride,
                                 Index n, Index row_elems) {
  for (Index i = first_index<Index>(); i < n; i += grid_stride<Index>()) {
    const Index r = i / row_elems, j = i % row_elems;
    dst[r * dst_stride + j] = src[r * src_stride + j];
  }
}

}  // namespace

void copy_rows(const RowCopy& c, CudaStream stream) {
  const std::int64_t n = c.rows * c.row_elems;
  if (n == 0) return;
  // Offsets stay below (rows - 1) * stride + row_elems in either buffer, which
  // is at least n as both strides are at least row_elems.
  const std::int64_t reach =
      (c.rows - 1) * (c.src_stride > c.dst_stride ? c.src_stride : c.dst_stride) + c.row_elems;
  auto launch = [&](auto word) {
    using Word = decltype(word);
    detail::with_index(reach, [&](auto index) {
      using Index = decltype(index);
      copy_rows_kernel<Word, Index><<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
          static_cast<const Word*>(c.src), static_cast<Index>(c.src_stride),
          static_cast<Word*>(c.dst), static_cast<Index>(c.dst_stride), static_cast<Index>(n),
          static_cast<Index>(c.row_elems));
    });
  };
  detail::dispatch_word(c.element_bytes, launch);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
