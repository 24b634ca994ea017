// BatchNorm over NCHW f32 buffers (per channel, over batch and spatial
// positions), with PyTorch's semantics: the batch is normalised with the
// biased variance, while the running variance moves towards the unbiased one:
// running = (1 - momentum) running + momentum batch_stat. save_rstd is
// 1 / sqrt(var + eps). Normalisation stays in f32 under autocast, so only f32.
// CPU: f64 sums. CUDA: cuDNN's legacy CUDNN_BATCHNORM_SPATIAL calls, whose
// running update is this one (Note [cuDNN batchnorm semantics] in the .cu).
// The fused calls below also take f16 and bf16 data, with a ReLU or a
// residual add + ReLU after the normalisation (Note [fused batchnorm]).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

struct BatchNormShape {
  std::int64_t batch = 0, channels = 0, spatial = 0;  // spatial: h * w
  double eps = 1e-5;
};

// Throws InvalidArgument for non-positive sizes or eps, or, in training, a
// channel with a single value (its unbiased variance is undefined).
void validate_batchnorm(const BatchNormShape& s, bool training);

// Buffers live on the backend's device: x, y, dy and dx hold batch * channels
// * spatial values, the others one per channel. None may be null, except that
// running_mean and running_var are both null when no running statistics are
// kept. dweight and dbias accumulate (+=).
namespace cpu {
void batchnorm_forward_training(const BatchNormShape& s, const float* x, const float* weight,
                                const float* bias, float* y, float* save_mean, float* save_rstd,
                                double momentum, float* running_mean, float* running_var);
void batchnorm_forward_inference(const BatchNormShape& s, const float* x, const float* weight,
                                 const float* bias, const float* running_mean,
                                 const float* running_var, float* y);
void batchnorm_backward(const BatchNormShape& s, const float* x, const float* dy,
                        const float* weight, const float* save_mean, const float* save_rstd,
                        float* dx, float* dweight, float* dbias);
// num_batches_tracked += 1.
void count_batch(std::int64_t* num_batches_tracked);
}  // namespace cpu

namespace cuda {
void batchnorm_forward_training(const BatchNormShape& s, const float* x, const float* weight,
                                const float* bias, float* y, float* save_mean, float* save_rstd,
                                double momentum, float* running_mean, float* running_var,
                                CudaStream stream);
void batchnorm_forward_inference(const BatchNormShape& s, const float* x, const float* weight,
                                 const float* bias, const float* running_mean,
                                 const float* running_var, float* y, CudaStream stream);
void batchnorm_backward(const BatchNormShape& s, const float* x, const float* dy,
                        const float* weight, const float* save_mean, const float* save_rstd,
                        float* dx, float* dweight, float* dbias, CudaStream stream);
void count_batch(std::int64_t* num_batches_tracked, CudaStream stream);
}  // namespace cuda

// Note [fused batchnorm]: BatchNorm with an epilogue, on data of `type` (f32,
// f16 or bf16) in NCHW, with f32 weight, bias, running and saved statistics
// (as PyTorch AMP keeps them):
//   none:     y = bn(x)
//   relu:     y = relu(bn(x))
//   add_relu: y = relu(bn(x) + identity)     (the end of a residual block)
// Backward takes forward's x and y (y for the ReLU's mask: y > 0), masks dy by
// it, writes d_identity = the masked dy (add_relu only; null skips it) and dx
// (the BN backward of the masked dy). dweight and dbias accumulate; null skips
// one. The CPU twin composes the unfused f32 ops in their engine order (cast
// to f32, batchnorm_*, add, relu, cast back once), so for f32 it has their
// bits. CUDA: own kernels, per-channel sums in f64 over fixed row ranges
// combined in a fixed order, no atomics: deterministic, and one read of x for
// the statistics plus one read and one write for y (Note [batchnorm passes] in
// the .cu). Sizes up to 2^31 - 1 elements. An NHWC activation [N, H, W, C]
// is BatchNormShape{N * H * W, C, 1}: with spatial == 1 the CUDA calls take
// kernels whose threads run along the channels (Note [channels-last
// batchnorm] in the .cu), the same arithmetic on each value.
enum class BatchNormEpilogue { none, relu, add_relu };

// Per-channel partial sums the CUDA calls split each channel's rows into, at
// most one per batch row. spatial > 1: about 1024 blocks in all. spatial == 1
// (channels-last, Note [channels-last batchnorm] in cuda/batchnorm_rows.cu): a block sums up
// to 128 channels at once, so 131072 / channels splits, at most 1024 (resnet50
// at batch 256: 1024 splits of 784 rows at 56x56x64, 64 of 196 at 7x7x2048).
inline std::int64_t batchnorm_row_splits(const BatchNormShape& s) {
  std::int64_t want = (1024 + s.channels - 1) / s.channels;
  if (s.spatial == 1) {
    want = (131072 + s.channels - 1) / s.channels;
    if (want > 1024) want = 1024;
  }
  return want < s.batch ? want : s.batch;
}
// Device scratch the CUDA fused calls need: two f64 partial sums per split
// and channel, then four f32 coefficients per channel (at most 16 KiB per
// channel, 1 MiB at 64 channels).
inline std::size_t batchnorm_fused_workspace_bytes(const BatchNormShape& s) {
  return static_cast<std::size_t>(16 * s.channels * batchnorm_row_splits(s) + 16 * s.channels);
}

namespace cpu {
void batchnorm_fused_forward_training(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                      const void* x, const void* identity, const float* weight,
                                      const float* bias, void* y, float* save_mean,
                                      float* save_rstd, double momentum, float* running_mean,
                                      float* running_var);
void batchnorm_fused_forward_inference(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                       const void* x, const void* identity, const float* weight,
                                       const float* bias, const float* running_mean,
                                       const float* running_var, void* y);
void batchnorm_fused_backward(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                              const void* x, const void* y, const void* dy, const float* weight,
                              const float* save_mean, const float* save_rstd, void* dx,
                              void* d_identity, float* dweight, float* dbias);
}  // namespace cpu

namespace cuda {
// `workspace`: batchnorm_fused_workspace_bytes(s) on the device.
void batchnorm_fused_forward_training(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                      const void* x, const void* identity, const float* weight,
                                      const float* bias, void* y, float* save_mean,
                                      float* save_rstd, double momentum, float* running_mean,
                                      float* running_var, void* workspace, CudaStream stream);
void batchnorm_fused_forward_inference(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                       const void* x, const void* identity, const float* weight,
                                       const float* bias, const float* running_mean,
                                       const float* running_var, void* y, void* workspace,
                                       CudaStream stream);
void batchnorm_fused_backward(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                              const void* x, const void* y, const void* dy, const float* weight,
                              const float* save_mean, const float* save_rstd, void* dx,
                              void* d_identity, float* dweight, float* dbias, void* workspace,
                              CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
