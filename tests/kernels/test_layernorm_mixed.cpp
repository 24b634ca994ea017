// The mixed-type LayerNorm calls on the CPU (Note [low-type LayerNorm],
// kernels/layernorm.h), the twins the CUDA kernels are held to: forward, the
// fused residual add + LayerNorm, and backward with the stream's gradient
// added, against float64 loops of PyTorch's layer_norm formulas (whose
// backward is itself checked by central differences), at GPT-2's width and
// an odd one, for f32, f16 and bf16 inputs and outputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/half.h"
#include "kernels/layernorm.h"

using namespace lockstep;
namespace cpu = lockstep::kernels::cpu;

namespace {

std::vector<float> uniform(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Values stored in `type`: the bytes a kernel reads, and the values they hold.
struct Stored {
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};

Stored store(const std::vector<float>& v, DType type) {
  Stored s;
  s.bytes.resize(v.size() * dtype_size(type));
  s.values.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (type == DType::f32) {
      std::memcpy(&s.bytes[4 * i], &v[i], 4);
      s.values[i] = v[i];
    } else {
      const std::uint16_t h =
          type == DType::f16 ? kernels::f32_to_f16_bits(v[i]) : kernels::f32_to_bf16_bits(v[i]);
      std::memcpy(&s.bytes[2 * i], &h, 2);
      s.values[i] = type == DType::f16 ? kernels::f16_bits_to_f32(h) : kernels::bf16_bits_to_f32(h);
    }
  }
  return s;
}

std::vector<float> load(const std::vector<unsigned char>& bytes, DType type) {
  std::vector<float> v(bytes.size() / dtype_size(type));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (type == DType::f32) {
      std::memcpy(&v[i], &bytes[4 * i], 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, &bytes[2 * i], 2);
      v[i] = type == DType::f16 ? kernels::f16_bits_to_f32(h) : kernels::bf16_bits_to_f32(h);
    }
  }
  return v;
}

// PyTorch's layer_norm in float64: biased variance, y = xhat * gamma + beta.
struct Reference {
  std::vector<double> y, mean, rstd;
};

Reference layer_norm(const std::vector<double>& x, std::int64_t rows, std::int64_t cols,
                     const std::vector<float>& gamma, const std::vector<float>& beta, double eps) {
  Reference r{std::vector<double>(x.size()), std::vector<double>(rows), std::vector<double>(rows)};
  for (std::int64_t i = 0; i < rows; ++i) {
    double mu = 0, var = 0;
    for (std::int64_t j = 0; j < cols; ++j) mu += x[i * cols + j];
    mu /= cols;
    for (std::int64_t j = 0; j < cols; ++j) var += (x[i * cols + j] - mu) * (x[i * cols + j] - mu);
    const double rs = 1.0 / std::sqrt(var / cols + eps);
    r.mean[i] = mu;
    r.rstd[i] = rs;
    for (std::int64_t j = 0; j < cols; ++j)
      r.y[i * cols + j] = (x[i * cols + j] - mu) * rs * gamma[j] + beta[j];
  }
  return r;
}

// PyTorch's analytic layer_norm backward in float64: dx = rstd (dxhat -
// mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gamma; dgamma = sum dy
// xhat, dbeta = sum dy over rows.
struct Grads {
  std::vector<double> dx, dgamma, dbeta;
};

Grads layer_norm_backward(const std::vector<double>& x, const std::vector<double>& dy,
                          std::int64_t rows, std::int64_t cols, const std::vector<float>& gamma,
                          double eps) {
  const Reference f = layer_norm(x, rows, cols, gamma, std::vector<float>(cols, 0.0f), eps);
  Grads g{std::vector<double>(x.size()), std::vector<double>(cols), std::vector<double>(cols)};
  for (std::int64_t i = 0; i < rows; ++i) {
    double a = 0, b = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double xhat = (x[i * cols + j] - f.mean[i]) * f.rstd[i];
      a += dy[i * cols + j] * gamma[j];
      b += dy[i * cols + j] * gamma[j] * xhat;
      g.dgamma[j] += dy[i * cols + j] * xhat;
      g.dbeta[j] += dy[i * cols + j];
    }
    for (std::int64_t j = 0; j < cols; ++j) {
      const double xhat = (x[i * cols + j] - f.mean[i]) * f.rstd[i];
      g.dx[i * cols + j] = f.rstd[i] * (dy[i * cols + j] * gamma[j] - a / cols - xhat * b / cols);
    }
  }
  return g;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A low-type output is the f32 result rounded once: half an ulp, 2^-9 (bf16)
// or 2^-12 (f16) relative, more than the f32 error; checked at one ulp.
double rounding(DType type) {
  return type == DType::bf16 ? 1.0 / 256 : type == DType::f16 ? 1.0 / 2048 : 0.0;
}

}  // namespace

TEST_CASE("the float64 LayerNorm backward agrees with central differences",
          "[kernels][layernorm]") {
  // The reference the kernels are held to, checked once: d/dx of sum(w * y)
  // with h = 1e-6 has truncation error ~h^2 and rounding ~1e-16/h: 1e-7.
  const std::int64_t rows = 2, cols = 37;
  const auto x = widen(uniform(rows * cols, 1, -2.0f, 2.0f));
  const auto w = widen(uniform(rows * cols, 2, -1.0f, 1.0f));
  const auto gamma = uniform(cols, 3, 0.5f, 1.5f), beta = uniform(cols, 4, -0.5f, 0.5f);
  const Grads g = layer_norm_backward(x, w, rows, cols, gamma, 1e-5);
  auto loss = [&](const std::vector<double>& xs) {
    const Reference r = layer_norm(xs, rows, cols, gamma, beta, 1e-5);
    double l = 0;
    for (std::size_t k = 0; k < xs.size(); ++k) l += w[k] * r.y[k];
    return l;
  };
  for (const std::size_t k : {std::size_t{0}, std::size_t{18}, std::size_t{40}, std::size_t{73}}) {
    auto hi = x, lo = x;
    hi[k] += 1e-6;
    lo[k] -= 1e-6;
    CHECK(std::fabs((loss(hi) - loss(lo)) / 2e-6 - g.dx[k]) < 1e-7);
  }
}

// Tolerances, on top of each low output's rounding: outputs are f32 from f64
// statistics, a few f32 ulps (1e-5 relative, 1e-6 absolute); dx cancels in
// dxhat - mean(dxhat) - ..., from mean and rstd saved in f32: 1e-5 absolute;
// dgamma and dbeta are f64 sums rounded once: 1e-5 relative.
TEST_CASE("mixed-type LayerNorm forward, fused residual add and backward match float64",
          "[kernels][layernorm]") {
  const std::vector<std::pair<DType, DType>> types = {{DType::f32, DType::f32},
                                                      {DType::f32, DType::bf16},
                                                      {DType::f32, DType::f16},
                                                      {DType::bf16, DType::bf16},
                                                      {DType::f16, DType::f32}};
  for (const std::int64_t cols : {768, 37}) {
    for (const auto& [in_type, out_type] : types) {
      const std::int64_t rows = 5, n = rows * cols;
      INFO("cols " << cols << ", in " << dtype_name(in_type) << ", out " << dtype_name(out_type));
      const kernels::LayerNormShape s{rows, cols, 1e-5f};
      const auto gamma = uniform(cols, 3, 0.5f, 1.5f), beta = uniform(cols, 4, -0.5f, 0.5f);
      const Stored x = store(uniform(n, 1, -2.0f, 3.0f), in_type);
      const double out_tol = rounding(out_type), in_tol = rounding(in_type);

      // Forward: y in out_type from x in in_type.
      std::vector<unsigned char> y(n * dtype_size(out_type));
      std::vector<float> mean(rows), rstd(rows);
      cpu::layernorm_forward_mixed(s, x.bytes.data(), in_type, gamma.data(), beta.data(), y.data(),
                                   out_type, mean.data(), rstd.data());
      const Reference ref = layer_norm(widen(x.values), rows, cols, gamma, beta, 1e-5);
      const auto got = load(y, out_type);
      for (std::int64_t k = 0; k < n; ++k) {
        INFO("y " << k);
        REQUIRE(std::fabs(got[k] - ref.y[k]) <= 1e-6 + (1e-5 + out_tol) * std::fabs(ref.y[k]));
      }
      for (std::int64_t i = 0; i < rows; ++i) {
        CHECK(std::fabs(mean[i] - ref.mean[i]) <= 1e-6 * (1 + std::fabs(ref.mean[i])));
        CHECK(std::fabs(rstd[i] - ref.rstd[i]) <= 1e-6 * ref.rstd[i]);
      }

      // Fused add: the stream (f32) plus a branch in in_type, then the LayerNorm.
      const auto residual = uniform(n, 5, -1.0f, 1.0f);
      std::vector<float> sum(n);
      cpu::add_layernorm_forward(s, residual.data(), x.bytes.data(), in_type, gamma.data(),
                                 beta.data(), sum.data(), y.data(), out_type, mean.data(),
                                 rstd.data());
      std::vector<double> sum_ref(n);
      for (std::int64_t k = 0; k < n; ++k) {
        // Two floats of like size add exactly in f64: one rounding to f32 is IEEE's sum.
        sum_ref[k] = static_cast<double>(residual[k]) + x.values[k];
        REQUIRE(sum[k] == static_cast<float>(sum_ref[k]));
      }
      const Reference fused_ref = layer_norm(widen(sum), rows, cols, gamma, beta, 1e-5);
      const auto fused = load(y, out_type);
      for (std::int64_t k = 0; k < n; ++k) {
        INFO("fused y " << k);
        REQUIRE(std::fabs(fused[k] - fused_ref.y[k]) <=
                1e-6 + (1e-5 + out_tol) * std::fabs(fused_ref.y[k]));
      }

      // Backward: dy in out_type, x in in_type, the stream's gradient added;
      // dx in in_type (the input's), dgamma and dbeta added to 0.25.
      cpu::layernorm_forward_mixed(s, x.bytes.data(), in_type, gamma.data(), beta.data(), y.data(),
                                   out_type, mean.data(), rstd.data());
      const Stored dy = store(uniform(n, 6, -1.0f, 1.0f), out_type);
      const auto dresidual = uniform(n, 7, -0.5f, 0.5f);
      std::vector<unsigned char> dx(n * dtype_size(in_type));
      std::vector<float> dgamma(cols, 0.25f), dbeta(cols, 0.25f);
      cpu::layernorm_backward_mixed(s, dy.bytes.data(), out_type, x.bytes.data(), in_type,
                                    mean.data(), rstd.data(), gamma.data(), dresidual.data(),
                                    dx.data(), dgamma.data(), dbeta.data());
      const Grads g =
          layer_norm_backward(widen(x.values), widen(dy.values), rows, cols, gamma, 1e-5);
      const auto dx_got = load(dx, in_type);
      for (std::int64_t k = 0; k < n; ++k) {
        INFO("dx " << k);
        const double want = g.dx[k] + dresidual[k];
        REQUIRE(std::fabs(dx_got[k] - want) <= 1e-5 + (1e-5 + in_tol) * std::fabs(want));
      }
      for (std::int64_t j = 0; j < cols; ++j) {
        INFO("column " << j);
        REQUIRE(std::fabs(dgamma[j] - (0.25 + g.dgamma[j])) <= 1e-5 * (1 + std::fabs(g.dgamma[j])));
        REQUIRE(std::fabs(dbeta[j] - (0.25 + g.dbeta[j])) <= 1e-5 * (1 + std::fabs(g.dbeta[j])));
      }
    }
  }
}

TEST_CASE("the residual add widens the branch and adds in f32, in place too",
          "[kernels][layernorm]") {
  for (const DType type : {DType::f32, DType::bf16, DType::f16}) {
    INFO(dtype_name(type));
    const std::int64_t n = 1001;
    const Stored branch = store(uniform(n, 8, -4.0f, 4.0f), type);
    auto stream = uniform(n, 9, -4.0f, 4.0f);
    const auto before = stream;
    cpu::residual_add(n, stream.data(), branch.bytes.data(), type, stream.data());
    for (std::int64_t k = 0; k < n; ++k)
      REQUIRE(stream[k] == static_cast<float>(static_cast<double>(before[k]) + branch.values[k]));
  }
}
