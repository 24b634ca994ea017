// CPU LayerNorm (kernels/layernorm.h); row statistics accumulate in f64.
#include "kernels/layernorm.h"

#include <cmath>
#include <vector>

namespace lockstep::kernels::cpu {

void layernorm_forward(const LayerNormShape& s, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd) {
  for (std::int64_t i = 0; i < s.rows; ++i) {
    const float* row = x + i * s.cols;
    double sum = 0.0;
    for (std::int64_t j = 0; j < s.cols; ++j) sum += row[j];
    const double mu = sum / static_cast<double>(s.cols);
    double sq = 0.0;
    for (std::int64_t j = 0; j < s.cols; ++j) sq += (row[j] - mu) * (row[j] - mu);
    const double r = 1.0 / std::sqrt(sq / static_cast<double>(s.cols) + s.eps);
    mean[i] = static_cast<float>(mu);
    rstd[i] = static_cast<float>(r);
    for (std::int64_t j = 0; j < s.cols; ++j) {
      const float xhat = (row[j] - mean[i]) * rstd[i];
      y[i * s.cols + j] = (gamma ? xhat * gamma[j] : xhat) + (beta ? beta[j] : 0.0f);
    }
  }
}

void layernorm_backward(const LayerNormShape& s, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* gamma, float* dx, float* dgamma,
                        float* dbeta) {
  std::vector<double> dgamma_acc(s.cols, 0.0), dbeta_acc(s.cols, 0.0);
  for (std::int64_t i = 0; i < s.rows; ++i) {
    const float* g = dy + i * s.cols;
    const float* row = x + i * s.cols;
    // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gamma.
    double mean_dxhat = 0.0, mean_dxhat_xhat = 0.0;
    for (std::int64_t j = 0; j < s.cols; ++j) {
      const double xhat = (row[j] - mean[i]) * static_cast<double>(rstd[i]);
      const double dxhat = g[j] * (gamma ? gamma[j] : 1.0);
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat;
      dgamma_acc[j] += g[j] * xhat;
      dbeta_acc[j] += g[j];
    }
    mean_dxhat /= static_cast<double>(s.cols);
    mean_dxhat_xhat /= static_cast<double>(s.cols);
    for (std::int64_t j = 0; j < s.cols; ++j) {
      const double xhat = (row[j] - mean[i]) * static_cast<double>(rstd[i]);
      const double dxhat = g[j] * (gamma ? gamma[j] : 1.0);
      dx[i * s.cols + j] =
          static_cast<float>(rstd[i] * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat));
    }
  }
  if (dgamma)
    for (std::int64_t j = 0; j < s.cols; ++j)
      dgamma[j] = static_cast<float>(dgamma[j] + dgamma_acc[j]);
  if (dbeta)
    for (std::int64_t j = 0; j < s.cols; ++j)
      dbeta[j] = static_cast<float>(dbeta[j] + dbeta_acc[j]);
}

}  // namespace lockstep::kernels::cpu
