// Channels-last CUDA BatchNorm (spatial == 1: an NHWC activation as a
// row-major [rows, C] matrix): the fused calls' sum, finalize and elementwise
// kernels with threads along the channels, and the launchers that the entry
// points in kernels/cuda/batchnorm.cu dispatch such shapes to (declared in
// kernels/cuda/batchnorm_detail.cuh, with the device helpers both layouts use).
#include <cstdint>

#include "kernels/batchnorm.h"
#include "kernels/cuda/batchnorm_detail.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"

namespace lockstep::kernels::cuda {
namespace {

using detail::finish_grads;
using detail::finish_stats;
using detail::input_grad;
using detail::kThreads;
using detail::normalised;
using detail::Pack;
using detail::packs_fit;
using detail::to_f32;

// Note [channels-last batchnorm]: an NHWC activation [N, H, W, C] is
// BatchNormShape{rows = N * H * W, C, spatial = 1}, a row-major [rows, C]
// matrix. The NCHW kernels (batchnorm.cu) give a block one channel and read
// it with a stride of C values (a 32-byte sector for each 2-byte f16 value),
// so every spatial == 1 call takes the kernels below instead, whatever the
// dtype or alignment (there is nothing to fall back to: the same calls, each
// value's arithmetic the same):
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
// mean), g the dy masked as batchnorm.cu's masked_grad.
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
          // batchnorm.cu's masked_grad rule: dy where y > 0 under a ReLU.
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
      // batchnorm.cu's masked_grad rule: dy where y > 0 under a ReLU.
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

namespace detail {

void batchnorm_rows_forward_training(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                     std::int64_t splits, const void* x, const void* identity,
                                     const float* weight, const float* bias, void* y,
                                     float* save_mean, float* save_rstd, double momentum,
                                     float* running_mean, float* running_var, double* partial,
                                     float4* coef, CudaStream stream) {
  dispatch_float(type, "batchnorm_fused_forward_training", [&](auto tag) {
    using T = decltype(tag);
    if (packs_fit<T>(s.channels, {x}))
      stats_rows<T, 16 / sizeof(T)>(s, splits, x, partial, stream);
    else
      stats_rows<T, 1>(s, splits, x, partial, stream);
    stats_finalize_rows_kernel<T><<<warp_channel_blocks(s), kThreads, 0, stream>>>(
        s, splits, partial, static_cast<const T*>(x), weight, bias, save_mean, save_rstd, momentum,
        running_mean, running_var, coef);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
    dispatch_epilogue(
        epi, [&](auto e) { apply_rows<T, decltype(e)::value>(s, x, identity, coef, y, stream); });
  });
}

void batchnorm_rows_forward_inference(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                      const void* x, const void* identity, const float4* coef,
                                      void* y, CudaStream stream) {
  dispatch_float(type, "batchnorm_fused_forward_inference", [&](auto tag) {
    using T = decltype(tag);
    dispatch_epilogue(
        epi, [&](auto e) { apply_rows<T, decltype(e)::value>(s, x, identity, coef, y, stream); });
  });
}

void batchnorm_rows_backward(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                             std::int64_t splits, const void* x, const void* y, const void* dy,
                             const float* weight, const float* save_mean, const float* save_rstd,
                             void* dx, void* d_identity, float* dweight, float* dbias,
                             double* partial, float4* coef, CudaStream stream) {
  dispatch_float(type, "batchnorm_fused_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_epilogue(epi, [&](auto e) {
      constexpr BatchNormEpilogue E = decltype(e)::value;
      if (packs_fit<T>(s.channels, {x, y, dy, dx, d_identity}))
        backward_rows<T, 16 / sizeof(T), E>(s, splits, x, y, dy, weight, save_mean, save_rstd, dx,
                                            d_identity, dweight, dbias, partial, coef, stream);
      else
        backward_rows<T, 1, E>(s, splits, x, y, dy, weight, save_mean, save_rstd, dx, d_identity,
                               dweight, dbias, partial, coef, stream);
    });
  });
}

}  // namespace detail
}  // namespace lockstep::kernels::cuda
