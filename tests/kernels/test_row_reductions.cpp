// The CPU row kernels whose f64 reductions run over eight lanes
// (kernels/detail/lane_sum.h): LayerNorm and the causal softmax, forward and
// backward, against float64 loops, at widths with and without a tail past the
// last whole group of eight, the softmax run in place, and its vector and
// scalar paths giving an input the same bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention.h"
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

}  // namespace

// Tolerances: outputs are f32 from f64 statistics, so a few f32 ulps (1e-5
// relative, 1e-6 absolute near 0); backward saves mean and rstd rounded to
// f32, which moves dx by about 1e-7 relative before the cancellation in
// dxhat - mean(dxhat) - ..., hence 1e-5 absolute on O(1) gradients.
TEST_CASE("LayerNorm forward and backward match a float64 loop at any width",
          "[kernels][layernorm]") {
  for (const std::int64_t cols : {3, 8, 37, 128}) {
    const std::int64_t rows = 5;
    const kernels::LayerNormShape s{rows, cols, 1e-5f};
    auto x = uniform(rows * cols, 1, -2.0f, 2.0f);
    for (auto& v : x) v += 10.0f;  // an offset that a one-pass variance would lose
    const auto gamma = uniform(cols, 2, 0.5f, 1.5f), beta = uniform(cols, 3, -1.0f, 1.0f);
    const auto dy = uniform(rows * cols, 4, -1.0f, 1.0f);
    std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols);
    std::vector<float> dgamma(cols, 0.5f), dbeta(cols, -0.5f);  // backward accumulates
    cpu::layernorm_forward(s, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                           rstd.data());
    cpu::layernorm_backward(s, dy.data(), x.data(), mean.data(), rstd.data(), gamma.data(),
                            dx.data(), dgamma.data(), dbeta.data());
    std::vector<double> ref_dgamma(cols, 0.5), ref_dbeta(cols, -0.5);
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* row = x.data() + i * cols;
      double mu = 0.0, var = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) mu += row[j];
      mu /= cols;
      for (std::int64_t j = 0; j < cols; ++j) var += (row[j] - mu) * (row[j] - mu);
      const double r = 1.0 / std::sqrt(var / cols + 1e-5);
      CHECK(mean[i] == Approx(mu).epsilon(1e-6));
      CHECK(rstd[i] == Approx(r).epsilon(1e-6));
      double m1 = 0.0, m2 = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) {
        const double xhat = (row[j] - mu) * r, g = dy[i * cols + j];
        CHECK(y[i * cols + j] == Approx(xhat * gamma[j] + beta[j]).epsilon(1e-5).margin(1e-6));
        m1 += g * gamma[j];
        m2 += g * gamma[j] * xhat;
        ref_dgamma[j] += g * xhat;
        ref_dbeta[j] += g;
      }
      m1 /= cols;
      m2 /= cols;
      for (std::int64_t j = 0; j < cols; ++j) {
        const double xhat = (row[j] - mu) * r;
        const double want = r * (dy[i * cols + j] * gamma[j] - m1 - xhat * m2);
        CHECK(dx[i * cols + j] == Approx(want).epsilon(1e-5).margin(1e-5));
      }
    }
    for (std::int64_t j = 0; j < cols; ++j) {
      CHECK(dgamma[j] == Approx(ref_dgamma[j]).epsilon(1e-5).margin(1e-5));
      CHECK(dbeta[j] == Approx(ref_dbeta[j]).epsilon(1e-5).margin(1e-5));
    }
  }
}

// Tolerances: exp is within 2 ulp (kernels/detail/vector_exp.h) and the row
// sum is f64, so probabilities are within 1e-5 relative (1e-7 absolute for
// the tiny ones); dscores = scale p (dp - dot) with dot rounded to f32, 1e-6
// absolute on O(1) inputs.
TEST_CASE("the causal softmax matches a float64 loop and runs in place", "[kernels][attention]") {
  for (const std::int64_t seq : {5, 16, 21}) {
    const std::int64_t matrices = 3, n = matrices * seq * seq;
    const float scale = 0.35f;
    const auto scores = uniform(n, 7, -8.0f, 8.0f), dprobs = uniform(n, 8, -1.0f, 1.0f);
    std::vector<float> probs(n, -1.0f), dscores(n, -1.0f);
    cpu::causal_softmax_forward(matrices, seq, scale, scores.data(), probs.data());
    cpu::causal_softmax_backward(matrices, seq, scale, probs.data(), dprobs.data(), dscores.data());
    for (std::int64_t r = 0; r < matrices * seq; ++r) {
      const std::int64_t i = r % seq;
      const float *in = scores.data() + r * seq, *dp = dprobs.data() + r * seq;
      double max = in[0] * static_cast<double>(scale), sum = 0.0, dot = 0.0;
      for (std::int64_t j = 1; j <= i; ++j) max = std::max(max, in[j] * static_cast<double>(scale));
      for (std::int64_t j = 0; j <= i; ++j)
        sum += std::exp(in[j] * static_cast<double>(scale) - max);
      for (std::int64_t j = 0; j <= i; ++j)
        dot += std::exp(in[j] * static_cast<double>(scale) - max) / sum * dp[j];
      for (std::int64_t j = 0; j < seq; ++j) {
        const double p = j <= i ? std::exp(in[j] * static_cast<double>(scale) - max) / sum : 0.0;
        const double ds = j <= i ? scale * p * (dp[j] - dot) : 0.0;
        CHECK(probs[r * seq + j] == Approx(p).epsilon(1e-5).margin(1e-7));
        CHECK(dscores[r * seq + j] == Approx(ds).margin(1e-6));
      }
    }
    // In place (kernels/attention.h allows it): the same bits.
    std::vector<float> inplace = scores;
    cpu::causal_softmax_forward(matrices, seq, scale, inplace.data(), inplace.data());
    CHECK(inplace == probs);
    inplace = dprobs;
    cpu::causal_softmax_backward(matrices, seq, scale, probs.data(), inplace.data(),
                                 inplace.data());
    CHECK(inplace == dscores);
  }
}

TEST_CASE("the causal softmax keeps a NaN in any lane", "[kernels][attention]") {
  // Row 11 of a 12 x 12 matrix: a NaN at column 0 (which seeds every lane of
  // the max), at column 5 (lane 5 of the first group of eight) or at column 9
  // (in the tail past it).
  for (const std::int64_t col : {0, 5, 9}) {
    const std::int64_t seq = 12;
    std::vector<float> scores(seq * seq, 1.0f), probs(seq * seq);
    scores[11 * seq + col] = NAN;
    cpu::causal_softmax_forward(1, seq, 1.0f, scores.data(), probs.data());
    for (std::int64_t j = 0; j < seq; ++j) CHECK(std::isnan(probs[11 * seq + j]));
    CHECK(probs[10 * seq] == Approx(1.0 / 11));
  }
}

// Note [softmax in vectors] (kernels/detail/vector_softmax.h): a row of 31
// takes its exponentials two vectors at a time (columns 0-15), one vector
// (16-23) and one at a time (24-30). The same seven inputs at columns 0-6,
// 16-22 and 24-30 must give the same bits in all three places: an
// element's probability depends on its value, never on the path that took
// it. The inputs span [-120, 8] after scaling, below the -87 where the
// exponential is 0, and -inf.
TEST_CASE("the causal softmax gives an input the same bits in a vector lane and in the tail",
          "[kernels][attention]") {
  const std::int64_t seq = 32, row = 30, matrices = 200;
  std::vector<float> scores(matrices * seq * seq, 0.0f), probs(scores.size());
  const auto values = uniform(matrices * 7, 11, -240.0f, 16.0f);
  for (std::int64_t m = 0; m < matrices; ++m) {
    float* in = scores.data() + (m * seq + row) * seq;
    for (std::int64_t k = 0; k < 7; ++k) {
      const float v = m == 0 && k == 3 ? -INFINITY : values[m * 7 + k];
      in[k] = in[16 + k] = in[24 + k] = v;
    }
  }
  cpu::causal_softmax_forward(matrices, seq, 0.5f, scores.data(), probs.data());
  for (std::int64_t m = 0; m < matrices; ++m) {
    const float* p = probs.data() + (m * seq + row) * seq;
    for (std::int64_t k = 0; k < 7; ++k) {
      INFO("matrix " << m << ", input " << scores[(m * seq + row) * seq + k]);
      CHECK(std::memcmp(&p[k], &p[16 + k], sizeof(float)) == 0);
      CHECK(std::memcmp(&p[k], &p[24 + k], sizeof(float)) == 0);
    }
  }
}
