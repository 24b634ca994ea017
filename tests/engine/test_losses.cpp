// Cross-entropy, MSE and the accuracy count against hand-computed values and
// finite differences.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/nn/loss.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {
core::Tensor labels(std::vector<std::int64_t> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return core::Tensor::from_vector(v, {n}, DType::i64);
}
}  // namespace

TEST_CASE("cross-entropy is the mean over counted rows of -log softmax", "[engine][loss]") {
  CrossEntropyLoss loss(-100);
  Context ctx;
  // Row 0: logits (0, ln 3), label 1: p = 3/4, loss = -ln(3/4). Row 1 ignored.
  // Row 2: logits (0, 0), label 0: loss = ln 2.
  const core::Tensor logits =
      core::Tensor::from_vector<float>({0, std::log(3.0f), 5, -5, 0, 0}, {3, 2}, DType::f32);
  const float value = loss.forward(logits, labels({1, -100, 0}), ctx).to_vector<float>()[0];
  CHECK(value == Approx((-std::log(0.75) + std::log(2.0)) / 2).epsilon(1e-6));
  CHECK(loss.counted_rows().to_vector<float>()[0] == 2.0f);
  const auto d = loss.backward(1.0f, ctx).to_vector<float>();
  // (p - onehot) / count on counted rows, zero on the ignored one.
  CHECK(d[0] == Approx(0.25 / 2));
  CHECK(d[1] == Approx(-0.25 / 2));
  CHECK(d[2] == 0.0f);
  CHECK(d[3] == 0.0f);
  CHECK(d[4] == Approx(-0.5 / 2));
}

TEST_CASE("cross-entropy over many classes matches a float64 softmax, -inf and NaN included",
          "[engine][loss]") {
  // The vectorised f32 softmax (kernels/detail/vector_softmax.h): exp within
  // 2 ulp, f64 sums. 301 classes (not a multiple of the vector width), logits
  // up to +-24, one -inf logit (probability exactly 0), one ignored row.
  // Tolerances: the loss (about ln 301 = 5.7) to 1e-6 relative, each
  // gradient element to 1e-7 absolute (a few f32 ulp of probabilities <= 1,
  // divided by 3 counted rows).
  const std::int64_t rows = 4, classes = 301;
  core::Tensor logits = test::random_f32({rows, classes}, 11, 8.0f);
  float* x = logits.data_as<float>();
  x[classes + 17] = -std::numeric_limits<float>::infinity();
  const std::vector<std::int64_t> y{5, 300, -100, 0};
  CrossEntropyLoss loss(-100);
  Context ctx;
  const double got = loss.forward(logits, labels(y), ctx).to_vector<float>()[0];
  const auto d = loss.backward(1.0f, ctx).to_vector<float>();
  double want = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double max = -1e300, sum = 0;
    for (std::int64_t j = 0; j < classes; ++j) max = std::max(max, double{x[r * classes + j]});
    for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(x[r * classes + j] - max);
    if (y[r] >= 0) want += std::log(sum) - (x[r * classes + y[r]] - max);
    for (std::int64_t j = 0; j < classes; ++j) {
      const double p = std::exp(x[r * classes + j] - max) / sum;
      const double g = y[r] < 0 ? 0.0 : (p - (j == y[r] ? 1.0 : 0.0)) / 3;
      INFO("row " << r << ", class " << j);
      CHECK(d[r * classes + j] == Approx(g).margin(1e-7).epsilon(0));
    }
  }
  CHECK(d[classes + 17] == 0.0f);
  CHECK(got == Approx(want / 3).epsilon(1e-6));
  x[2 * classes + 40] = std::numeric_limits<float>::quiet_NaN();  // in the ignored row: no effect
  CHECK(std::isfinite(loss.forward(logits, labels(y), ctx).to_vector<float>()[0]));
  x[3 * classes + 40] = std::numeric_limits<float>::quiet_NaN();  // in a counted row: NaN
  CHECK(std::isnan(loss.forward(logits, labels(y), ctx).to_vector<float>()[0]));
}

TEST_CASE("cross-entropy gradient matches finite differences", "[engine][loss]") {
  CrossEntropyLoss loss;
  Context ctx;
  core::Tensor logits = test::random_f32({5, 7}, 3, 3.0f);
  const core::Tensor y = labels({0, 6, 3, 3, 1});
  loss.forward(logits, y, ctx);
  const auto analytic = loss.backward(2.0f, ctx).to_vector<float>();
  float* x = logits.data_as<float>();
  for (int i = 0; i < 35; ++i) {
    const float saved = x[i];
    x[i] = saved + 1e-2f;
    const double plus = loss.forward(logits, y, ctx).to_vector<float>()[0];
    x[i] = saved - 1e-2f;
    const double minus = loss.forward(logits, y, ctx).to_vector<float>()[0];
    x[i] = saved;
    // Tolerance as in tests/support/gradcheck.h, for the objective 2 * loss.
    CHECK(analytic[i] == Approx(2 * (plus - minus) / 2e-2).margin(2e-3).epsilon(1e-2));
  }
}

TEST_CASE("a label outside the classes is an error naming it", "[engine][loss]") {
  CrossEntropyLoss loss;
  Context ctx;
  CHECK_THROWS_WITH(loss.forward(test::random_f32({2, 3}, 1), labels({0, 3}), ctx),
                    Catch::Contains("label 3") && Catch::Contains("[0, 3)"));
  CHECK_THROWS_WITH(loss.forward(test::random_f32({2, 3}, 1), labels({0}), ctx),
                    Catch::Contains("[1]") && Catch::Contains("[2]"));
}

TEST_CASE("MSE is the mean of squared differences", "[engine][loss]") {
  MSELoss mse;
  Context ctx;
  const core::Tensor p = core::Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}, DType::f32);
  const core::Tensor t = core::Tensor::from_vector<float>({1, 0, 3, 1}, {2, 2}, DType::f32);
  CHECK(mse.forward(p, t, ctx).to_vector<float>()[0] == Approx((4.0 + 9.0) / 4));
  CHECK(mse.backward(1.0f, ctx).to_vector<float>() == std::vector<float>{0, 1, 0, 1.5f});
}

TEST_CASE("count_correct counts argmax hits and skips ignored rows", "[engine][metric]") {
  const core::Tensor logits =
      core::Tensor::from_vector<float>({1, 2, 3, 3, 2, 1, 5, 5, 0, 0, 1, 0}, {4, 3}, DType::f32);
  // argmax: 2, 0, 0 (first of the tie), 1
  CHECK(count_correct(logits, labels({2, 1, 0, -100}), {}).to_vector<float>()[0] == 2.0f);
}
