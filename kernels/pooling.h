// 2-D max and average pooling and global average pooling over NCHW (or NHWC,
// Note [channels-last pooling]) buffers of f32, f16 or bf16, computed in f32 and rounded once to
// the storage type, with PyTorch's semantics (floor output size, padding at most half the kernel).
// Our own kernels on both backends rather than cuDNN's, so that ties, NaN and
// the gradient's summation order are the same on CPU and CUDA (Note [max pool
// ties]) and every backward is a deterministic gather (no atomics).
//
// Note [max pool ties]: the forward scans a window row by row and takes an
// element when it is greater than the best so far or is NaN, as PyTorch does:
// among equal maxima the first in scan order wins (and gets the whole
// gradient); a window with NaN outputs NaN and routes its gradient to its last
// NaN. The chosen element's index in its input plane (ih * w + iw) is saved.
//
// Note [channels-last pooling]: with Pool2dShape::channels_last, x and dx are
// [batch, in_h, in_w, channels] and y, dy and argmax [batch, out_h, out_w,
// channels] (NHWC), and argmax still holds ih * w + iw. Each window is scanned
// in the same order and each gradient gathered in the same (oh, ow) order as
// in NCHW, so an NHWC result is the NCHW result transposed, bit for bit, on
// each backend. global_avg_pool_nhwc_* take x [batch, spatial, channels] and
// give y [batch, channels], each mean summed in f64 in spatial order as the
// plane form does: the same bits as global_avg_pool_* on the transposed data.
// The CPU transposes around its NCHW loops; CUDA has NHWC kernels whose
// threads run along the channels, so a warp reads consecutive channels.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

struct Pool2dShape {
  std::int64_t batch = 0, channels = 0, in_h = 0, in_w = 0;
  std::int64_t kernel_h = 1, kernel_w = 1;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  bool channels_last = false;  // NHWC buffers (Note [channels-last pooling])

  std::int64_t out_h() const { return (in_h + 2 * pad_h - kernel_h) / stride_h + 1; }
  std::int64_t out_w() const { return (in_w + 2 * pad_w - kernel_w) / stride_w + 1; }
};

// Throws InvalidArgument naming the field at fault (sizes, padding larger than
// half the kernel, a padded input smaller than the kernel).
void validate_pool2d(const Pool2dShape& s);
// Throws InvalidArgument for negative sizes or an empty plane (spatial < 1).
void validate_global_avg_pool_nhwc(std::int64_t batch, std::int64_t spatial, std::int64_t channels);

namespace cpu {
// argmax (i32, one per output; may be null in inference) per Note [max pool ties].
void max_pool2d_forward(const Pool2dShape& s, DType type, const void* x, void* y,
                        std::int32_t* argmax);
void max_pool2d_backward(const Pool2dShape& s, DType type, const void* dy,
                         const std::int32_t* argmax, void* dx);
// count_include_pad: divide by the whole window (PyTorch's default), else by
// the number of input elements in it.
void avg_pool2d_forward(const Pool2dShape& s, DType type, bool count_include_pad, const void* x,
                        void* y);
void avg_pool2d_backward(const Pool2dShape& s, DType type, bool count_include_pad, const void* dy,
                         void* dx);
// y[p] = mean of x[p, 0 .. spatial) for each of `planes` planes (f64 sums).
void global_avg_pool_forward(DType type, std::int64_t planes, std::int64_t spatial, const void* x,
                             void* y);
void global_avg_pool_backward(DType type, std::int64_t planes, std::int64_t spatial, const void* dy,
                              void* dx);
// y[n, c] = mean of x[n, 0 .. spatial), c] (Note [channels-last pooling]).
void global_avg_pool_nhwc_forward(DType type, std::int64_t batch, std::int64_t spatial,
                                  std::int64_t channels, const void* x, void* y);
// dx[n, i, c] = dy[n, c] / spatial.
void global_avg_pool_nhwc_backward(DType type, std::int64_t batch, std::int64_t spatial,
                                   std::int64_t channels, const void* dy, void* dx);
}  // namespace cpu

namespace cuda {
void max_pool2d_forward(const Pool2dShape& s, DType type, const void* x, void* y,
                        std::int32_t* argmax, CudaStream stream);
void max_pool2d_backward(const Pool2dShape& s, DType type, const void* dy,
                         const std::int32_t* argmax, void* dx, CudaStream stream);
void avg_pool2d_forward(const Pool2dShape& s, DType type, bool count_include_pad, const void* x,
                        void* y, CudaStream stream);
void avg_pool2d_backward(const Pool2dShape& s, DType type, bool count_include_pad, const void* dy,
                         void* dx, CudaStream stream);
void global_avg_pool_forward(DType type, std::int64_t planes, std::int64_t spatial, const void* x,
                             void* y, CudaStream stream);
void global_avg_pool_backward(DType type, std::int64_t planes, std::int64_t spatial, const void* dy,
                              void* dx, CudaStream stream);
void global_avg_pool_nhwc_forward(DType type, std::int64_t batch, std::int64_t spatial,
                                  std::int64_t channels, const void* x, void* y, CudaStream stream);
void global_avg_pool_nhwc_backward(DType type, std::int64_t batch, std::int64_t spatial,
                                   std::int64_t channels, const void* dy, void* dx,
                                   CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
