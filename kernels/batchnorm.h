// BatchNorm over NCHW f32 buffers (per channel, over batch and spatial
// positions), with PyTorch's semantics: the batch is normalised with the
// biased variance, while the running variance moves towards the unbiased one:
// running = (1 - momentum) running + momentum batch_stat. save_rstd is
// 1 / sqrt(var + eps). Normalisation stays in f32 under autocast, so only f32.
// CPU: f64 sums. CUDA: cuDNN's legacy CUDNN_BATCHNORM_SPATIAL calls, whose
// running update is this one (Note [cuDNN batchnorm semantics] in the .cu).
#pragma once

#include <cstdint>

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

}  // namespace lockstep::kernels
