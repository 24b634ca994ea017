// Cross-entropy, MSE and the accuracy count against hand-computed values and
// finite differences; the fused cross-entropy's CPU twin against PyTorch's
// float64 formula and the unfused path's bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/loss.h"
#include "kernels/classification.h"
#include "kernels/half.h"
#include "support/gradcheck.h"
#include "support/xent_cases.h"

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

namespace {

// PyTorch's elementwise formulas in float64, before the mean.
double reference_loss(const std::string& kind, double p, double t, double delta) {
  const double d = p - t;
  if (kind == "mse") return d * d;
  if (kind == "l1") return std::fabs(d);
  if (kind == "huber")
    return std::fabs(d) <= delta ? 0.5 * d * d : delta * (std::fabs(d) - 0.5 * delta);
  // bce: -(t log sigmoid(p) + (1 - t) log(1 - sigmoid(p)))
  const double s = 1.0 / (1.0 + std::exp(-p));
  return -(t * std::log(s) + (1 - t) * std::log(1 - s));
}

}  // namespace

TEST_CASE("elementwise losses match PyTorch's float64 formulas, forward and central differences",
          "[engine][loss]") {
  // Predictions in [-3, 3] and targets in [-2, 2] (in [0, 1] for bce), kept
  // at least 0.05 away from the kinks of L1 (d = 0) and Huber (|d| = delta),
  // where the central difference with step 1e-4 would straddle them. The
  // forward is an f64 sum of f32 terms: 1e-6 relative. The gradient is f32
  // arithmetic on O(1) values over 6 x 5 = 30 elements: 1e-6 absolute
  // against a float64 central difference (truncation O(1e-8)).
  const core::Shape shape{6, 5};
  const std::int64_t n = core::shape_numel(shape);
  for (const std::string kind : {"mse", "l1", "huber", "bce"}) {
    INFO(kind);
    const float delta = 0.7f;
    std::unique_ptr<Loss> loss =
        kind == "huber" ? std::make_unique<HuberLoss>(delta) : make_loss(kind);
    core::Tensor p = test::random_f32(shape, 3, 3.0f), t = test::random_f32(shape, 4, 2.0f);
    float *pv = p.data_as<float>(), *tv = t.data_as<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      if (kind == "bce") tv[i] = 0.5f * (tv[i] + 2.0f) / 2.0f;  // in [0, 1]
      const float d = pv[i] - tv[i];
      if (std::fabs(d) < 0.05f || std::fabs(std::fabs(d) - delta) < 0.05f) pv[i] += 0.2f;
    }
    auto mean = [&](const std::vector<double>& pred) {
      double sum = 0;
      for (std::int64_t i = 0; i < n; ++i) sum += reference_loss(kind, pred[i], tv[i], delta);
      return sum / static_cast<double>(n);
    };
    std::vector<double> pd(pv, pv + n);
    Context ctx;
    const double got = loss->forward(p, t, ctx).to_vector<float>()[0];
    CHECK(got == Approx(mean(pd)).epsilon(1e-6));
    CHECK(loss->counted_rows().to_vector<float>()[0] == 6.0f);
    const float dloss = 1.5f;  // the gradient is scaled by the objective's
    const auto grad = loss->backward(dloss, ctx).to_vector<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      std::vector<double> up = pd, down = pd;
      up[i] += 1e-4, down[i] -= 1e-4;
      const double numeric = dloss * (mean(up) - mean(down)) / 2e-4;
      REQUIRE(grad[i] == Approx(numeric).margin(1e-6));
    }
    CHECK_FALSE(loss->count_correct(p, t, {}).defined());  // regression has no accuracy
  }
}

TEST_CASE("cross-entropy with label smoothing matches PyTorch's float64 formula",
          "[engine][loss]") {
  // loss_row = (1 - e) (-log p_y) + e mean_c(-log p_c), the mean over counted
  // rows; gradient (p - (1 - e) onehot - e / C) / rows, checked against
  // float64 central differences. Tolerances as in the test above.
  const std::int64_t rows = 3, classes = 7;
  const float e = 0.1f;
  const core::Tensor logits = test::random_f32({rows, classes}, 21, 2.0f);
  const std::vector<std::int64_t> y{4, -100, 0};
  const auto x = logits.to_vector<float>();
  auto reference = [&](const std::vector<double>& z) {
    double total = 0;
    int counted = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      if (y[r] == -100) continue;
      double m = -1e300, sum = 0, mean_neg_log_p = 0;
      for (std::int64_t c = 0; c < classes; ++c) m = std::max(m, z[r * classes + c]);
      for (std::int64_t c = 0; c < classes; ++c) sum += std::exp(z[r * classes + c] - m);
      const double lse = std::log(sum) + m;
      for (std::int64_t c = 0; c < classes; ++c)
        mean_neg_log_p += (lse - z[r * classes + c]) / classes;
      total += (1 - e) * (lse - z[r * classes + y[r]]) + e * mean_neg_log_p;
      ++counted;
    }
    return total / counted;
  };
  CrossEntropyLoss loss(-100, e);
  Context ctx;
  const std::vector<double> xd(x.begin(), x.end());
  CHECK(loss.forward(logits, labels(y), ctx).to_vector<float>()[0] ==
        Approx(reference(xd)).epsilon(1e-6));
  const auto grad = loss.backward(1.0f, ctx).to_vector<float>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<double> up = xd, down = xd;
    up[i] += 1e-4, down[i] -= 1e-4;
    REQUIRE(grad[i] == Approx((reference(up) - reference(down)) / 2e-4).margin(1e-6));
  }
  CHECK_THROWS_WITH(CrossEntropyLoss(-100, 1.5f), Catch::Contains("label_smoothing is 1.5"));
}

TEST_CASE("losses are made by their program names, and others are refused naming the choices",
          "[engine][loss]") {
  CHECK(make_loss("cross-entropy")->describe() ==
        "cross-entropy ignore_index=-100 label_smoothing=0");
  CHECK(make_loss("mse")->describe() == "mse");
  CHECK(make_loss("huber")->describe() == "huber delta=1");
  CHECK_THROWS_WITH(make_loss("hinge"),
                    Catch::Contains("unknown loss 'hinge'") &&
                        Catch::Contains("cross-entropy, mse, l1, huber or bce"));
  MSELoss mse;
  Context ctx;
  CHECK_THROWS_WITH(mse.forward(test::random_f32({2, 3}, 1), test::random_f32({2, 2}, 1), ctx),
                    Catch::Contains("[2, 3]") && Catch::Contains("[2, 2]"));
  CHECK_THROWS_WITH(mse.forward(test::random_f32({2}, 1), labels({0, 1}), ctx),
                    Catch::Contains("must be f32, f16 or bf16"));
}

TEST_CASE("the fused cross-entropy's cpu twin matches PyTorch's float64 formula over 16-bit logits",
          "[engine][loss]") {
  // kernels::cpu::softmax_xent_fused (Note [fused cross-entropy]) against
  // F.cross_entropy(x, y, ignore_index=-100, label_smoothing=e) in float64
  // (tests/support/xent_cases.h), at odd shapes (13 and 1001 classes, 7 and 11
  // rows) and gpt2's vocabulary, with ignored rows, ties and i32 and i64
  // labels. dloss is a loss scale over 3 micro-batches, 2^16 / 3.
  // Tolerances: the loss to 1e-6 relative (f32 exponentials within 2 ulp
  // summed in f64, so each row's log-sum-exp is within 2.4e-7, and each row's
  // loss is rounded to f32); the count and the hits exactly. Each gradient
  // element (p - target) scale is f32 arithmetic (scale = dloss / count): p
  // within 2^-21 relative (the exponential's 2 ulp, the product with 1 / sum),
  // the subtraction and the product rounded once each, so within 2^-20 (p +
  // target) scale; then rounded to nearest in its dtype, within half an ulp:
  // 2^-8 (bf16) or 2^-11 (f16) of the rounded value, or f16's subnormal
  // half-spacing 2^-25.
  struct Shape {
    std::int64_t rows, classes;
  };
  for (const Shape shape : {Shape{7, 1001}, Shape{11, 13}, Shape{3, 50304}}) {
    for (const DType type : {DType::bf16, DType::f16}) {
      for (const float e : {0.0f, 0.1f}) {
        const DType label_type = shape.classes == 13 ? DType::i32 : DType::i64;
        INFO(shape.rows << " x " << shape.classes << " " << dtype_name(type) << ", smoothing "
                        << e);
        const test::XentCase c =
            test::make_xent_case(shape.rows, shape.classes, type, label_type, -100, 5);
        const float dloss = 65536.0f / 3.0f;
        const kernels::ClassificationShape s{shape.rows, shape.classes, -100, label_type, e};
        std::vector<std::uint16_t> grad(c.bits.size());
        float loss = 0, count = 0, correct = 0;
        kernels::cpu::softmax_xent_fused(s, type, c.bits.data(), c.label_bytes.data(), dloss,
                                         grad.data(), &loss, &count, &correct);
        const test::XentReference want =
            test::xent_reference(c.values, c.labels, shape.classes, -100, e, dloss);
        CHECK(loss == Approx(want.loss).epsilon(1e-6));
        CHECK(count == want.count);
        CHECK(correct == want.correct);
        CHECK(want.correct >= 1);  // the rows labelled with their argmax
        const double scale = dloss / want.count;
        const double rel = type == DType::bf16 ? 0x1p-8 : 0x1p-11;
        const double sub = type == DType::f16 ? 0x1p-25 : 0.0;
        for (std::size_t k = 0; k < grad.size(); ++k) {
          const float got = type == DType::bf16 ? kernels::bf16_bits_to_f32(grad[k])
                                                : kernels::f16_bits_to_f32(grad[k]);
          const double target = test::xent_target(c.labels, shape.classes, -100, e, k);
          const double f32_error = 0x1p-20 * (std::fabs(want.grad[k]) + 2 * target * scale);
          const double tol = rel * std::fabs(got) + f32_error + sub;
          INFO("element " << k << ": twin " << got << ", float64 " << want.grad[k]);
          REQUIRE(std::fabs(got - want.grad[k]) <= tol);
        }
        // In place (dlogits = logits) gives the same bits.
        std::vector<std::uint16_t> in_place = c.bits;
        kernels::cpu::softmax_xent_fused(s, type, in_place.data(), c.label_bytes.data(), dloss,
                                         in_place.data(), &loss, &count, &correct);
        CHECK(in_place == grad);
      }
    }
  }
}

TEST_CASE("the fused twin is the cpu cross-entropy's forward, backward and cast, bit for bit",
          "[engine][loss]") {
  // Note [fused cross-entropy] defines the fused result as the unfused path's;
  // on the CPU CrossEntropyLoss keeps that path (Note [cross-entropy paths]),
  // announced backward or not.
  const std::int64_t rows = 9, classes = 1001;
  const test::XentCase c = test::make_xent_case(rows, classes, DType::bf16, DType::i64, -100, 8);
  const core::Tensor logits =
      core::Tensor::from_host(c.bits.data(), {rows, classes}, DType::bf16, core::Device::cpu());
  const float dloss = 0.25f;
  const kernels::ClassificationShape s{rows, classes, -100, DType::i64, 0.1f};
  std::vector<std::uint16_t> grad(c.bits.size());
  float loss = 0, count = 0, correct = 0;
  kernels::cpu::softmax_xent_fused(s, DType::bf16, c.bits.data(), c.labels.data(), dloss,
                                   grad.data(), &loss, &count, &correct);
  CrossEntropyLoss ce(-100, 0.1f);
  Context ctx;
  ce.expect_backward(dloss);
  CHECK(ce.forward(logits, labels(c.labels), ctx).to_vector<float>()[0] == loss);
  CHECK(std::string(ce.path()) == "f32");
  CHECK(ce.counted_rows().to_vector<float>()[0] == count);
  const core::Tensor d = ce.backward(dloss, ctx);
  REQUIRE(d.dtype() == DType::bf16);
  CHECK(d.to_vector<std::uint16_t>() == grad);
  CHECK(count_correct(logits, labels(c.labels), {}).to_vector<float>()[0] == correct);
  CHECK(logits.to_vector<std::uint16_t>() == c.bits);  // the CPU path leaves the logits alone
}
