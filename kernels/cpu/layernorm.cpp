// CPU LayerNorm (kernels/layernorm.h); row statistics accumulate in f64, over
// eight lanes (kernels/detail/lane_sum.h) so that the reductions vectorise.
// Each function has an AVX2 clone besides the baseline one (chosen at load
// time), as the activations have (Note [vector tanh] in activation.cpp).
#include "kernels/layernorm.h"

#include <cmath>
#include <vector>

#include "kernels/detail/lane_sum.h"

namespace lockstep::kernels::cpu {

namespace {

[[gnu::target_clones("avx2", "default")]] void layernorm_forward_clones(const LayerNormShape& s,
                                                                        const float* x,
                                                                        const float* gamma,
                                                                        const float* beta, float* y,
                                                                        float* mean, float* rstd) {
  const std::int64_t n = s.cols;
  for (std::int64_t i = 0; i < s.rows; ++i) {
    const float* row = x + i * n;
    float* out = y + i * n;
    const double mu =
        detail::lane_sum(n, [&](std::int64_t j) { return static_cast<double>(row[j]); }) /
        static_cast<double>(n);
    const double sq = detail::lane_sum(n, [&](std::int64_t j) {
      const double d = row[j] - mu;
      return d * d;
    });
    const double r = 1.0 / std::sqrt(sq / static_cast<double>(n) + s.eps);
    const auto m = static_cast<float>(mu), rs = static_cast<float>(r);
    mean[i] = m;
    rstd[i] = rs;
    if (gamma && beta) {
      for (std::int64_t j = 0; j < n; ++j) out[j] = (row[j] - m) * rs * gamma[j] + beta[j];
    } else {
      for (std::int64_t j = 0; j < n; ++j) {
        const float xhat = (row[j] - m) * rs;
        out[j] = (gamma ? xhat * gamma[j] : xhat) + (beta ? beta[j] : 0.0f);
      }
    }
  }
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void layernorm_forward(const LayerNormShape& s, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd) {
  layernorm_forward_clones(s, x, gamma, beta, y, mean, rstd);
}

namespace {

[[gnu::target_clones("avx2", "default")]] void layernorm_backward_clones(
    const LayerNormShape& s, const float* dy, const float* x, const float* mean, const float* rstd,
    const float* gamma, float* dx, float* dgamma, float* dbeta) {
  const std::int64_t n = s.cols;
  std::vector<double> dgamma_acc(n, 0.0), dbeta_acc(n, 0.0), dxhat(n), xhat(n);
  for (std::int64_t i = 0; i < s.rows; ++i) {
    const float* g = dy + i * n;
    const float* row = x + i * n;
    const double m = mean[i], r = rstd[i];
    // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gamma.
    for (std::int64_t j = 0; j < n; ++j) {
      xhat[j] = (row[j] - m) * r;
      dxhat[j] = gamma ? static_cast<double>(g[j]) * gamma[j] : static_cast<double>(g[j]);
      dgamma_acc[j] += g[j] * xhat[j];
      dbeta_acc[j] += g[j];
    }
    const double mean_dxhat =
        detail::lane_sum(n, [&](std::int64_t j) { return dxhat[j]; }) / static_cast<double>(n);
    const double mean_dxhat_xhat =
        detail::lane_sum(n, [&](std::int64_t j) { return dxhat[j] * xhat[j]; }) /
        static_cast<double>(n);
    float* out = dx + i * n;
    for (std::int64_t j = 0; j < n; ++j)
      out[j] = static_cast<float>(r * (dxhat[j] - mean_dxhat - xhat[j] * mean_dxhat_xhat));
  }
  if (dgamma)
    for (std::int64_t j = 0; j < n; ++j) dgamma[j] = static_cast<float>(dgamma[j] + dgamma_acc[j]);
  if (dbeta)
    for (std::int64_t j = 0; j < n; ++j) dbeta[j] = static_cast<float>(dbeta[j] + dbeta_acc[j]);
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void layernorm_backward(const LayerNormShape& s, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* gamma, float* dx, float* dgamma,
                        float* dbeta) {
  layernorm_backward_clones(s, dy, x, mean, rstd, gamma, dx, dgamma, dbeta);
}

}  // namespace lockstep::kernels::cpu
