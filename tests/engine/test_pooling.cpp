// MaxPool2d, AvgPool2d and GlobalAvgPool2d on the CPU: hand-computed values
// (ties and NaN included), finite-difference gradients on odd shapes, 16-bit
// inputs, and the errors that name a layer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/nn/containers.h"
#include "engine/nn/pooling.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using lockstep::test::check_gradients;
using lockstep::test::random_f32;

namespace {

core::Tensor image(const std::vector<float>& values, const core::Shape& shape) {
  return core::Tensor::from_vector(values, shape, DType::f32);
}

// Distinct values 0.05 apart in random order: a finite-difference step of
// 0.01 never changes which element of a window is the maximum.
core::Tensor distinct(const core::Shape& shape, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(core::shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  for (float& x : v) x = 0.05f * x - 1.0f;
  return image(v, shape);
}

}  // namespace

TEST_CASE("MaxPool2d takes window maxima and routes each gradient to its maximum",
          "[engine][pooling]") {
  Context ctx;
  MaxPool2d pool(2);
  std::vector<float> v(16);
  std::iota(v.begin(), v.end(), 0.0f);
  const auto y = pool.forward(image(v, {1, 1, 4, 4}), ctx);
  CHECK(y.shape() == core::Shape{1, 1, 2, 2});
  CHECK(y.to_vector<float>() == std::vector<float>{5, 7, 13, 15});
  const auto dx = pool.backward(image({1, 2, 3, 4}, {1, 1, 2, 2}), ctx).to_vector<float>();
  CHECK(dx == std::vector<float>{0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4});
}

TEST_CASE("MaxPool2d gives a tie's gradient to the first maximum and NaN to the last NaN",
          "[engine][pooling]") {
  // Note [max pool ties] in kernels/pooling.h, as PyTorch does.
  Context ctx;
  MaxPool2d pool(2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto y = pool.forward(image({7, 7, 1, nan, 7, 7, nan, 2}, {1, 1, 2, 4}), ctx);
  const auto out = y.to_vector<float>();
  CHECK(out[0] == 7.0f);
  CHECK(std::isnan(out[1]));
  const auto dx = pool.backward(image({1, 2}, {1, 1, 1, 2}), ctx).to_vector<float>();
  CHECK(dx == std::vector<float>{1, 0, 0, 0, 0, 0, 2, 0});
}

TEST_CASE("MaxPool2d 2x2 stride 2 agrees with a window-by-window reference on ties, NaN and -inf",
          "[engine][pooling]") {
  // Note [pool 2x2] in kernels/cpu/pooling.cpp: the vectorised 2x2 loop keeps
  // Note [max pool ties]. Values from a small set so that ties are common;
  // odd sizes leave a last row and column outside every window. Exact checks:
  // a maximum is one of the inputs and a gradient one of dy's values.
  const std::int64_t planes = 6, h = 7, w = 9, oh = 3, ow = 4;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float pool_values[] = {1.0f, 2.0f, 2.0f, -inf, nan, 0.5f, 2.0f, -1.0f};
  std::mt19937 rng(7);
  std::vector<float> x(static_cast<std::size_t>(planes * h * w));
  for (float& v : x) v = pool_values[rng() % 8];
  std::vector<float> dy(static_cast<std::size_t>(planes * oh * ow));
  std::iota(dy.begin(), dy.end(), 1.0f);
  std::vector<float> want_y(dy.size()), want_dx(x.size(), 0.0f);
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j) {
        float best = -inf;
        std::int64_t at = (p * h + 2 * i) * w + 2 * j;
        for (std::int64_t a = 0; a < 2; ++a)
          for (std::int64_t b = 0; b < 2; ++b) {
            const std::int64_t k = (p * h + 2 * i + a) * w + 2 * j + b;
            if (x[k] > best || std::isnan(x[k])) best = x[k], at = k;
          }
        want_y[(p * oh + i) * ow + j] = best;
        want_dx[at] += dy[(p * oh + i) * ow + j];
      }
  Context ctx;
  MaxPool2d pool(2);
  const auto y = pool.forward(image(x, {2, 3, h, w}), ctx).to_vector<float>();
  REQUIRE(y.size() == want_y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    INFO("output " << i);
    if (std::isnan(want_y[i]))
      CHECK(std::isnan(y[i]));
    else
      CHECK(y[i] == want_y[i]);
  }
  CHECK(pool.backward(image(dy, {2, 3, oh, ow}), ctx).to_vector<float>() == want_dx);
}

TEST_CASE("MaxPool2d pads with -inf, overlaps windows and keeps 16-bit dtypes",
          "[engine][pooling]") {
  Context ctx;
  // kernel 3, stride 2, padding 1 over a 3x3 image of negative values: the
  // padding never wins, and the centre is in all four windows.
  MaxPool2d pool(3, 2, 1);
  const auto y = pool.forward(image({-9, -8, -7, -6, -1, -4, -3, -2, -5}, {1, 1, 3, 3}), ctx);
  CHECK(y.to_vector<float>() == std::vector<float>{-1, -1, -1, -1});
  const auto dx = pool.backward(image({1, 2, 3, 4}, {1, 1, 2, 2}), ctx).to_vector<float>();
  CHECK(dx == std::vector<float>{0, 0, 0, 0, 10, 0, 0, 0, 0});
  for (DType type : {DType::f16, DType::bf16}) {
    const core::Tensor x = random_f32({2, 3, 5, 7}, 3).cast(type);
    const core::Tensor low = pool.forward(x, ctx);
    REQUIRE(low.dtype() == type);
    // The maximum of rounded values is one of them: exactly the f32 result.
    CHECK(low.cast(DType::f32).to_vector<float>() ==
          pool.forward(x.cast(DType::f32), ctx).to_vector<float>());
  }
}

TEST_CASE("AvgPool2d averages windows, counting padding as PyTorch's default does",
          "[engine][pooling]") {
  Context ctx;
  AvgPool2d sliding(2, 1);
  CHECK(sliding.forward(image({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}), ctx).to_vector<float>() ==
        std::vector<float>{3, 4, 6, 7});
  // Padding 1 around a 2x2 image: each window holds one pixel and three zeros.
  const core::Tensor x = image({1, 2, 3, 4}, {1, 1, 2, 2});
  AvgPool2d with_pad(2, 2, 1);
  CHECK(with_pad.forward(x, ctx).to_vector<float>() == std::vector<float>{0.25f, 0.5f, 0.75f, 1});
  CHECK(with_pad.backward(image({4, 8, 12, 16}, {1, 1, 2, 2}), ctx).to_vector<float>() ==
        std::vector<float>{1, 2, 3, 4});
  AvgPool2d without_pad(2, 2, 1, false);
  CHECK(without_pad.forward(x, ctx).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("GlobalAvgPool2d averages each plane to [N, C, 1, 1]", "[engine][pooling]") {
  Context ctx;
  GlobalAvgPool2d pool;
  const auto y = pool.forward(image({1, 2, 3, 4, 10, 20, 30, 40}, {1, 2, 2, 2}), ctx);
  CHECK(y.shape() == core::Shape{1, 2, 1, 1});
  CHECK(y.to_vector<float>() == std::vector<float>{2.5f, 25});
  CHECK(pool.backward(image({4, 8}, {1, 2, 1, 1}), ctx).to_vector<float>() ==
        std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2});
}

TEST_CASE("pooling gradients match finite differences on odd shapes", "[engine][pooling]") {
  const core::Shape shape{2, 3, 5, 7};
  {
    MaxPool2d a(2), b(3, 2, 1), c({3, 2}, {1, 2}, {1, 0});
    for (MaxPool2d* pool : {&a, &b, &c}) check_gradients(*pool, distinct(shape, 4));
  }
  {
    AvgPool2d a(2), b(3, 2, 1), c({3, 2}, {1, 2}, {1, 1}, false);
    for (AvgPool2d* pool : {&a, &b, &c}) check_gradients(*pool, random_f32(shape, 5));
  }
  GlobalAvgPool2d global;
  check_gradients(global, random_f32(shape, 6));
}

TEST_CASE("pooling keeps nothing in eval mode", "[engine][pooling]") {
  Context ctx;
  MaxPool2d pool(2);
  pool.eval();
  const core::Tensor y = pool.forward(random_f32({1, 1, 4, 4}, 1), ctx);
  CHECK_THROWS_WITH(pool.backward(y, ctx), Catch::Contains("without a training-mode forward"));
}

TEST_CASE("a shape that does not fit a pooling layer names the layer and both shapes",
          "[engine][pooling]") {
  Sequential net;
  net.emplace<MaxPool2d>("pool1", 2);
  net.emplace<AvgPool2d>("pool2", 3);
  net.emplace<GlobalAvgPool2d>("gap");
  net.assign_names();
  Context ctx;
  CHECK_THROWS_WITH(net.forward(random_f32({2, 3, 5, 5}, 1), ctx),
                    Catch::Contains("AvgPool2d 'pool2'") && Catch::Contains("[2, 3, 2, 2]") &&
                        Catch::Contains("H >= 3"));
  CHECK_THROWS_WITH(net.forward(random_f32({2, 3, 5}, 1), ctx),
                    Catch::Contains("MaxPool2d 'pool1'") && Catch::Contains("[2, 3, 5]") &&
                        Catch::Contains("[batch, channels, H, W]"));
  CHECK_THROWS_WITH(MaxPool2d(2, 2, 2), Catch::Contains("at most half the kernel"));
}
