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
// data (spatial == 1) has kernels of its own: Note [channels-last batchnorm].
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>

#include "kernels/batchnorm.h"
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

using detail::kThreads;
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

// Channel c's statistics from its sums of x - pilot and (x - pilot)^2, the
// running update (unbiased variance) and coef = {mean, weight * rstd, bias}.
__device__ void finish_stats(const BatchNormShape& s, std::int64_t c, double sum, double squares,
                             double pilot, const float* weight, const float* bias, float* save_mean,
                             float* save_rstd, double momentum, float* running_mean,
                             float* running_var, float4* coef) {
  const double count = static_cast<double>(s.batch * s.spatial);
  const double shifted_mean = sum / count;
  const double var = fmax(squares / count - shifted_mean * shifted_mean, 0.0);
  const double mean = pilot + shifted_mean;
  const double rstd = 1.0 / sqrt(var + s.eps);
  save_mean[c] = static_cast<float>(mean);
  save_rstd[c] = static_cast<float>(rstd);
  if (running_mean) {
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    const double unbiased = var * count / (count - 1.0);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
  }
  coef[c] =
      make_float4(static_cast<float>(mean), static_cast<float>(rstd * weight[c]), bias[c], 0.0f);
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

// `identity` counts only for add_relu.
template <BatchNormEpilogue E>
__device__ __forceinline__ float epilogue(float v, float identity) {
  if (E == BatchNormEpilogue::add_relu) v += identity;
  if (E != BatchNormEpilogue::none) v = v > 0.0f ? v : 0.0f;  // relu(NaN) = 0, as the CPU's
  return v;
}

// The normalisation of one value and its epilogue, in f32: the one
// expression both layouts' apply kernels use, so they round alike.
template <BatchNormEpilogue E>
__device__ __forceinline__ float normalised(float x, float4 k, float identity) {
  return epilogue<E>((x - k.x) * k.y + k.z, identity);
}

// dx of one value from its masked gradient g, in f32 (coef as
// grad_finalize_kernel makes it): the one expression of both dx kernels.
__device__ __forceinline__ float input_grad(float g, float x, float4 k) {
  return k.y * (g - k.z) - k.w * (x - k.x);
}

// V consecutive values of one row (V divides spatial: one channel), loaded
// and stored as one access: 16 bytes where the row length and the pointers
// allow (Note [batchnorm packs]), else one value.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

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

// Channel c from its sums of g and g (x - mean): dweight += rstd sum(g (x -
// mean)), dbias += sum(g), and coef = {mean, k1, mean(g), k2} with dx = k1 (g -
// mean(g)) - k2 (x - mean): the CPU's w rstd (g - mean(g) - xhat mean(g xhat))
// rearranged.
__device__ void finish_grads(const BatchNormShape& s, std::int64_t c, double sum_g, double sum_gx,
                             const float* weight, const float* save_mean, const float* save_rstd,
                             float* dweight, float* dbias, float4* coef) {
  const double count = static_cast<double>(s.batch * s.spatial);
  const double rstd = save_rstd[c], k1 = weight[c] * rstd;
  if (dweight) dweight[c] = static_cast<float>(dweight[c] + sum_gx * rstd);
  if (dbias) dbias[c] = static_cast<float>(dbias[c] + sum_g);
  coef[c] = make_float4(save_mean[c], static_cast<float>(k1), static_cast<float>(sum_g / count),
                        static_cast<float>(k1 * rstd * rstd * sum_gx / count));
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

// Calls f(std::integral_constant<BatchNormEpilogue, E>{}) for the runtime epi.
template <typename F>
void dispatch_epilogue(BatchNormEpilogue epi, F&& f) {
  switch (epi) {
    case BatchNormEpilogue::none:
      f(std::integral_constant<BatchNormEpilogue, BatchNormEpilogue::none>{});
      return;
    case BatchNormEpilogue::relu:
      f(std::integral_constant<BatchNormEpilogue, BatchNormEpilogue::relu>{});
      return;
    case BatchNormEpilogue::add_relu:
      f(std::integral_constant<BatchNormEpilogue, BatchNormEpilogue::add_relu>{});
      return;
  }
}

// Note [batchnorm packs]: the elementwise passes (apply, dx) move 16 bytes per
// access (8 f16/bf16 or 4 f32 values) when every row's length is a multiple of
// that and every pointer is 16-byte aligned (resnet's 56x56, 28x28, 14x14;
// not 7x7), else one value: 16-bit scalar accesses leave too few bytes in
// flight to fill an H100's or H200's memory system. Each value's arithmetic
// is the same either way, so the choice never changes a bit. The NCHW sums
// stay scalar: their order is part of the result (Note [batchnorm passes]);
// the channels-last sums load packs, in an order that does not depend on
// them (Note [channels-last batchnorm]).
// `row_length`: spatial in NCHW, channels in channels-last (Note
// [channels-last batchnorm]).
template <typename T>
bool packs_fit(std::int64_t row_length, std::initializer_list<const void*> pointers) {
  if (row_length % static_cast<std::int64_t>(16 / sizeof(T)) != 0) return false;
  for (const void* p : pointers)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;  // null is aligned
  return true;
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

// Note [channels-last batchnorm]: an NHWC activation [N, H, W, C] is
// BatchNormShape{rows = N * H * W, C, spatial = 1}, a row-major [rows, C]
// matrix. The kernels above give a block one channel and read it with a
// stride of C values (a 32-byte sector for each 2-byte f16 value), so every
// spatial == 1 call takes the kernels below instead, whatever the dtype or
// alignment (there is nothing to fall back to: the same calls, each value's
// arithmetic the same):
// - Sums (x, or g and g (x - mean)): a block is a tile of up to kTilePacks
//   threads across the channels, each V consecutive channels (16 bytes where
//   C and the pointers allow, Note [batchnorm packs], else one value), times
//   kRowLanes threads down the rows of one split (batchnorm_row_splits).
//   Row lane r adds rows first + r, first + r + kRowLanes, ... in order, the
//   lanes are added in order 0 .. kRowLanes - 1 through shared memory into
//   one f64 partial per (split, channel) in the workspace, and a warp per
//   channel adds the splits (lane l: splits l, l + 32, ... in order) and the
//   lanes in a fixed shuffle tree. The order depends on the shape alone (not
//   V, not the pointers): the same bits every run, no atomics.
// - Elementwise (y; dx and d_identity): threads across the channels in
//   16-byte packs, each keeping its channels' coefficients in registers while
//   it walks down the rows, with normalised() and input_grad(): given the
//   same coefficients (inference), NHWC y is the NCHW kernels' y transposed,
//   bit for bit; in training the sums' other order moves the f64 statistics
//   by rounding only, so y and dx agree with NCHW and with the CPU twin
//   within the tolerances Note [fused batchnorm]'s test states (one ulp of
//   the type plus 1e-5; statistics 1e-6 relative; tests/engine/gpu/
//   test_batchnorm_fused_gpu.cpp).
// Bytes, resnet50 at batch 256 (224x224, f16; 53 BatchNorms over 2.85e9
// values: 1.05e9 with a ReLU, 1.41e9 with add + ReLU, 0.39e9 plain): forward
// training reads x twice and writes y (6 bytes a value, 8 with the identity),
// 19.9 GB; backward reads x and dy (and y under a ReLU) twice and writes dx
// (and d_identity), 41.1 GB: 61 GB a step, 15 ms at 4.1 TB/s on an H200
// (21 ms at 2.85 TB/s on an H100), the floor the NCHW kernels reach only on
// NCHW data. The workspace holds 16 bytes per (split, channel): 1 MiB at
// 56x56x64, 2 MiB at 7x7x2048.
constexpr unsigned kRowLanes = 16;   // threads down the rows of a sum block
constexpr unsigned kTilePacks = 16;  // threads across the channels of a sum block, at most

// Channels-last sums, one f64 pair per (split, channel): a block per (tile,
// split), kTilePacks x kRowLanes threads at most. Stats: x - pilot and its
// square, pilot being the channel's first value (row 0). Grads: g and g (x -
// mean), g the dy masked as masked_grad's.
template <typename T, int V, bool kGrads, BatchNormEpilogue E>
__global__ void partial_rows_kernel(std::uint32_t rows, std::uint32_t row_packs,
                                    std::uint32_t splits, const Pack<T, V>* x, const Pack<T, V>* y,
                                    const Pack<T, V>* dy, const float* save_mean, double* partial) {
  __shared__ double lanes[kRowLanes * kTilePacks * V * 2];
  const std::uint32_t pack = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t k = blockIdx.y;
  const auto first = static_cast<std::uint32_t>(std::uint64_t{k} * rows / splits);
  const auto end = static_cast<std::uint32_t>((std::uint64_t{k} + 1) * rows / splits);
  double shift[V], sum[V], second[V];
#pragma unroll
  for (int e = 0; e < V; ++e) shift[e] = sum[e] = second[e] = 0.0;
  if (pack < row_packs) {
    if (kGrads) {
#pragma unroll
      for (int e = 0; e < V; ++e) shift[e] = save_mean[pack * V + e];
    } else {
      const Pack<T, V> pilot = x[pack];
#pragma unroll
      for (int e = 0; e < V; ++e) shift[e] = to_f32(pilot.v[e]);
    }
#pragma unroll 4  // later rows' loads in flight; the order of the sums is unchanged
    for (std::uint32_t row = first + threadIdx.y; row < end; row += kRowLanes) {
      const std::uint32_t i = row * row_packs + pack;
      const Pack<T, V> in = x[i];
      if (kGrads) {
        const Pack<T, V> grad = dy[i];
        const Pack<T, V> out = E == BatchNormEpilogue::none ? grad : y[i];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          // masked_grad's rule: dy where y > 0 under a ReLU.
          const double g =
              E == BatchNormEpilogue::none || to_f32(out.v[e]) > 0.0f ? to_f32(grad.v[e]) : 0.0f;
          sum[e] += g;
          second[e] += g * (to_f32(in.v[e]) - shift[e]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const double d = to_f32(in.v[e]) - shift[e];
          sum[e] += d;
          second[e] += d * d;
        }
      }
    }
  }
  // lanes[r][channel in tile][2]; a thread past the channels leaves zeros.
  const unsigned tile_values = blockDim.x * V * 2;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    lanes[threadIdx.y * tile_values + (threadIdx.x * V + e) * 2] = sum[e];
    lanes[threadIdx.y * tile_values + (threadIdx.x * V + e) * 2 + 1] = second[e];
  }
  __syncthreads();
  const std::uint32_t channels = row_packs * V;
  for (unsigned t = threadIdx.y * blockDim.x + threadIdx.x; t < tile_values;
       t += blockDim.x * blockDim.y) {
    double total = 0.0;
    for (unsigned r = 0; r < kRowLanes; ++r) total += lanes[r * tile_values + t];
    const std::uint32_t c = blockIdx.x * blockDim.x * V + t / 2;
    if (c < channels) partial[2 * (std::uint64_t{c} * splits + k) + t % 2] = total;
  }
}

// A warp per channel: the channel's splits summed in a fixed order (lane l
// takes splits l, l + 32, ...; then a shuffle tree). Lane 0 gets the sums.
__device__ void sum_splits_in_warp(std::int64_t c, std::int64_t splits, const double* partial,
                                   double& first, double& second) {
  first = second = 0.0;
  for (std::int64_t k = threadIdx.x % 32; k < splits; k += 32) {
    first += partial[2 * (c * splits + k)];
    second += partial[2 * (c * splits + k) + 1];
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    first += __shfl_down_sync(0xffffffffu, first, offset);
    second += __shfl_down_sync(0xffffffffu, second, offset);
  }
}

// The channel of this thread's warp (kThreads-thread blocks: whole warps).
__device__ std::int64_t warp_channel() {
  return (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32;
}

template <typename T>
__global__ void stats_finalize_rows_kernel(BatchNormShape s, std::int64_t splits,
                                           const double* partial, const T* x, const float* weight,
                                           const float* bias, float* save_mean, float* save_rstd,
                                           double momentum, float* running_mean, float* running_var,
                                           float4* coef) {
  const std::int64_t c = warp_channel();
  if (c >= s.channels) return;  // the whole warp
  double sum, squares;
  sum_splits_in_warp(c, splits, partial, sum, squares);
  if (threadIdx.x % 32 == 0)
    finish_stats(s, c, sum, squares, to_f32(x[c]), weight, bias, save_mean, save_rstd, momentum,
                 running_mean, running_var, coef);
}

__global__ void grad_finalize_rows_kernel(BatchNormShape s, std::int64_t splits,
                                          const double* partial, const float* weight,
                                          const float* save_mean, const float* save_rstd,
                                          float* dweight, float* dbias, float4* coef) {
  const std::int64_t c = warp_channel();
  if (c >= s.channels) return;  // the whole warp
  double sum_g, sum_gx;
  sum_splits_in_warp(c, splits, partial, sum_g, sum_gx);
  if (threadIdx.x % 32 == 0)
    finish_grads(s, c, sum_g, sum_gx, weight, save_mean, save_rstd, dweight, dbias, coef);
}

unsigned warp_channel_blocks(const BatchNormShape& s) {
  return static_cast<unsigned>((32 * s.channels + kThreads - 1) / kThreads);
}

// Channels-last elementwise passes: a thread keeps one pack of channels and
// walks down the rows.
template <typename T, int V, BatchNormEpilogue E>
__global__ void apply_rows_kernel(std::uint32_t rows, std::uint32_t row_packs, const Pack<T, V>* x,
                                  const Pack<T, V>* identity, const float4* coef, Pack<T, V>* y) {
  const std::uint32_t pack = blockIdx.x * blockDim.x + threadIdx.x;
  if (pack >= row_packs) return;
  float4 k[V];
#pragma unroll
  for (int e = 0; e < V; ++e) k[e] = coef[pack * V + e];
  for (std::uint32_t row = blockIdx.y * blockDim.y + threadIdx.y; row < rows;
       row += gridDim.y * blockDim.y) {
    const std::uint32_t i = row * row_packs + pack;
    const Pack<T, V> in = x[i];
    const Pack<T, V> id = E == BatchNormEpilogue::add_relu ? identity[i] : in;
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e)
      out.v[e] = detail::from_f32<T>(normalised<E>(to_f32(in.v[e]), k[e], to_f32(id.v[e])));
    y[i] = out;
  }
}

template <typename T, int V, BatchNormEpilogue E>
__global__ void dx_rows_kernel(std::uint32_t rows, std::uint32_t row_packs, const Pack<T, V>* x,
                               const Pack<T, V>* y, const Pack<T, V>* dy, const float4* coef,
                               Pack<T, V>* dx, Pack<T, V>* d_identity) {
  const std::uint32_t pack = blockIdx.x * blockDim.x + threadIdx.x;
  if (pack >= row_packs) return;
  float4 k[V];
#pragma unroll
  for (int e = 0; e < V; ++e) k[e] = coef[pack * V + e];
  for (std::uint32_t row = blockIdx.y * blockDim.y + threadIdx.y; row < rows;
       row += gridDim.y * blockDim.y) {
    const std::uint32_t i = row * row_packs + pack;
    const Pack<T, V> in = x[i], grad = dy[i];
    const Pack<T, V> out = E == BatchNormEpilogue::none ? grad : y[i];
    Pack<T, V> d, masked;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      // masked_grad's rule: dy where y > 0 under a ReLU.
      const float g =
          E == BatchNormEpilogue::none || to_f32(out.v[e]) > 0.0f ? to_f32(grad.v[e]) : 0.0f;
      masked.v[e] = detail::from_f32<T>(g);
      d.v[e] = detail::from_f32<T>(input_grad(g, to_f32(in.v[e]), k[e]));
    }
    if (E == BatchNormEpilogue::add_relu && d_identity) d_identity[i] = masked;
    dx[i] = d;
  }
}

// The launch shapes of the channels-last kernels at V channels a thread.
struct RowsGeometry {
  std::uint32_t rows, row_packs;
  dim3 sum_grid, sum_block, pass_grid, pass_block;
  RowsGeometry(const BatchNormShape& s, std::int64_t splits, int v)
      : rows(static_cast<std::uint32_t>(s.batch)),
        row_packs(static_cast<std::uint32_t>(s.channels / v)) {
    const unsigned sum_across = row_packs < kTilePacks ? row_packs : kTilePacks;
    sum_block = dim3(sum_across, kRowLanes);
    sum_grid = dim3((row_packs + sum_across - 1) / sum_across, static_cast<unsigned>(splits));
    // Elementwise: a warp's worth of packs across at most, kThreads a block,
    // about 4096 blocks (grid-stride down the rows beyond that).
    const unsigned across = row_packs < 32 ? row_packs : 32;
    const unsigned down = kThreads / across;
    const unsigned tiles = (row_packs + across - 1) / across;
    std::int64_t row_blocks = (static_cast<std::int64_t>(rows) + down - 1) / down;
    const std::int64_t cap = tiles >= 4096 ? 1 : 4096 / tiles;
    if (row_blocks > cap) row_blocks = cap;
    pass_block = dim3(across, down);
    pass_grid = dim3(tiles, static_cast<unsigned>(row_blocks));
  }
};

template <typename T, int V>
void stats_rows(const BatchNormShape& s, std::int64_t splits, const void* x, double* partial,
                CudaStream stream) {
  const RowsGeometry g(s, splits, V);
  partial_rows_kernel<T, V, false, BatchNormEpilogue::none><<<g.sum_grid, g.sum_block, 0, stream>>>(
      g.rows, g.row_packs, static_cast<std::uint32_t>(splits), static_cast<const Pack<T, V>*>(x),
      nullptr, nullptr, nullptr, partial);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

template <typename T, int V, BatchNormEpilogue E>
void apply_rows(const BatchNormShape& s, const void* x, const void* identity, const float4* coef,
                void* y, CudaStream stream) {
  const RowsGeometry g(s, 1, V);
  apply_rows_kernel<T, V, E><<<g.pass_grid, g.pass_block, 0, stream>>>(
      g.rows, g.row_packs, static_cast<const Pack<T, V>*>(x),
      static_cast<const Pack<T, V>*>(identity), coef, static_cast<Pack<T, V>*>(y));
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

// The channels-last forward after the coefficients: y in packs where they fit.
template <typename T, BatchNormEpilogue E>
void apply_rows(const BatchNormShape& s, const void* x, const void* identity, const float4* coef,
                void* y, CudaStream stream) {
  if (packs_fit<T>(s.channels, {x, identity, y}))
    apply_rows<T, 16 / sizeof(T), E>(s, x, identity, coef, y, stream);
  else
    apply_rows<T, 1, E>(s, x, identity, coef, y, stream);
}

template <typename T, int V, BatchNormEpilogue E>
void backward_rows(const BatchNormShape& s, std::int64_t splits, const void* x, const void* y,
                   const void* dy, const float* weight, const float* save_mean,
                   const float* save_rstd, void* dx, void* d_identity, float* dweight, float* dbias,
                   double* partial, float4* coef, CudaStream stream) {
  const RowsGeometry g(s, splits, V);
  partial_rows_kernel<T, V, true, E><<<g.sum_grid, g.sum_block, 0, stream>>>(
      g.rows, g.row_packs, static_cast<std::uint32_t>(splits), static_cast<const Pack<T, V>*>(x),
      static_cast<const Pack<T, V>*>(y), static_cast<const Pack<T, V>*>(dy), save_mean, partial);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  grad_finalize_rows_kernel<<<warp_channel_blocks(s), kThreads, 0, stream>>>(
      s, splits, partial, weight, save_mean, save_rstd, dweight, dbias, coef);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  dx_rows_kernel<T, V, E><<<g.pass_grid, g.pass_block, 0, stream>>>(
      g.rows, g.row_packs, static_cast<const Pack<T, V>*>(x), static_cast<const Pack<T, V>*>(y),
      static_cast<const Pack<T, V>*>(dy), coef, static_cast<Pack<T, V>*>(dx),
      static_cast<Pack<T, V>*>(d_identity));
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
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
  detail::dispatch_float(type, "batchnorm_fused_forward_training", [&](auto tag) {
    using T = decltype(tag);
    const T* in = static_cast<const T*>(x);
    if (s.spatial == 1) {  // Note [channels-last batchnorm]
      if (packs_fit<T>(s.channels, {x}))
        stats_rows<T, 16 / sizeof(T)>(s, w.splits, x, w.partial, stream);
      else
        stats_rows<T, 1>(s, w.splits, x, w.partial, stream);
      stats_finalize_rows_kernel<T><<<warp_channel_blocks(s), kThreads, 0, stream>>>(
          s, w.splits, w.partial, in, weight, bias, save_mean, save_rstd, momentum, running_mean,
          running_var, w.coef);
      LOCKSTEP_CHECK_CUDA(cudaGetLastError());
      dispatch_epilogue(epi, [&](auto e) {
        apply_rows<T, decltype(e)::value>(s, x, identity, w.coef, y, stream);
      });
      return;
    }
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
  detail::dispatch_float(type, "batchnorm_fused_forward_inference", [&](auto tag) {
    using T = decltype(tag);
    dispatch_epilogue(epi, [&](auto e) {
      if (s.spatial == 1)  // Note [channels-last batchnorm]
        apply_rows<T, decltype(e)::value>(s, x, identity, w.coef, y, stream);
      else
        apply<T, decltype(e)::value>(s, x, identity, w.coef, y, stream);
    });
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
  detail::dispatch_float(type, "batchnorm_fused_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_epilogue(epi, [&](auto e) {
      constexpr BatchNormEpilogue E = decltype(e)::value;
      if (s.spatial == 1) {  // Note [channels-last batchnorm]
        if (packs_fit<T>(s.channels, {x, y, dy, dx, d_identity}))
          backward_rows<T, 16 / sizeof(T), E>(s, w.splits, x, y, dy, weight, save_mean, save_rstd,
                                              dx, d_identity, dweight, dbias, w.partial, w.coef,
                                              stream);
        else
          backward_rows<T, 1, E>(s, w.splits, x, y, dy, weight, save_mean, save_rstd, dx,
                                 d_identity, dweight, dbias, w.partial, w.coef, stream);
        return;
      }
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
