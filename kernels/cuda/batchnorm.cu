// CUDA BatchNorm (kernels/batchnorm.h) on cuDNN's legacy CUDNN_BATCHNORM_SPATIAL
// calls, with x viewed as [batch, channels, spatial, 1].
//
// Note [cuDNN batchnorm semantics]: cuDNN's exponentialAverageFactor is
// PyTorch's momentum (running = factor * batch + (1 - factor) * running),
// its running variance moves towards the sample (unbiased, n / (n - 1))
// variance while the batch is normalised with the biased one, and its
// "resultSaveInvVariance" is in fact 1 / sqrt(var + eps): all as PyTorch, so
// the values pass straight through. The [gpu] tests hold the running
// statistics to the CPU's (PyTorch's formula) after two steps.
#include <memory>
#include <type_traits>

#include "kernels/batchnorm.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/check_cudnn.h"
#include "kernels/cuda/cudnn_handle.h"

namespace lockstep::kernels::cuda {
namespace {

using TensorDesc = std::unique_ptr<std::remove_pointer_t<cudnnTensorDescriptor_t>,
                                   decltype(&cudnnDestroyTensorDescriptor)>;

TensorDesc make_desc() {
  cudnnTensorDescriptor_t d = nullptr;
  LOCKSTEP_CHECK_CUDNN(cudnnCreateTensorDescriptor(&d));
  return TensorDesc(d, cudnnDestroyTensorDescriptor);
}

// The data descriptor and the per-channel one cuDNN derives from it.
struct Descriptors {
  TensorDesc x = make_desc();
  TensorDesc channel = make_desc();
  explicit Descriptors(const BatchNormShape& s) {
    LOCKSTEP_CHECK_CUDNN(cudnnSetTensor4dDescriptor(
        x.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(s.batch),
        static_cast<int>(s.channels), static_cast<int>(s.spatial), 1));
    LOCKSTEP_CHECK_CUDNN(
        cudnnDeriveBNTensorDescriptor(channel.get(), x.get(), CUDNN_BATCHNORM_SPATIAL));
  }
};

void validate_for_cudnn(const BatchNormShape& s, bool training) {
  validate_batchnorm(s, training);
  if (s.batch * s.channels * s.spatial > 0x7fffffff)
    throw InvalidArgument("batchnorm: " + std::to_string(s.batch * s.channels * s.spatial) +
                          " elements exceed cuDNN's 2^31 - 1 (split the batch)");
}

__global__ void count_batch_kernel(std::int64_t* counter) { ++*counter; }

}  // namespace

void batchnorm_forward_training(const BatchNormShape& s, const float* x, const float* weight,
                                const float* bias, float* y, float* save_mean, float* save_rstd,
                                double momentum, float* running_mean, float* running_var,
                                CudaStream stream) {
  validate_for_cudnn(s, true);
  const Descriptors d(s);
  const float one = 1.0f, zero = 0.0f;
  LOCKSTEP_CHECK_CUDNN(cudnnBatchNormalizationForwardTraining(
      detail::cudnn_handle(stream), CUDNN_BATCHNORM_SPATIAL, &one, &zero, d.x.get(), x, d.x.get(),
      y, d.channel.get(), weight, bias, momentum, running_mean, running_var, s.eps, save_mean,
      save_rstd));
}

void batchnorm_forward_inference(const BatchNormShape& s, const float* x, const float* weight,
                                 const float* bias, const float* running_mean,
                                 const float* running_var, float* y, CudaStream stream) {
  validate_for_cudnn(s, false);
  const Descriptors d(s);
  const float one = 1.0f, zero = 0.0f;
  LOCKSTEP_CHECK_CUDNN(cudnnBatchNormalizationForwardInference(
      detail::cudnn_handle(stream), CUDNN_BATCHNORM_SPATIAL, &one, &zero, d.x.get(), x, d.x.get(),
      y, d.channel.get(), weight, bias, running_mean, running_var, s.eps));
}

void batchnorm_backward(const BatchNormShape& s, const float* x, const float* dy,
                        const float* weight, const float* save_mean, const float* save_rstd,
                        float* dx, float* dweight, float* dbias, CudaStream stream) {
  validate_for_cudnn(s, true);
  const Descriptors d(s);
  // alpha/beta for dx (overwrite), then for dweight and dbias (accumulate).
  const float one = 1.0f, zero = 0.0f;
  LOCKSTEP_CHECK_CUDNN(cudnnBatchNormalizationBackward(
      detail::cudnn_handle(stream), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &one, d.x.get(), x,
      d.x.get(), dy, d.x.get(), dx, d.channel.get(), weight, dweight, dbias, s.eps, save_mean,
      save_rstd));
}

void count_batch(std::int64_t* num_batches_tracked, CudaStream stream) {
  count_batch_kernel<<<1, 1, 0, stream>>>(num_batches_tracked);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
