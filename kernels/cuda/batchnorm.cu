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
//
// The fused calls (Note [fused batchnorm] in the header) are this file's own
// kernels instead, for three reasons: they take f16/bf16 data (the legacy
// calls would too, but their fused BN+ReLU / BN+add+ReLU modes need NHWC and
// SPATIAL_PERSISTENT, and are deprecated); the epilogue costs no pass of its
// own; and their sums are deterministic by construction (fixed row ranges,
// fixed-order trees, no atomics), where cuDNN documents no such promise for
// its backward. Note [batchnorm passes]: forward training reads x twice (the
// f64 sums, then the normalisation) and writes y once; backward reads x, y
// and dy twice (the f64 sums of dy and dy (x - mean), then dx) and writes dx
// (and d_identity). Sums are of x - x[channel's first value], so that a mean
// far from zero costs no precision in sum(x^2) - sum(x)^2 / n. Channels-last
// data (spatial == 1) has kernels of its own, in batchnorm_rows.cu: Note
// [channels-last batchnorm]; the helpers both share are in batchnorm_detail.cuh.
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "kernels/batchnorm.h"
#include "kernels/cuda/batchnorm_detail.cuh"
#include "kernels/cuda/block_reduce.cuh"
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
    throw InvalidArgument(
        "batchnorm: " + std::to_string(s.batch * s.channels * s.spatial) +
        " elements exceed 2^31 - 1, the 32-bit indexing of cuDNN's calls and of the "
        "fused kernels (split the batch)");
}

__global__ void count_batch_kernel(std::int64_t* counter) { ++*counter; }

using detail::dispatch_epilogue;
using detail::finish_grads;
using detail::finish_stats;
using detail::input_grad;
using detail::kThreads;
using detail::normalised;
using detail::Pack;
using detail::packs_fit;
using detail::to_f32;

// The rows [first, end) of batch that block `b` of a partial-sum kernel sums
// for channel b / splits (Note [batchnorm passes]): every value has one block.
struct RowRange {
  std::uint32_t channel, first, end;
  __device__ RowRange(const BatchNormShape& s, std::int64_t splits) {
    const std::int64_t k = blockIdx.x % splits;
    channel = static_cast<std::uint32_t>(blockIdx.x / splits);
    first = static_cast<std::uint32_t>(k * s.batch / splits);
    end = static_cast<std::uint32_t>((k + 1) * s.batch / splits);
  }
};

// partial[2 b], partial[2 b + 1]: sum(x - pilot), sum((x - pilot)^2) over
// block b's rows, pilot being the channel's first value.
template <typename T>
__global__ void stats_partial_kernel(BatchNormShape s, std::int64_t splits, const T* x,
                                     double* partial) {
  __shared__ double lanes[kThreads];
  const RowRange r(s, splits);
  const auto spatial = static_cast<std::uint32_t>(s.spatial);
  const auto channels = static_cast<std::uint32_t>(s.channels);
  const double pilot = to_f32(x[r.channel * spatial]);
  const std::uint32_t values = (r.end - r.first) * spatial;
  double sum = 0.0, squares = 0.0;
#pragma unroll 4  // later iterations' loads in flight; the order of the sums is unchanged
  for (std::uint32_t j = threadIdx.x; j < values; j += kThreads) {
    const std::uint32_t n = r.first + j / spatial;
    const double d = to_f32(x[(n * channels + r.channel) * spatial + j % spatial]) - pilot;
    sum += d;
    squares += d * d;
  }
  sum = detail::block_sum(sum, lanes);
  squares = detail::block_sum(squares, lanes);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = sum;
    partial[2 * blockIdx.x + 1] = squares;
  }
}

// One thread per channel: the splits' sums in order, then finish_stats.
template <typename T>
__global__ void stats_finalize_kernel(BatchNormShape s, std::int64_t splits, const double* partial,
                                      const T* x, const float* weight, const float* bias,
                                      float* save_mean, float* save_rstd, double momentum,
                                      float* running_mean, float* running_var, float4* coef) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= s.channels) return;
  double sum = 0.0, squares = 0.0;
  for (std::int64_t k = 0; k < splits; ++k) {
    sum += partial[2 * (c * splits + k)];
    squares += partial[2 * (c * splits + k) + 1];
  }
  finish_stats(s, c, sum, squares, to_f32(x[c * s.spatial]), weight, bias, save_mean, save_rstd,
               momentum, running_mean, running_var, coef);
}

__global__ void inference_coef_kernel(BatchNormShape s, const float* weight, const float* bias,
                                      const float* running_mean, const float* running_var,
                                      float4* coef) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= s.channels) return;
  const double rstd = 1.0 / sqrt(static_cast<double>(running_var[c]) + s.eps);
  coef[c] = make_float4(running_mean[c], static_cast<float>(weight[c] * rstd), bias[c], 0.0f);
}

// y = epilogue((x - mean) scale + bias), in f32, rounded once.
template <typename T, int V, BatchNormEpilogue E>
__global__ void apply_kernel(std::uint32_t packs, std::uint32_t row_packs, std::uint32_t channels,
                             const Pack<T, V>* x, const Pack<T, V>* identity, const float4* coef,
                             Pack<T, V>* y) {
  for (std::uint32_t p = blockIdx.x * blockDim.x + threadIdx.x; p < packs;
       p += gridDim.x * blockDim.x) {
    const float4 k = coef[(p / row_packs) % channels];
    const Pack<T, V> in = x[p];
    const Pack<T, V> id = E == BatchNormEpilogue::add_relu ? identity[p] : in;
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e)
      out.v[e] = detail::from_f32<T>(normalised<E>(to_f32(in.v[e]), k, to_f32(id.v[e])));
    y[p] = out;
  }
}

// dy masked by the ReLU's output (y > 0), or dy itself without one.
template <typename T, BatchNormEpilogue E>
__device__ __forceinline__ float masked_grad(const T* dy, const T* y, std::uint32_t i) {
  const float g = to_f32(dy[i]);
  if (E == BatchNormEpilogue::none) return g;
  return to_f32(y[i]) > 0.0f ? g : 0.0f;
}

// partial[2 b], partial[2 b + 1]: sum(g), sum(g (x - mean)) over block b's rows.
template <typename T, BatchNormEpilogue E>
__global__ void grad_partial_kernel(BatchNormShape s, std::int64_t splits, const T* x, const T* y,
                                    const T* dy, const float* save_mean, double* partial) {
  __shared__ double lanes[kThreads];
  const RowRange r(s, splits);
  const auto spatial = static_cast<std::uint32_t>(s.spatial);
  const auto channels = static_cast<std::uint32_t>(s.channels);
  const double mean = save_mean[r.channel];
  const std::uint32_t values = (r.end - r.first) * spatial;
  double sum_g = 0.0, sum_gx = 0.0;
#pragma unroll 4  // as stats_partial_kernel's
  for (std::uint32_t j = threadIdx.x; j < values; j += kThreads) {
    const std::uint32_t i =
        ((r.first + j / spatial) * channels + r.channel) * spatial + j % spatial;
    const double g = masked_grad<T, E>(dy, y, i);
    sum_g += g;
    sum_gx += g * (to_f32(x[i]) - mean);
  }
  sum_g = detail::block_sum(sum_g, lanes);
  sum_gx = detail::block_sum(sum_gx, lanes);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = sum_g;
    partial[2 * blockIdx.x + 1] = sum_gx;
  }
}

// One thread per channel: the splits' sums in order, then finish_grads.
__global__ void grad_finalize_kernel(BatchNormShape s, std::int64_t splits, const double* partial,
                                     const float* weight, const float* save_mean,
                                     const float* save_rstd, float* dweight, float* dbias,
                                     float4* coef) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= s.channels) return;
  double sum_g = 0.0, sum_gx = 0.0;
  for (std::int64_t k = 0; k < splits; ++k) {
    sum_g += partial[2 * (c * splits + k)];
    sum_gx += partial[2 * (c * splits + k) + 1];
  }
  finish_grads(s, c, sum_g, sum_gx, weight, save_mean, save_rstd, dweight, dbias, coef);
}

template <typename T, int V, BatchNormEpilogue E>
__global__ void dx_kernel(std::uint32_t packs, std::uint32_t row_packs, std::uint32_t channels,
                          const Pack<T, V>* x, const Pack<T, V>* y, const Pack<T, V>* dy,
                          const float4* coef, Pack<T, V>* dx, Pack<T, V>* d_identity) {
  for (std::uint32_t p = blockIdx.x * blockDim.x + threadIdx.x; p < packs;
       p += gridDim.x * blockDim.x) {
    const float4 k = coef[(p / row_packs) % channels];
    const Pack<T, V> in = x[p], grad = dy[p];
    const Pack<T, V> out = E == BatchNormEpilogue::none ? grad : y[p];
    Pack<T, V> d, masked;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      // masked_grad's rule: dy where y > 0 under a ReLU.
      const float g =
          E == BatchNormEpilogue::none || to_f32(out.v[e]) > 0.0f ? to_f32(grad.v[e]) : 0.0f;
      masked.v[e] = detail::from_f32<T>(g);
      d.v[e] = detail::from_f32<T>(input_grad(g, to_f32(in.v[e]), k));
    }
    if (E == BatchNormEpilogue::add_relu && d_identity) d_identity[p] = masked;
    dx[p] = d;
  }
}

template <typename T, int V, BatchNormEpilogue E>
void launch_apply(const BatchNormShape& s, const void* x, const void* identity, const float4* coef,
                  void* y, CudaStream stream) {
  const auto packs = static_cast<std::uint32_t>(s.batch * s.channels * s.spatial / V);
  apply_kernel<T, V, E><<<detail::grid_for(packs), kThreads, 0, stream>>>(
      packs, static_cast<std::uint32_t>(s.spatial / V), static_cast<std::uint32_t>(s.channels),
      static_cast<const Pack<T, V>*>(x), static_cast<const Pack<T, V>*>(identity), coef,
      static_cast<Pack<T, V>*>(y));
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

template <typename T, BatchNormEpilogue E>
void apply(const BatchNormShape& s, const void* x, const void* identity, const float4* coef,
           void* y, CudaStream stream) {
  if (packs_fit<T>(s.spatial, {x, identity, y}))
    launch_apply<T, 16 / sizeof(T), E>(s, x, identity, coef, y, stream);
  else
    launch_apply<T, 1, E>(s, x, identity, coef, y, stream);
}

template <typename T, int V, BatchNormEpilogue E>
void launch_dx(const BatchNormShape& s, const void* x, const void* y, const void* dy,
               const float4* coef, void* dx, void* d_identity, CudaStream stream) {
  const auto packs = static_cast<std::uint32_t>(s.batch * s.channels * s.spatial / V);
  dx_kernel<T, V, E><<<detail::grid_for(packs), kThreads, 0, stream>>>(
      packs, static_cast<std::uint32_t>(s.spatial / V), static_cast<std::uint32_t>(s.channels),
      static_cast<const Pack<T, V>*>(x), static_cast<const Pack<T, V>*>(y),
      static_cast<const Pack<T, V>*>(dy), coef, static_cast<Pack<T, V>*>(dx),
      static_cast<Pack<T, V>*>(d_identity));
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

// The checks of the fused calls, and where the workspace's parts begin.
struct FusedLayout {
  std::int64_t splits;
  double* partial;
  float4* coef;
  FusedLayout(const BatchNormShape& s, bool training, BatchNormEpilogue epi, bool has_identity,
              void* workspace, const char* op) {
    validate_for_cudnn(s, training);
    if ((epi == BatchNormEpilogue::add_relu) != has_identity)
      throw InvalidArgument(std::string(op) +
                            ": the identity is given exactly when the epilogue is add_relu");
    splits = batchnorm_row_splits(s);
    partial = static_cast<double*>(workspace);
    coef = reinterpret_cast<float4*>(static_cast<char*>(workspace) + 16 * s.channels * splits);
  }
};

unsigned channel_blocks(const BatchNormShape& s) {
  return static_cast<unsigned>((s.channels + kThreads - 1) / kThreads);
}

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

void batchnorm_fused_forward_training(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                      const void* x, const void* identity, const float* weight,
                                      const float* bias, void* y, float* save_mean,
                                      float* save_rstd, double momentum, float* running_mean,
                                      float* running_var, void* workspace, CudaStream stream) {
  const FusedLayout w(s, true, epi, identity != nullptr, workspace,
                      "batchnorm_fused_forward_training");
  if (s.spatial == 1) {  // Note [channels-last batchnorm]
    detail::batchnorm_rows_forward_training(s, type, epi, w.splits, x, identity, weight, bias, y,
                                            save_mean, save_rstd, momentum, running_mean,
                                            running_var, w.partial, w.coef, stream);
    return;
  }
  detail::dispatch_float(type, "batchnorm_fused_forward_training", [&](auto tag) {
    using T = decltype(tag);
    const T* in = static_cast<const T*>(x);
    stats_partial_kernel<T><<<static_cast<unsigned>(s.channels * w.splits), kThreads, 0, stream>>>(
        s, w.splits, in, w.partial);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
    stats_finalize_kernel<T><<<channel_blocks(s), kThreads, 0, stream>>>(
        s, w.splits, w.partial, in, weight, bias, save_mean, save_rstd, momentum, running_mean,
        running_var, w.coef);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
    dispatch_epilogue(
        epi, [&](auto e) { apply<T, decltype(e)::value>(s, x, identity, w.coef, y, stream); });
  });
}

void batchnorm_fused_forward_inference(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                       const void* x, const void* identity, const float* weight,
                                       const float* bias, const float* running_mean,
                                       const float* running_var, void* y, void* workspace,
                                       CudaStream stream) {
  const FusedLayout w(s, false, epi, identity != nullptr, workspace,
                      "batchnorm_fused_forward_inference");
  inference_coef_kernel<<<channel_blocks(s), kThreads, 0, stream>>>(s, weight, bias, running_mean,
                                                                    running_var, w.coef);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  if (s.spatial == 1) {  // Note [channels-last batchnorm]
    detail::batchnorm_rows_forward_inference(s, type, epi, x, identity, w.coef, y, stream);
    return;
  }
  detail::dispatch_float(type, "batchnorm_fused_forward_inference", [&](auto tag) {
    using T = decltype(tag);
    dispatch_epilogue(
        epi, [&](auto e) { apply<T, decltype(e)::value>(s, x, identity, w.coef, y, stream); });
  });
}

void batchnorm_fused_backward(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                              const void* x, const void* y, const void* dy, const float* weight,
                              const float* save_mean, const float* save_rstd, void* dx,
                              void* d_identity, float* dweight, float* dbias, void* workspace,
                              CudaStream stream) {
  if (epi != BatchNormEpilogue::none && !y)
    throw InvalidArgument("batchnorm_fused_backward: a ReLU epilogue needs forward's output y");
  const FusedLayout w(s, true, BatchNormEpilogue::none, false, workspace,
                      "batchnorm_fused_backward");
  if (s.spatial == 1) {  // Note [channels-last batchnorm]
    detail::batchnorm_rows_backward(s, type, epi, w.splits, x, y, dy, weight, save_mean, save_rstd,
                                    dx, d_identity, dweight, dbias, w.partial, w.coef, stream);
    return;
  }
  detail::dispatch_float(type, "batchnorm_fused_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_epilogue(epi, [&](auto e) {
      constexpr BatchNormEpilogue E = decltype(e)::value;
      grad_partial_kernel<T, E>
          <<<static_cast<unsigned>(s.channels * w.splits), kThreads, 0, stream>>>(
              s, w.splits, static_cast<const T*>(x), static_cast<const T*>(y),
              static_cast<const T*>(dy), save_mean, w.partial);
      LOCKSTEP_CHECK_CUDA(cudaGetLastError());
      grad_finalize_kernel<<<channel_blocks(s), kThreads, 0, stream>>>(
          s, w.splits, w.partial, weight, save_mean, save_rstd, dweight, dbias, w.coef);
      LOCKSTEP_CHECK_CUDA(cudaGetLastError());
      if (packs_fit<T>(s.spatial, {x, y, dy, dx, d_identity}))
        launch_dx<T, 16 / sizeof(T), E>(s, x, y, dy, w.coef, dx, d_identity, stream);
      else
        launch_dx<T, 1, E>(s, x, y, dy, w.coef, dx, d_identity, stream);
    });
  });
}

}  // namespace lockstep::kernels::cuda
