// Linear, activations, Dropout, Flatten, LayerNorm and Embedding on the CPU:
// finite-difference gradients (tests/support/gradcheck.h), known values, and
// the errors that name a layer.
#include <catch2/catch.hpp>

#include <cmath>
#include <span>

#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/embedding.h"
#include "engine/nn/linear.h"
#include "engine/nn/norm.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using lockstep::test::check_gradients;
using lockstep::test::random_f32;

TEST_CASE("Linear gradients match finite differences on odd shapes", "[engine][linear]") {
  for (auto [batch, in, out] : {std::tuple{1, 1, 1}, {3, 7, 5}, {13, 33, 17}}) {
    for (bool bias : {true, false}) {
      Linear fc(in, out, bias);
      initialize(fc, 7);
      check_gradients(fc, random_f32({batch, in}, 3));
    }
  }
}

TEST_CASE("Linear computes x W^T + b", "[engine][linear]") {
  Linear fc(2, 2);
  fc.weight().value.copy_from(core::Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}, DType::f32));
  fc.bias()->value.copy_from(core::Tensor::from_vector<float>({10, 20}, {2}, DType::f32));
  Context ctx;
  const auto y = fc.forward(core::Tensor::from_vector<float>({1, 1}, {1, 2}, DType::f32), ctx);
  CHECK(y.to_vector<float>() == std::vector<float>{13, 27});
}

TEST_CASE("a shape that does not fit names the layer and both shapes", "[engine][linear]") {
  Sequential net;
  net.emplace<Linear>("fc1", 4, 3);
  net.emplace<Linear>("fc2", 5, 2);
  net.assign_names();
  Context ctx;
  CHECK_THROWS_WITH(net.forward(random_f32({2, 4}, 1), ctx), Catch::Contains("Linear 'fc2'") &&
                                                                 Catch::Contains("[2, 3]") &&
                                                                 Catch::Contains("[batch, 5]"));
}

TEST_CASE("Linear under CPU autocast rounds like the low type and overflows like it",
          "[engine][linear][autocast]") {
  Linear fc(33, 9);
  initialize(fc, 5);
  const core::Tensor x = random_f32({7, 33}, 4);
  Context f32;
  const auto reference = fc.forward(x, f32).to_vector<float>();
  // Inputs and weights rounded to the low type (relative error u each), f32
  // accumulation, output rounded once: |error| <= (2u + u) sum|x w| + |b| u,
  // with sum|x w| <= 33 here; u = 2^-11 (f16) or 2^-8 (bf16).
  for (auto [type, u] : {std::pair{DType::f16, 1.0 / 2048}, std::pair{DType::bf16, 1.0 / 256}}) {
    Context low;
    low.autocast = type;
    const core::Tensor y = fc.forward(x, low);
    REQUIRE(y.dtype() == type);
    const auto got = y.cast(DType::f32).to_vector<float>();
    for (std::size_t i = 0; i < got.size(); ++i)
      REQUIRE(std::fabs(got[i] - reference[i]) <= 3 * u * 33 + u);
  }
  Linear big(1, 1, false);
  big.weight().value.fill_(300.0);
  Context f16;
  f16.autocast = DType::f16;
  const auto y = big.forward(core::Tensor::from_vector<float>({300.0f}, {1, 1}, DType::f32), f16);
  CHECK(std::isinf(y.cast(DType::f32).to_vector<float>()[0]));  // 90000 > 65504
}

TEST_CASE("autocast makes the low weight copy once per weight version",
          "[engine][linear][autocast]") {
  Linear fc(3, 2, false);
  fc.weight().value.fill_(1.0);
  Context ctx;
  ctx.autocast = DType::bf16;
  const core::Tensor x = core::Tensor::from_vector<float>({1, 1, 1}, {1, 3}, DType::f32);
  CHECK(fc.forward(x, ctx).cast(DType::f32).to_vector<float>() == std::vector<float>{3, 3});
  fc.weight().value.fill_(2.0);  // changed without a version bump: the copy is kept
  CHECK(fc.forward(x, ctx).cast(DType::f32).to_vector<float>() == std::vector<float>{3, 3});
  ++fc.weight().version;
  CHECK(fc.forward(x, ctx).cast(DType::f32).to_vector<float>() == std::vector<float>{6, 6});
}

TEST_CASE("ReLU and GELU match their formulas and gradients", "[engine][activation]") {
  Context ctx;
  const core::Tensor x = core::Tensor::from_vector<float>({-1.0f, 0.5f, 1.0f}, {1, 3}, DType::f32);
  ReLU relu;
  CHECK(relu.forward(x, ctx).to_vector<float>() == std::vector<float>{0.0f, 0.5f, 1.0f});
  GELU exact, tanh_approx(true);
  const auto e = exact.forward(x, ctx).to_vector<float>();
  const auto t = tanh_approx.forward(x, ctx).to_vector<float>();
  for (int i = 0; i < 3; ++i) {
    const double v = x.to_vector<float>()[i];
    CHECK(e[i] == Approx(0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))).epsilon(1e-6));
    CHECK(t[i] ==
          Approx(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))))
              .epsilon(1e-6));
  }
  // Away from ReLU's kink (|x| > step), where a central difference is exact.
  core::Tensor away = random_f32({4, 9}, 8);
  for (float& v : std::span(away.data_as<float>(), 36)) v += v > 0 ? 0.1f : -0.1f;
  check_gradients(relu, away);
  check_gradients(exact, random_f32({4, 9}, 9));
  check_gradients(tanh_approx, random_f32({4, 9}, 10));
}

TEST_CASE("dropout masks depend on the global sample, not on the batch split",
          "[engine][dropout]") {
  Dropout drop(0.3f);
  drop.assign_names("drop");
  const core::Tensor x = random_f32({8, 50}, 11);
  Context whole;
  whole.seed = 5;
  whole.step = 3;
  const auto full = drop.forward(x, whole).to_vector<float>();
  std::vector<float> halves;
  for (int half = 0; half < 2; ++half) {
    Context part = whole;
    part.first_sample = 4 * half;
    const auto y = drop.forward(x.view(200 * half, {4, 50}), part).to_vector<float>();
    halves.insert(halves.end(), y.begin(), y.end());
  }
  CHECK(halves == full);
  // Kept elements are scaled by 1 / (1 - p); about 30% are dropped (400
  // draws: the standard deviation of the dropped share is 0.023, bound 5 sd).
  const auto xv = x.to_vector<float>();
  int dropped = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    if (full[i] == 0.0f)
      ++dropped;
    else
      REQUIRE(full[i] == Approx(xv[i] / 0.7f).epsilon(1e-6));
  }
  CHECK(std::fabs(dropped / 400.0 - 0.3) < 5 * 0.023);
  Context next = whole;
  next.step = 4;
  CHECK(drop.forward(x, next).to_vector<float>() != full);  // a new mask every step
  check_gradients(drop, x, whole);
  drop.eval();
  CHECK(drop.forward(x, whole).to_vector<float>() == xv);
}

TEST_CASE("Flatten reshapes without copying", "[engine][flatten]") {
  Flatten flat;
  Context ctx;
  const core::Tensor x = random_f32({2, 3, 4, 5}, 1);
  const core::Tensor y = flat.forward(x, ctx);
  CHECK(y.shape() == core::Shape{2, 60});
  CHECK(y.data() == x.data());
  CHECK(flat.backward(y, ctx).shape() == x.shape());
}

TEST_CASE("LayerNorm normalises each row and has the right gradients", "[engine][layernorm]") {
  LayerNorm norm(5);
  Context ctx;
  const auto y =
      norm.forward(core::Tensor::from_vector<float>({1, 2, 3, 4, 5}, {1, 5}, DType::f32), ctx)
          .to_vector<float>();
  // mean 3, biased variance 2: (x - 3) / sqrt(2 + 1e-5)
  for (int i = 0; i < 5; ++i)
    CHECK(y[i] == Approx((i + 1 - 3) / std::sqrt(2.0 + 1e-5)).epsilon(1e-6));
  LayerNorm affine(7);
  initialize(affine, 3);
  affine.own_parameters()[0]->value.copy_from(random_f32({7}, 4));
  affine.own_parameters()[1]->value.copy_from(random_f32({7}, 5));
  check_gradients(affine, random_f32({3, 2, 7}, 6));
  CHECK_THROWS_WITH(affine.forward(random_f32({2, 6}, 1), ctx),
                    Catch::Contains("LayerNorm") && Catch::Contains("[2, 6]"));
}

TEST_CASE("Embedding gathers rows and scatter-adds repeated indices", "[engine][embedding]") {
  Embedding emb(4, 2);
  emb.own_parameters()[0]->value.copy_from(
      core::Tensor::from_vector<float>({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}, DType::f32));
  Context ctx;
  const core::Tensor idx = core::Tensor::from_vector<std::int64_t>({2, 0, 2}, {3}, DType::i64);
  CHECK(emb.forward(idx, ctx).to_vector<float>() == std::vector<float>{20, 21, 0, 1, 20, 21});
  emb.backward(core::Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}, DType::f32), ctx);
  CHECK(emb.own_parameters()[0]->grad.to_vector<float>() ==
        std::vector<float>{3, 4, 0, 0, 6, 8, 0, 0});
  CHECK_THROWS_WITH(emb.forward(core::Tensor::from_vector<std::int64_t>({4}, {1}, DType::i64), ctx),
                    Catch::Contains("index 4"));
}
