// 2-D convolution (NCHW, or NHWC activations by Conv2dShape::channels_last;
// PyTorch's cross-correlation, weight [out, in/groups, kh, kw] either way)
// with stride, padding, dilation and groups, in f32, f16 or bf16 with f32
// accumulation; each pass's result is rounded to the type once, so the CPU
// emulates what cuDNN does under autocast. CPU: im2col + OpenBLAS GEMM, col2im
// for the input gradient. CUDA: cuDNN's legacy API, with algorithms chosen once
// per shape by timing (cudnnFind*Ex) outside deterministic runs and by its
// heuristics in them (Note [conv algorithm choice] in the .cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

struct Conv2dShape {
  std::int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  std::int64_t out_channels = 0, kernel_h = 1, kernel_w = 1;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  std::int64_t dilation_h = 1, dilation_w = 1;
  std::int64_t groups = 1;
  // x, y, dx and dy in NHWC ([batch, h, w, channels]) instead of NCHW; the
  // weight and its gradient keep [out, in/groups, kh, kw] (Note
  // [channels-last convolution] in kernels/cuda/conv.cu). Results equal the
  // NCHW ones transposed: bit for bit on the CPU, which transposes around its
  // NCHW path; on CUDA, cuDNN runs NHWC kernels (tensor cores for 16-bit types).
  bool channels_last = false;

  std::int64_t out_h() const {
    return (in_h + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h + 1;
  }
  std::int64_t out_w() const {
    return (in_w + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1;
  }
};

// Throws InvalidArgument naming the field at fault: non-positive sizes,
// channels not divisible by groups, a padded input smaller than the dilated
// kernel, or sizes past cuDNN's int range.
void validate_conv2d(const Conv2dShape& s);

// How CUDA chooses convolution algorithms; process-wide, read when a shape is
// first planned (each setting keeps its own plans). The CPU has one algorithm.
// deterministic: only algorithms cuDNN marks deterministic (bitwise equal
// results run to run), chosen by the heuristic, never timed.
// set_conv_autotune: whether new plans time the candidates (cudnnFind*Ex on
// pool memory, once per shape) instead of taking the heuristic's choice; on
// by default (bench_step --no-conv-timing turns it off). conv_autotune():
// whether new plans are timed now, that is the setting and not
// deterministic(): deterministic runs never time, whatever the setting.
void set_deterministic(bool on);
bool deterministic();
void set_conv_autotune(bool on);
bool conv_autotune();

namespace cpu {
// y [batch, out, oh, ow] = conv(x [batch, in, h, w], w) + bias, all in `type`
// but the bias (f32, one per output channel, may be null). The bias is added
// to the rounded convolution and the sum rounded again, as CUDA does.
void conv2d_forward(const Conv2dShape& s, DType type, const void* x, const void* w,
                    const float* bias, void* y);
// dx = the input gradient for dy, in `type`.
void conv2d_backward_data(const Conv2dShape& s, DType type, const void* dy, const void* w,
                          void* dx);
// dw (f32) += the weight gradient (accumulate), or dw = it (not accumulate:
// bit for bit what zeroing dw and accumulating gives, without the zeroing
// pass); for 16-bit types the batch's gradient is rounded to `type` once
// before it is added, as the CUDA path does.
void conv2d_backward_filter(const Conv2dShape& s, DType type, const void* x, const void* dy,
                            float* dw, bool accumulate);
// The bias gradient: db[c] += the sum of dy[:, c, :], accumulated in f64.
void channel_bias_grad(const void* dy, DType type, std::int64_t batch, std::int64_t channels,
                       std::int64_t spatial, float* db);
// The same for an NHWC dy ([batch, spatial, channels]): db[c] += the sum of
// dy[:, :, c], in channel_bias_grad's order of f64 adds, so it gives the bits
// that channel_bias_grad gives on the NCHW transpose of dy.
void channel_bias_grad_nhwc(const void* dy, DType type, std::int64_t batch, std::int64_t spatial,
                            std::int64_t channels, float* db);
}  // namespace cpu

namespace cuda {
enum class ConvPass { forward, backward_data, backward_filter };
// Workspace bytes the caller provides to the pass: cuDNN's, plus room for the
// 16-bit weight gradient in backward_filter, plus, channels-last, the weight
// (or its gradient) in cuDNN's KRSC order. Plans the shape if needed, timed
// on `stream` (pass the one the pass will run on; never while it is being
// captured into a CUDA graph, when the plan takes the heuristic's choice).
std::size_t conv2d_workspace_bytes(const Conv2dShape& s, DType type, ConvPass pass,
                                   CudaStream stream = nullptr);
void conv2d_forward(const Conv2dShape& s, DType type, const void* x, const void* w,
                    const float* bias, void* y, void* workspace, std::size_t workspace_bytes,
                    CudaStream stream);
void conv2d_backward_data(const Conv2dShape& s, DType type, const void* dy, const void* w, void* dx,
                          void* workspace, std::size_t workspace_bytes, CudaStream stream);
void conv2d_backward_filter(const Conv2dShape& s, DType type, const void* x, const void* dy,
                            float* dw, bool accumulate, void* workspace,
                            std::size_t workspace_bytes, CudaStream stream);
void channel_bias_grad(const void* dy, DType type, std::int64_t batch, std::int64_t channels,
                       std::int64_t spatial, float* db, CudaStream stream);
// NHWC: the deterministic column sum of the [batch * spatial, channels]
// matrix (kernels/bias.h's bias_grad: coalesced, f64 chunks added in a fixed
// order, Note [column chunks]); it differs from the CPU's f64 order only in
// f64 rounding before the one rounding to f32. `workspace`:
// channel_bias_grad_nhwc_workspace_bytes() bytes of device memory.
std::size_t channel_bias_grad_nhwc_workspace_bytes(std::int64_t batch, std::int64_t spatial,
                                                   std::int64_t channels);
void channel_bias_grad_nhwc(const void* dy, DType type, std::int64_t batch, std::int64_t spatial,
                            std::int64_t channels, float* db, void* workspace, CudaStream stream);
// What the plan cache holds, one line per plan: device, pass, shape and type,
// the algorithm, how it was chosen ("timed #0 of 8: 0.0412 ms" or "heuristic
// #0 of 8 (deterministic)"), its workspace and math type; the layout
// ("NHWC") where channels-last.
std::vector<std::string> conv2d_plan_descriptions();
}  // namespace cuda

}  // namespace lockstep::kernels
