// CUDA LayerNorm (kernels/layernorm.h). Forward and dx: one block per row,
// statistics in f64 through a fixed-order tree (deterministic). dgamma and
// dbeta: one thread per column walking the rows in order (no atomics).
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
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

__global__ void affine_grad_kernel(LayerNormShape s, const float* dy, const float* x,
                                   const float* mean, const float* rstd, float* dgamma,
                                   float* dbeta) {
  for (std::int64_t j = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; j < s.cols;
       j += std::int64_t{gridDim.x} * blockDim.x) {
    double dg = 0.0, db = 0.0;
    for (std::int64_t i = 0; i < s.rows; ++i) {
      const double g = dy[i * s.cols + j];
      dg += g * (x[i * s.cols + j] - mean[i]) * static_cast<double>(rstd[i]);
      db += g;
    }
    if (dgamma) dgamma[j] = static_cast<float>(dgamma[j] + dg);
    if (dbeta) dbeta[j] = static_cast<float>(dbeta[j] + db);
  }
}

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
                        float* dbeta, CudaStream stream) {
  if (s.rows == 0) return;
  dx_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(s, dy, x, mean, rstd, gamma,
                                                                    dx);
  if (dgamma || dbeta)
    affine_grad_kernel<<<detail::grid_for(s.cols), kThreads, 0, stream>>>(s, dy, x, mean, rstd,
                                                                          dgamma, dbeta);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
