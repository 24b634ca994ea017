// CPU LayerNorm (kernels/layernorm.h); row statistics accumulate in f64, over
// eight lanes (kernels/detail/lane_sum.h) so that the reductions vectorise.
// Each function has an AVX2 clone besides the baseline one (chosen at load
// time), as the activations have (Note [vector tanh] in activation.cpp). The
// mixed-type calls compose the f32 ones with casts and adds (Note [low-type
// LayerNorm]): the CUDA kernels' twins.
#include "kernels/layernorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/detail/lane_sum.h"
#include "kernels/elementwise.h"

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

namespace {

// `n` elements of `src` (in `type`) as f32: `src` itself when it is f32, else
// widened into `scratch`.
const float* as_f32(const void* src, DType type, std::int64_t n, std::vector<float>& scratch) {
  if (type == DType::f32) return static_cast<const float*>(src);
  scratch.resize(static_cast<std::size_t>(n));
  cast(src, type, scratch.data(), DType::f32, n);
  return scratch.data();
}

// Where an f32 result for `dst` (in `type`) goes before it is rounded: `dst`
// itself when it is f32, else `scratch`.
float* f32_out(void* dst, DType type, std::int64_t n, std::vector<float>& scratch) {
  if (type == DType::f32) return static_cast<float*>(dst);
  scratch.resize(static_cast<std::size_t>(n));
  return scratch.data();
}

void store(const float* result, void* dst, DType type, std::int64_t n) {
  if (type != DType::f32) cast(result, DType::f32, dst, type, n);
}

}  // namespace

// Note [low-type LayerNorm]: LayerNorm's module widened a low input, ran the
// f32 call, and the next Linear rounded its output; these do the same.
void layernorm_forward_mixed(const LayerNormShape& s, const void* x, DType x_type,
                             const float* gamma, const float* beta, void* y, DType y_type,
                             float* mean, float* rstd) {
  const std::int64_t n = s.rows * s.cols;
  std::vector<float> x32, y32;
  float* out = f32_out(y, y_type, n, y32);
  layernorm_forward(s, as_f32(x, x_type, n, x32), gamma, beta, out, mean, rstd);
  store(out, y, y_type, n);
}

// Residual::forward's add (the branch widened, then branch + shortcut in f32),
// then the LayerNorm.
void add_layernorm_forward(const LayerNormShape& s, const float* residual, const void* branch,
                           DType branch_type, const float* gamma, const float* beta, float* sum,
                           void* y, DType y_type, float* mean, float* rstd) {
  residual_add(s.rows * s.cols, residual, branch, branch_type, sum);
  layernorm_forward_mixed(s, sum, DType::f32, gamma, beta, y, y_type, mean, rstd);
}

// The f32 backward on widened dy and x; then Residual::backward's add (the
// LayerNorm's dx + the stream's gradient, in f32), then rounding to x's type.
void layernorm_backward_mixed(const LayerNormShape& s, const void* dy, DType dy_type, const void* x,
                              DType x_type, const float* mean, const float* rstd,
                              const float* gamma, const float* dresidual, void* dx, float* dgamma,
                              float* dbeta) {
  const std::int64_t n = s.rows * s.cols;
  std::vector<float> dy32, x32, dx32(static_cast<std::size_t>(n));
  layernorm_backward(s, as_f32(dy, dy_type, n, dy32), as_f32(x, x_type, n, x32), mean, rstd, gamma,
                     dx32.data(), dgamma, dbeta);
  if (dresidual) add(dx32.data(), dresidual, dx32.data(), DType::f32, n);
  if (x_type == DType::f32) {
    std::copy(dx32.begin(), dx32.end(), static_cast<float*>(dx));
  } else {
    cast(dx32.data(), DType::f32, dx, x_type, n);
  }
}

void residual_add(std::int64_t n, const float* residual, const void* branch, DType branch_type,
                  float* out) {
  std::vector<float> branch32;
  add(as_f32(branch, branch_type, n, branch32), residual, out, DType::f32, n);
}

}  // namespace lockstep::kernels::cpu
