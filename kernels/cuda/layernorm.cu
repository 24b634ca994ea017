// CUDA LayerNorm (kernels/layernorm.h). f32 forward and dx: one block per
// row, statistics in f64 through a fixed-order tree (deterministic). The
// mixed-type calls (Note [low-type LayerNorm]): one warp per row, f64
// statistics through a butterfly of shuffles (deterministic too). dgamma and
// dbeta: a two-pass column sum (kernels/cuda/column_sum.cuh), no atomics.
#include <string>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/device_float.cuh"
#include "kernels/layernorm.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::kThreads;

__global__ void forward_kernel(LayerNormShape s, const float* x, const float* gamma,
                               const float* beta, float* y, float* mean, float* rstd) {
  __shared__ double lanes[kThreads];
  const std::int64_t i = blockIdx.x;
  const float* row = x + i * s.cols;
  double sum = 0.0;
  for (std::int64_t j = threadIdx.x; j < s.cols; j += kThreads) sum += row[j];
  const double mu = detail::block_sum(sum, lanes) / static_cast<double>(s.cols);
  double sq = 0.0;
  for (std::int64_t j = threadIdx.x; j < s.cols; j += kThreads) sq += (row[j] - mu) * (row[j] - mu);
  const double r = 1.0 / sqrt(detail::block_sum(sq, lanes) / static_cast<double>(s.cols) + s.eps);
  const float m = static_cast<float>(mu), rs = static_cast<float>(r);
  if (threadIdx.x == 0) {
    mean[i] = m;
    rstd[i] = rs;
  }
  for (std::int64_t j = threadIdx.x; j < s.cols; j += kThreads) {
    const float xhat = (row[j] - m) * rs;
    y[i * s.cols + j] = (gamma ? xhat * gamma[j] : xhat) + (beta ? beta[j] : 0.0f);
  }
}

__global__ void dx_kernel(LayerNormShape s, const float* dy, const float* x, const float* mean,
                          const float* rstd, const float* gamma, float* dx) {
  __shared__ double lanes[kThreads];
  const std::int64_t i = blockIdx.x;
  const float* g = dy + i * s.cols;
  const float* row = x + i * s.cols;
  double a = 0.0, b = 0.0;
  for (std::int64_t j = threadIdx.x; j < s.cols; j += kThreads) {
    const double xhat = (row[j] - mean[i]) * static_cast<double>(rstd[i]);
    const double dxhat = g[j] * (gamma ? gamma[j] : 1.0);
    a += dxhat;
    b += dxhat * xhat;
  }
  const double mean_dxhat = detail::block_sum(a, lanes) / static_cast<double>(s.cols);
  const double mean_dxhat_xhat = detail::block_sum(b, lanes) / static_cast<double>(s.cols);
  for (std::int64_t j = threadIdx.x; j < s.cols; j += kThreads) {
    const double xhat = (row[j] - mean[i]) * static_cast<double>(rstd[i]);
    const double dxhat = g[j] * (gamma ? gamma[j] : 1.0);
    dx[i * s.cols + j] =
        static_cast<float>(rstd[i] * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat));
  }
}

// Note [warp rows]: the mixed kernels give each row one warp (kWarpRows warps
// a block), so a row's reductions are shuffles with no __syncthreads, and a
// row of GPT-2's 768 columns is 24 elements a lane. Lane l handles columns l,
// l + 32, ... in order in every pass; later passes re-read the row (from L1
// or L2, as the f32 kernels do); the loops unroll by 4 so that a lane has
// several loads in flight. Each row's f64 partials are added by an
// xor butterfly: IEEE addition commutes exactly, so every lane ends with the
// same bits, and the bits depend on cols only. A warp whose row is past the
// end returns as a whole, before any shuffle.
constexpr int kWarpRows = 8;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

unsigned warp_row_blocks(std::int64_t rows, const char* op) {
  const std::int64_t blocks = (rows + kWarpRows - 1) / kWarpRows;
  if (blocks > 0x7fffffff)
    throw InvalidArgument(std::string(op) + ": " + std::to_string(rows) +
                          " rows exceed the grid (at most " +
                          std::to_string(std::int64_t{0x7fffffff} * kWarpRows) + ")");
  return static_cast<unsigned>(blocks);
}

// y = LayerNorm(in) with in = x, or (kResidual) in = residual + x, written to
// `sum` in the first pass and read back from there after (the same thread
// reads what it wrote). `sum` may alias `residual`: each element is read
// once before its own thread writes it. The f32 arithmetic of y is the CPU's,
// ((in - mean) * rstd) * gamma + beta, unfused (__fmul_rn, __fadd_rn).
template <typename TIn, typename TOut, bool kResidual>
__global__ void forward_mixed_kernel(LayerNormShape s, const float* residual, const TIn* x,
                                     const float* gamma, const float* beta, float* sum, TOut* y,
                                     float* mean, float* rstd) {
  const std::int64_t i = std::int64_t{blockIdx.x} * kWarpRows + threadIdx.x / 32;
  if (i >= s.rows) return;  // Note [warp rows]: the whole warp
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t base = i * s.cols;
  auto value = [&](std::int64_t j) -> float {
    if constexpr (kResidual) {
      return sum[base + j];
    } else {
      return detail::to_f32(x[base + j]);
    }
  };
  double total = 0.0;
#pragma unroll 4
  for (std::int64_t j = lane; j < s.cols; j += 32) {
    float v;
    if constexpr (kResidual) {
      v = __fadd_rn(residual[base + j], detail::to_f32(x[base + j]));
      sum[base + j] = v;
    } else {
      v = value(j);
    }
    total += v;
  }
  const double mu = warp_sum(total) / static_cast<double>(s.cols);
  double sq = 0.0;
#pragma unroll 4
  for (std::int64_t j = lane; j < s.cols; j += 32) {
    const double d = value(j) - mu;
    sq += d * d;
  }
  const double r = 1.0 / sqrt(warp_sum(sq) / static_cast<double>(s.cols) + s.eps);
  const float m = static_cast<float>(mu), rs = static_cast<float>(r);
  if (lane == 0) {
    mean[i] = m;
    rstd[i] = rs;
  }
#pragma unroll 4
  for (std::int64_t j = lane; j < s.cols; j += 32) {
    float out = __fmul_rn(__fsub_rn(value(j), m), rs);
    if (gamma) out = __fmul_rn(out, gamma[j]);
    if (beta) out = __fadd_rn(out, beta[j]);
    y[base + j] = detail::from_f32<TOut>(out);
  }
}

// dx = dresidual + rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat =
// dy gamma, in f64 as the CPU's (and the f32 kernel's); the sum with dresidual
// in f32 (the CPU adds the f32 dx to it), then rounded to TX. dx may alias
// dresidual (each element read by the thread that writes it).
template <typename TDy, typename TX>
__global__ void dx_mixed_kernel(LayerNormShape s, const TDy* dy, const TX* x, const float* mean,
                                const float* rstd, const float* gamma, const float* dresidual,
                                TX* dx) {
  const std::int64_t i = std::int64_t{blockIdx.x} * kWarpRows + threadIdx.x / 32;
  if (i >= s.rows) return;  // Note [warp rows]: the whole warp
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t base = i * s.cols;
  const double m = mean[i], r = rstd[i];
  auto xhat = [&](std::int64_t j) { return (detail::to_f32(x[base + j]) - m) * r; };
  auto dxhat = [&](std::int64_t j) {
    const double g = detail::to_f32(dy[base + j]);
    return gamma ? g * gamma[j] : g;
  };
  double a = 0.0, b = 0.0;
#pragma unroll 4
  for (std::int64_t j = lane; j < s.cols; j += 32) {
    const double dh = dxhat(j);
    a += dh;
    b += dh * xhat(j);
  }
  const double mean_dxhat = warp_sum(a) / static_cast<double>(s.cols);
  const double mean_dxhat_xhat = warp_sum(b) / static_cast<double>(s.cols);
#pragma unroll 4
  for (std::int64_t j = lane; j < s.cols; j += 32) {
    float out = static_cast<float>(r * (dxhat(j) - mean_dxhat - xhat(j) * mean_dxhat_xhat));
    if (dresidual) out = __fadd_rn(out, dresidual[base + j]);
    dx[base + j] = detail::from_f32<TX>(out);
  }
}

template <typename TBranch>
__global__ void residual_add_kernel(std::int64_t n, const float* residual, const TBranch* branch,
                                    float* out) {
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < n;
       k += std::int64_t{gridDim.x} * blockDim.x)
    out[k] = __fadd_rn(detail::to_f32(branch[k]), residual[k]);
}

// Row i's terms of dgamma[j] and dbeta[j], as the CPU computes them (f64).
// dy and x in their storage types (f32 in the f32 call).
template <typename TDy = float, typename TX = float>
struct AffineGradTerm {
  const TDy* dy;
  const TX* x;
  const float* mean;
  const float* rstd;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i, std::int64_t j, double* acc) const {
    const double g = detail::to_f32(dy[i * cols + j]);
    const double xhat = (static_cast<double>(detail::to_f32(x[i * cols + j])) - mean[i]) * rstd[i];
    acc[0] += g * xhat;
    acc[1] += g;
  }
};

}  // namespace

void layernorm_forward(const LayerNormShape& s, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd, CudaStream stream) {
  if (s.rows == 0) return;
  forward_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(s, x, gamma, beta, y, mean,
                                                                         rstd);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void layernorm_backward(const LayerNormShape& s, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* gamma, float* dx, float* dgamma,
                        float* dbeta, void* workspace, CudaStream stream) {
  if (s.rows == 0) return;
  dx_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(s, dy, x, mean, rstd, gamma,
                                                                    dx);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  if (!dgamma && !dbeta) return;
  detail::ColumnOutputs<2> outputs;
  outputs.out[0] = dgamma;
  outputs.out[1] = dbeta;
  detail::column_sums<2>(s.rows, s.cols, AffineGradTerm<>{dy, x, mean, rstd, s.cols}, outputs,
                         workspace, stream);
}

void layernorm_forward_mixed(const LayerNormShape& s, const void* x, DType x_type,
                             const float* gamma, const float* beta, void* y, DType y_type,
                             float* mean, float* rstd, CudaStream stream) {
  if (s.rows == 0) return;
  const unsigned blocks = warp_row_blocks(s.rows, "layernorm_forward_mixed");
  detail::dispatch_float(x_type, "layernorm_forward_mixed", [&](auto tin) {
    using TIn = decltype(tin);
    detail::dispatch_float(y_type, "layernorm_forward_mixed", [&](auto tout) {
      using TOut = decltype(tout);
      forward_mixed_kernel<TIn, TOut, false>
          <<<blocks, kWarpRows * 32, 0, stream>>>(s, nullptr, static_cast<const TIn*>(x), gamma,
                                                  beta, nullptr, static_cast<TOut*>(y), mean, rstd);
    });
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void add_layernorm_forward(const LayerNormShape& s, const float* residual, const void* branch,
                           DType branch_type, const float* gamma, const float* beta, float* sum,
                           void* y, DType y_type, float* mean, float* rstd, CudaStream stream) {
  if (s.rows == 0) return;
  const unsigned blocks = warp_row_blocks(s.rows, "add_layernorm_forward");
  detail::dispatch_float(branch_type, "add_layernorm_forward", [&](auto tin) {
    using TIn = decltype(tin);
    detail::dispatch_float(y_type, "add_layernorm_forward", [&](auto tout) {
      using TOut = decltype(tout);
      forward_mixed_kernel<TIn, TOut, true><<<blocks, kWarpRows * 32, 0, stream>>>(
          s, residual, static_cast<const TIn*>(branch), gamma, beta, sum, static_cast<TOut*>(y),
          mean, rstd);
    });
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void layernorm_backward_mixed(const LayerNormShape& s, const void* dy, DType dy_type, const void* x,
                              DType x_type, const float* mean, const float* rstd,
                              const float* gamma, const float* dresidual, void* dx, float* dgamma,
                              float* dbeta, void* workspace, CudaStream stream) {
  if (s.rows == 0) return;
  const unsigned blocks = warp_row_blocks(s.rows, "layernorm_backward_mixed");
  detail::dispatch_float(dy_type, "layernorm_backward_mixed", [&](auto tdy) {
    using TDy = decltype(tdy);
    detail::dispatch_float(x_type, "layernorm_backward_mixed", [&](auto tx) {
      using TX = decltype(tx);
      const auto* pdy = static_cast<const TDy*>(dy);
      const auto* px = static_cast<const TX*>(x);
      dx_mixed_kernel<TDy, TX><<<blocks, kWarpRows * 32, 0, stream>>>(
          s, pdy, px, mean, rstd, gamma, dresidual, static_cast<TX*>(dx));
      LOCKSTEP_CHECK_CUDA(cudaGetLastError());
      if (!dgamma && !dbeta) return;
      detail::ColumnOutputs<2> outputs;
      outputs.out[0] = dgamma;
      outputs.out[1] = dbeta;
      detail::column_sums<2>(s.rows, s.cols, AffineGradTerm<TDy, TX>{pdy, px, mean, rstd, s.cols},
                             outputs, workspace, stream);
    });
  });
}

void residual_add(std::int64_t n, const float* residual, const void* branch, DType branch_type,
                  float* out, CudaStream stream) {
  if (n == 0) return;
  detail::dispatch_float(branch_type, "residual_add", [&](auto tb) {
    using TBranch = decltype(tb);
    residual_add_kernel<TBranch><<<detail::grid_for(n), kThreads, 0, stream>>>(
        n, residual, static_cast<const TBranch*>(branch), out);
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
