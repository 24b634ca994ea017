// Conv2d on the CPU: finite-difference gradients on odd shapes, a float64
// direct loop (independent of im2col/col2im) for y, dx and dW, hand-computed
// values, autocast against f32 (overflow included), the low weight cache, and
// the errors that name a layer.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "support/gradcheck.h"
#include "support/reference.h"

using namespace lockstep;
using namespace lockstep::engine;
using lockstep::test::check_gradients;
using lockstep::test::random_f32;

namespace {

struct ConvCase {
  std::int64_t in, out;
  Size2 kernel, stride, padding, dilation;
  std::int64_t groups;
  bool bias;
  core::Shape input;
};

// Odd sizes everywhere: 5x7 images, stride 2, padding, dilation 2, groups,
// a non-square kernel, the 1x1 path, no bias.
const ConvCase kCases[] = {
    {3, 4, 3, 1, 1, 1, 1, true, {2, 3, 5, 7}},
    {3, 5, 3, 2, 1, 1, 1, true, {2, 3, 5, 7}},
    {2, 3, 3, 1, 2, 2, 1, false, {1, 2, 7, 5}},
    {4, 6, {3, 2}, {2, 1}, {1, 0}, 1, 2, true, {2, 4, 5, 7}},
    {6, 3, {2, 3}, {1, 2}, {0, 2}, {2, 1}, 3, true, {3, 6, 6, 5}},
    {5, 3, 1, 1, 0, 1, 1, true, {2, 5, 3, 4}},
};

std::unique_ptr<Conv2d> make(const ConvCase& c) {
  auto conv = std::make_unique<Conv2d>(c.in, c.out, c.kernel, c.stride, c.padding, c.dilation,
                                       c.groups, c.bias);
  initialize(*conv, 11);
  return conv;
}

// y, dx and dW by the definition, in float64, with the magnitude sum |a b| of
// each element's terms (which bounds f32 rounding error) and its term count.
struct Reference {
  std::vector<double> y, y_mag, dx, dx_mag, dw, dw_mag;
  std::int64_t y_terms, dx_terms, dw_terms;
};

Reference reference(Conv2d& conv, const ConvCase& c, const std::vector<float>& x,
                    const std::vector<float>& dy) {
  const auto w = conv.weight().value.to_vector<float>();
  const auto b = conv.bias() ? conv.bias()->value.to_vector<float>() : std::vector<float>();
  const std::int64_t n_ = c.input[0], h = c.input[2], wd = c.input[3];
  const std::int64_t cin_g = c.in / c.groups, cout_g = c.out / c.groups;
  const std::int64_t oh_n =
      (h + 2 * c.padding.h - c.dilation.h * (c.kernel.h - 1) - 1) / c.stride.h + 1;
  const std::int64_t ow_n =
      (wd + 2 * c.padding.w - c.dilation.w * (c.kernel.w - 1) - 1) / c.stride.w + 1;
  Reference r;
  r.y.assign(n_ * c.out * oh_n * ow_n, 0.0);
  r.y_mag = r.y;
  r.dx.assign(x.size(), 0.0);
  r.dx_mag = r.dx;
  r.dw.assign(w.size(), 0.0);
  r.dw_mag = r.dw;
  r.y_terms = cin_g * c.kernel.h * c.kernel.w;
  r.dx_terms = cout_g * c.kernel.h * c.kernel.w;
  r.dw_terms = n_ * oh_n * ow_n;
  for (std::int64_t n = 0; n < n_; ++n)
    for (std::int64_t o = 0; o < c.out; ++o)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          const std::int64_t yi = ((n * c.out + o) * oh_n + oh) * ow_n + ow;
          if (!b.empty()) {
            r.y[yi] = b[o];
            r.y_mag[yi] = std::fabs(b[o]);
          }
          for (std::int64_t ci = 0; ci < cin_g; ++ci)
            for (std::int64_t ki = 0; ki < c.kernel.h; ++ki)
              for (std::int64_t kj = 0; kj < c.kernel.w; ++kj) {
                const std::int64_t ih = oh * c.stride.h - c.padding.h + ki * c.dilation.h;
                const std::int64_t iw = ow * c.stride.w - c.padding.w + kj * c.dilation.w;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const std::int64_t channel = o / cout_g * cin_g + ci;
                const std::int64_t xi = ((n * c.in + channel) * h + ih) * wd + iw;
                const std::int64_t wi = ((o * cin_g + ci) * c.kernel.h + ki) * c.kernel.w + kj;
                r.y[yi] += double{x[xi]} * w[wi];
                r.y_mag[yi] += std::fabs(double{x[xi]} * w[wi]);
                r.dx[xi] += double{dy[yi]} * w[wi];
                r.dx_mag[xi] += std::fabs(double{dy[yi]} * w[wi]);
                r.dw[wi] += double{dy[yi]} * x[xi];
                r.dw_mag[wi] += std::fabs(double{dy[yi]} * x[xi]);
              }
        }
  return r;
}

void require_within(const std::vector<float>& got, const std::vector<double>& want,
                    const std::vector<double>& magnitude, std::int64_t terms, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = test::gemm_tolerance(magnitude[i], want[i], terms, DType::f32);
    INFO(what << " element " << i << ": got " << got[i] << ", float64 " << want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= tol);
  }
}

}  // namespace

TEST_CASE("Conv2d gradients match finite differences on odd shapes", "[engine][conv]") {
  for (const ConvCase& c : kCases) {
    auto conv = make(c);
    INFO("case in " << c.in << " out " << c.out << " groups " << c.groups);
    check_gradients(*conv, random_f32(c.input, 3));
  }
}

TEST_CASE("Conv2d matches a float64 direct loop forward and backward", "[engine][conv]") {
  for (const ConvCase& c : kCases) {
    auto conv = make(c);
    INFO("case in " << c.in << " out " << c.out << " groups " << c.groups);
    const core::Tensor x = random_f32(c.input, 4);
    Context ctx;
    const core::Tensor y = conv->forward(x, ctx);
    const core::Tensor dy = random_f32(y.shape(), 5);
    const core::Tensor dx = conv->backward(dy, ctx);
    const Reference r = reference(*conv, c, x.to_vector<float>(), dy.to_vector<float>());
    // Each result is a sum of `terms` products; the GEMM bound (2k + 2) u sum|a b|
    // of tests/support/reference.h covers any f32 summation order.
    require_within(y.to_vector<float>(), r.y, r.y_mag, r.y_terms, "y");
    require_within(dx.to_vector<float>(), r.dx, r.dx_mag, r.dx_terms, "dx");
    require_within(conv->weight().grad.to_vector<float>(), r.dw, r.dw_mag, r.dw_terms, "dW");
  }
}

TEST_CASE("Conv2d computes hand-worked values with padding, bias and groups", "[engine][conv]") {
  Context ctx;
  // A 2x2 image, a 2x2 kernel of ones, padding 1: each output sums the pixels
  // its window covers, plus the bias 0.5.
  Conv2d conv(1, 1, 2, 1, 1);
  conv.weight().value.fill_(1.0);
  conv.bias()->value.fill_(0.5);
  const auto y =
      conv.forward(core::Tensor::from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2}, DType::f32), ctx);
  CHECK(y.shape() == core::Shape{1, 1, 3, 3});
  CHECK(y.to_vector<float>() ==
        std::vector<float>{1.5f, 3.5f, 2.5f, 4.5f, 10.5f, 6.5f, 3.5f, 7.5f, 4.5f});
  // Stride 2 over a 3x3 image with a 1x1 kernel picks the corners.
  Conv2d corners(1, 1, 1, 2, 0, 1, 1, false);
  corners.weight().value.fill_(2.0);
  const auto z = corners.forward(
      core::Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}, DType::f32), ctx);
  CHECK(z.to_vector<float>() == std::vector<float>{2, 6, 14, 18});
  // groups = 2: each output channel sees only its own input channel.
  Conv2d grouped(2, 2, 1, 1, 0, 1, 2, false);
  grouped.weight().value.copy_from(
      core::Tensor::from_vector<float>({2, 3}, {2, 1, 1, 1}, DType::f32));
  const auto g = grouped.forward(
      core::Tensor::from_vector<float>({1, 2, 10, 20}, {1, 2, 1, 2}, DType::f32), ctx);
  CHECK(g.to_vector<float>() == std::vector<float>{2, 4, 30, 60});
}

TEST_CASE("Conv2d under CPU autocast agrees with f32 and overflows like the low type",
          "[engine][conv][autocast]") {
  const ConvCase& c = kCases[3];  // groups, stride, padding, a non-square kernel
  auto conv = make(c);
  const core::Tensor x = random_f32(c.input, 6);
  Context f32;
  const core::Tensor y32 = conv->forward(x, f32);
  const core::Tensor dy = random_f32(y32.shape(), 7);
  const auto dx32 = conv->backward(dy, f32).to_vector<float>();
  const auto dw32 = conv->weight().grad.to_vector<float>();
  const Reference r = reference(*conv, c, x.to_vector<float>(), dy.to_vector<float>());
  // Inputs and weights are rounded to the low type (relative error u each),
  // products accumulate in f32 and each result is rounded once (u): within
  // (2u + u^2) sum|a b| + u |result|, doubled for the bias add's rounding of y
  // and for the f32 reference's own error. u = 2^-11 (f16) or 2^-8 (bf16).
  for (auto [type, u] : {std::pair{DType::f16, 1.0 / 2048}, std::pair{DType::bf16, 1.0 / 256}}) {
    INFO(dtype_name(type));
    Context low;
    low.autocast = type;
    conv->weight().grad.fill_(0.0);
    const core::Tensor y = conv->forward(x, low);
    REQUIRE(y.dtype() == type);
    const core::Tensor dx = conv->backward(dy, low);
    REQUIRE(dx.dtype() == DType::f32);  // the input's dtype
    const double unit = u;              // clang 14's lambdas cannot capture a structured binding
    auto check = [&](const std::vector<float>& got, const std::vector<float>& want,
                     const std::vector<double>& magnitude, const char* what) {
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO(what << " element " << i << ": autocast " << got[i] << ", f32 " << want[i]);
        REQUIRE(std::fabs(got[i] - want[i]) <=
                2 * ((2 * unit + unit * unit) * magnitude[i] + 2 * unit * std::fabs(want[i])) +
                    1e-6);
      }
    };
    check(y.cast(DType::f32).to_vector<float>(), y32.to_vector<float>(), r.y_mag, "y");
    check(dx.to_vector<float>(), dx32, r.dx_mag, "dx");
    check(conv->weight().grad.to_vector<float>(), dw32, r.dw_mag, "dW");
  }
  // 300 * 300 = 90000 is past f16's 65504 but within bf16's range, in the
  // output and in the weight gradient.
  Conv2d big(1, 1, 1, 1, 0, 1, 1, false);
  big.weight().value.fill_(300.0);
  const core::Tensor x300 = core::Tensor::from_vector<float>({300.0f}, {1, 1, 1, 1}, DType::f32);
  for (DType type : {DType::f16, DType::bf16}) {
    Context low;
    low.autocast = type;
    big.weight().grad.fill_(0.0);
    const auto y = big.forward(x300, low);
    big.backward(core::Tensor::from_vector<float>({300.0f}, {1, 1, 1, 1}, DType::f32), low);
    const float out = y.cast(DType::f32).to_vector<float>()[0];
    const float dw = big.weight().grad.to_vector<float>()[0];
    CHECK(std::isinf(out) == (type == DType::f16));
    CHECK(std::isinf(dw) == (type == DType::f16));
  }
}

TEST_CASE("Conv2d makes the low weight copy once per weight version", "[engine][conv][autocast]") {
  Conv2d conv(1, 1, 1, 1, 0, 1, 1, false);
  conv.weight().value.fill_(2.0);
  Context f16;
  f16.autocast = DType::f16;
  const core::Tensor x = core::Tensor::from_vector<float>({3.0f}, {1, 1, 1, 1}, DType::f32);
  auto run = [&] { return conv.forward(x, f16).cast(DType::f32).to_vector<float>()[0]; };
  CHECK(run() == 6.0f);
  conv.weight().value.fill_(5.0);  // written without bumping the version: cache kept
  CHECK(run() == 6.0f);
  ++conv.weight().version;
  CHECK(run() == 15.0f);
}

TEST_CASE("Conv2d leaves frozen parameters alone and keeps nothing in eval", "[engine][conv]") {
  Conv2d conv(2, 3, 3, 1, 1);
  initialize(conv, 2);
  conv.weight().requires_grad = false;
  Context ctx;
  const core::Tensor x = random_f32({2, 2, 4, 5}, 8);
  const core::Tensor y = conv.forward(x, ctx);
  conv.backward(random_f32(y.shape(), 9), ctx);
  for (float g : conv.weight().grad.to_vector<float>()) CHECK(g == 0.0f);
  bool bias_moved = false;
  for (float g : conv.bias()->grad.to_vector<float>()) bias_moved |= g != 0.0f;
  CHECK(bias_moved);
  conv.eval();
  conv.forward(x, ctx);
  CHECK_THROWS_WITH(conv.backward(random_f32(y.shape(), 9), ctx),
                    Catch::Contains("without a training-mode forward"));
}

TEST_CASE("a shape that does not fit Conv2d names the layer and both shapes", "[engine][conv]") {
  Sequential net;
  net.emplace<Conv2d>("conv1", 3, 8, 3, 1, 1);
  net.emplace<Conv2d>("conv2", 4, 8, 3);
  net.assign_names();
  Context ctx;
  CHECK_THROWS_WITH(net.forward(random_f32({2, 3, 6, 6}, 1), ctx),
                    Catch::Contains("Conv2d 'conv2'") && Catch::Contains("[2, 8, 6, 6]") &&
                        Catch::Contains("[batch, 4, H, W]"));
  Conv2d dilated(1, 1, 3, 1, 0, 2);
  dilated.assign_names("features.0");
  CHECK_THROWS_WITH(dilated.forward(random_f32({1, 1, 4, 9}, 1), ctx),
                    Catch::Contains("Conv2d 'features.0'") && Catch::Contains("[1, 1, 4, 9]") &&
                        Catch::Contains("H >= 5"));
  CHECK_THROWS_WITH(Conv2d(3, 4, 3, 1, 0, 1, 2), Catch::Contains("groups 2"));
}
