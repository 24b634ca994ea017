// CPU elementwise ops and reductions against float64 loops and the documented
// conversion rules (kernels/elementwise.h, kernels/reduce.h).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/reduce.h"
#include "support/reference.h"

using namespace lockstep;
namespace cpu = lockstep::kernels::cpu;

TEST_CASE("add, mul, scale and axpy round an exact f64 result once", "[kernels][elementwise]") {
  const std::int64_t n = 1000;
  for (DType type : {DType::f32, DType::f16, DType::bf16}) {
    const auto a = test::random_matrix(n, type, 11), b = test::random_matrix(n, type, 12);
    std::vector<std::uint8_t> out(n * dtype_size(type));
    // Sums and products of two f16/bf16/f32 values are exact in f64, so
    // rounding the f64 result to the type is the correctly rounded answer.
    auto rounded = [type](double v) {
      std::vector<std::uint8_t> cell(dtype_size(type));
      cpu::fill(cell.data(), type, 1, static_cast<float>(v));
      return test::decode(cell, type, 0);
    };
    cpu::add(a.bytes.data(), b.bytes.data(), out.data(), type, n);
    for (std::int64_t i = 0; i < n; ++i)
      REQUIRE(test::decode(out, type, i) == rounded(double(a.values[i]) + b.values[i]));
    cpu::mul(a.bytes.data(), b.bytes.data(), out.data(), type, n);
    for (std::int64_t i = 0; i < n; ++i)
      REQUIRE(test::decode(out, type, i) == rounded(double(a.values[i]) * b.values[i]));
    auto y = b.bytes;
    cpu::axpy(0.5f, a.bytes.data(), y.data(), type, n);  // 0.5 a + b is exact in f64
    for (std::int64_t i = 0; i < n; ++i)
      REQUIRE(test::decode(y, type, i) == rounded(0.5 * a.values[i] + b.values[i]));
    auto x = a.bytes;
    cpu::scale(x.data(), type, n, -4.0f);
    for (std::int64_t i = 0; i < n; ++i)
      REQUIRE(test::decode(x, type, i) == rounded(-4.0 * a.values[i]));
  }
}

TEST_CASE("casts follow the documented rules", "[kernels][elementwise]") {
  const float src[] = {1.9f, -1.9f, 300.0f, -5.0f, NAN, 3e10f, -3e10f, 65520.0f};
  std::int32_t i32[8];
  cpu::cast(src, DType::f32, i32, DType::i32, 8);
  CHECK(std::vector<std::int32_t>(i32, i32 + 8) ==
        std::vector<std::int32_t>{1, -1, 300, -5, 0, std::numeric_limits<std::int32_t>::max(),
                                  std::numeric_limits<std::int32_t>::min(), 65520});
  std::uint8_t u8[8];
  cpu::cast(src, DType::f32, u8, DType::u8, 8);
  CHECK(std::vector<int>(u8, u8 + 8) == std::vector<int>{1, 0, 255, 0, 0, 255, 0, 255});
  std::uint16_t f16[8];
  cpu::cast(src, DType::f32, f16, DType::f16, 8);
  CHECK(f16[7] == 0x7c00);  // overflow to inf
  const std::int64_t big[] = {(std::int64_t{1} << 40) + 7, -1};
  std::int32_t wrapped[2];
  cpu::cast(big, DType::i64, wrapped, DType::i32, 2);
  CHECK(wrapped[0] == 7);  // integer to integer wraps
  CHECK(wrapped[1] == -1);
  const std::uint8_t pixels[] = {0, 128, 255};
  float as_float[3];
  cpu::cast(pixels, DType::u8, as_float, DType::f32, 3);
  CHECK(std::vector<float>(as_float, as_float + 3) == std::vector<float>{0.0f, 128.0f, 255.0f});
}

TEST_CASE("fill stores the value converted to each dtype", "[kernels][elementwise]") {
  std::int64_t i64[3];
  cpu::fill(i64, DType::i64, 3, -7.0);
  CHECK(i64[2] == -7);
  std::uint16_t bf[2];
  cpu::fill(bf, DType::bf16, 2, 1.0 / 3.0);
  CHECK(bf[1] == kernels::f32_to_bf16_bits(1.0f / 3.0f));
}

TEST_CASE("arithmetic on integer dtypes is refused", "[kernels][elementwise]") {
  std::int32_t a[2] = {1, 2};
  CHECK_THROWS_WITH(cpu::add(a, a, a, DType::i32, 2),
                    Catch::Contains("add") && Catch::Contains("i32"));
}

TEST_CASE("sum and sum of squares match a float64 loop", "[kernels][reduce]") {
  const std::int64_t n = 100003;
  for (DType type : {DType::f32, DType::f16, DType::bf16}) {
    const auto x = test::random_matrix(n, type, 5);
    double s = 0, s2 = 0;
    for (float v : x.values) s += v, s2 += double(v) * v;
    float got = 0, got2 = 0;
    cpu::sum(x.bytes.data(), type, n, &got);
    cpu::sum_squares(x.bytes.data(), type, n, &got2);
    // f64 accumulation of n terms of magnitude <= 1 errs by < n 2^-53: far below
    // f32 rounding, so the result is the f32 rounding of the exact sum.
    CHECK(got == static_cast<float>(s));
    CHECK(got2 == static_cast<float>(s2));
  }
}

TEST_CASE("the non-finite flag catches inf and NaN anywhere and is never cleared",
          "[kernels][reduce]") {
  std::vector<float> x(1000, 1.0f);
  std::int32_t flag = 0;
  cpu::flag_nonfinite(x.data(), DType::f32, 1000, &flag);
  CHECK(flag == 0);
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    for (std::size_t where : {std::size_t{0}, std::size_t{999}}) {
      x[where] = bad;
      flag = 0;
      cpu::flag_nonfinite(x.data(), DType::f32, 1000, &flag);
      CHECK(flag == 1);
      x[where] = 1.0f;
    }
  }
  flag = 1;
  cpu::flag_nonfinite(x.data(), DType::f32, 1000, &flag);
  CHECK(flag == 1);
  const std::uint16_t half_inf[] = {0x3c00, 0x7c00};
  flag = 0;
  cpu::flag_nonfinite(half_inf, DType::f16, 2, &flag);
  CHECK(flag == 1);
}

TEST_CASE("the CPU's f32 GELU(tanh) is within 1e-6 of the float64 formula",
          "[kernels][activation]") {
  // Note [vector tanh]: sigmoid(2u) with an exp within 2 ulp and one division
  // is within a few f32 ulp (1e-6 relative) of 0.5 x (1 + tanh u) in f64
  // (checked against tanh itself where f64 does not cancel, |x| < 4); a
  // slip in a coefficient or in the exponent bits is off by 1e-3 or more. Where
  // sigmoid(2u) is e^-2u, the f32 rounding of 2u (a few ulp, as in any f32
  // GELU) moves it by |2u| times that, hence 4e-7 |2u| more. The gradient
  // cancels near its zero (x about -0.75), hence also 1e-6 absolute.
  std::vector<float> x;
  for (float v = -20.0f; v <= 20.0f; v += 1.0f / 1024) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-20f, 44.0f, -44.0f}) x.push_back(v);
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> y(n), dx(n), ones(n, 1.0f);
  cpu::activation_forward(kernels::Activation::gelu_tanh, x.data(), y.data(), DType::f32, n);
  cpu::activation_backward(kernels::Activation::gelu_tanh, ones.data(), x.data(), dx.data(),
                           DType::f32, n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i], k = std::sqrt(2.0 / M_PI), c = 0.044715;
    // 0.5 (1 + tanh u) as 1 / (1 + e^-2u): the same function, without the
    // cancellation of 1 + tanh u that leaves f64 itself at 0 below x = -8.
    const double two_u = 2.0 * k * (v + c * v * v * v);
    const double s = 1.0 / (1.0 + std::exp(-two_u));
    const double rel = 1e-6 + 4e-7 * std::fabs(two_u);
    const double want = v * s;
    const double grad = s + 2.0 * v * s * (1.0 - s) * k * (1.0 + 3.0 * c * v * v);
    INFO("x = " << x[i]);
    if (std::fabs(v) < 4.0)
      REQUIRE(std::fabs(want - 0.5 * v * (1.0 + std::tanh(k * (v + c * v * v * v)))) <=
              1e-12 * std::fabs(want) + 1e-15);
    REQUIRE(std::fabs(y[i] - want) <= rel * std::fabs(want) + 1e-30);
    REQUIRE(std::fabs(dx[i] - grad) <= rel * std::fabs(grad) + 1e-6);
  }
  // Forward only: x^3 overflows f32 there, and the gradient's 0 * inf is NaN
  // (as PyTorch's f32 formula gives).
  const float big[] = {NAN, INFINITY, 1e30f};
  float out[3];
  cpu::activation_forward(kernels::Activation::gelu_tanh, big, out, DType::f32, 3);
  REQUIRE(std::isnan(out[0]));
  REQUIRE(out[1] == INFINITY);
  REQUIRE(out[2] == 1e30f);
}
