// CUDA LayerNorm (kernels/layernorm.h). Forward and dx: one block per row,
// statistics in f64 through a fixed-order tree (deterministic). dgamma and
// dbeta: a two-pass column sum (kernels/cuda/column_sum.cuh), no atomics.
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

// Row i's terms of dgamma[j] and dbeta[j], as the CPU computes them (f64).
struct AffineGradTerm {
  const float* dy;
  const float* x;
  const float* mean;
  const float* rstd;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i, std::int64_t j, double* acc) const {
    const double g = dy[i * cols + j];
    const double xhat = (static_cast<double>(x[i * cols + j]) - mean[i]) * rstd[i];
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
  detail::column_sums<2>(s.rows, s.cols, AffineGradTerm{dy, x, mean, rstd, s.cols}, outputs,
                         workspace, stream);
}

}  // namespace lockstep::kernels::cuda
