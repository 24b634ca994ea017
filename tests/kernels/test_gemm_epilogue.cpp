// The CPU twin of the GEMM epilogues (Note [gemm epilogues] in kernels/gemm.h)
// against float64 loops at odd shapes and each dtype: the bias, bias+GELU(tanh)
// with its kept pre-activation, GELU's derivative (PyTorch's formula) with the
// bias gradient, and the bias gradient of the dW GEMM, overwritten and
// accumulated; and that the twin gives the bits of the separate ops it composes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/activation.h"
#include "kernels/bias.h"
#include "kernels/error.h"
#include "kernels/gemm.h"
#include "support/reference.h"

using namespace lockstep;
using kernels::GemmArgs;
using kernels::GemmEpilogue;

namespace {

struct Types {
  DType ab, c;
};
const Types kTypes[] = {{DType::f32, DType::f32},
                        {DType::bf16, DType::bf16},
                        {DType::f16, DType::f16},
                        {DType::bf16, DType::f32}};

// Half an ulp of the type, relative: the rounding of one 16-bit store.
double half_ulp(DType t) {
  if (t == DType::bf16) return std::ldexp(1.0, -8);
  if (t == DType::f16) return std::ldexp(1.0, -11);
  return std::ldexp(1.0, -24);
}

// PyTorch's GELU(approximate='tanh') and its backward
// (aten/src/ATen/native/cpu/GeluKernel.cpp), in float64.
double gelu_tanh(double x) {
  const double beta = std::sqrt(2.0 / M_PI), kappa = 0.044715;
  return 0.5 * x * (1.0 + std::tanh(beta * (x + kappa * x * x * x)));
}
double gelu_tanh_grad(double x) {
  const double beta = std::sqrt(2.0 / M_PI), kappa = 0.044715;
  const double t = std::tanh(beta * (x + kappa * x * x * x));
  const double left = 0.5 * x, right = 1.0 + t;
  return 0.5 * right + left * (1.0 - t * t) * beta * (1.0 + 3.0 * kappa * x * x);
}

std::vector<float> random_bias(std::int64_t n, std::uint32_t seed) {
  return test::random_matrix(n, DType::f32, seed).values;
}

// Linear's forward product: x [m, k] times W [n, k] transposed.
GemmArgs linear_args(const test::RandomMatrix& x, const test::RandomMatrix& w, void* y,
                     std::int64_t m, std::int64_t n, std::int64_t k, Types t) {
  GemmArgs g;
  g.trans_b = true;
  g.m = m, g.n = n, g.k = k;
  g.a = x.bytes.data(), g.lda = k;
  g.b = w.bytes.data(), g.ldb = k;
  g.c = y, g.ldc = n;
  g.ab_type = t.ab, g.c_type = t.c;
  return g;
}

// x scale (a power of two: exact in each type), as values and storage.
test::RandomMatrix scaled(test::RandomMatrix m, DType type, float scale) {
  for (std::size_t i = 0; i < m.values.size(); ++i) {
    m.values[i] *= scale;
    if (type == DType::f32) {
      std::memcpy(&m.bytes[i * 4], &m.values[i], 4);
    } else {
      const std::uint16_t bits = type == DType::bf16 ? kernels::f32_to_bf16_bits(m.values[i])
                                                     : kernels::f32_to_f16_bits(m.values[i]);
      std::memcpy(&m.bytes[i * 2], &bits, 2);
    }
  }
  return m;
}

struct Shape {
  std::int64_t m, n, k;
};
// Odd sizes, and n a multiple of 8 (the one cuBLASLt's aux needs) beside one that is not.
const Shape kShapes[] = {{7, 19, 37}, {33, 24, 5}, {1, 8, 129}};

}  // namespace

TEST_CASE("cpu gemm bias and bias+GELU(tanh) epilogues match a float64 loop", "[kernels][gemm]") {
  for (const Types t : kTypes)
    for (const Shape s : kShapes) {
      INFO(dtype_name(t.ab) << "->" << dtype_name(t.c) << " m=" << s.m << " n=" << s.n
                            << " k=" << s.k);
      const auto x = test::random_matrix(s.m * s.k, t.ab, 1);
      const auto w = test::random_matrix(s.n * s.k, t.ab, 2);
      const std::vector<float> bias = random_bias(s.n, 3);
      const auto ref = test::reference_gemm(false, true, s.m, s.n, s.k, 1.0, x.values, w.values,
                                            0.0, std::vector<float>(s.m * s.n, 0.0f));
      const std::size_t bytes = static_cast<std::size_t>(s.m * s.n) * dtype_size(t.c);
      std::vector<std::uint8_t> y(bytes), aux(bytes), y_gelu(bytes);
      GemmArgs g = linear_args(x, w, y.data(), s.m, s.n, s.k, t);
      g.epilogue = GemmEpilogue::bias;
      g.bias = bias.data();
      kernels::cpu::gemm(g);
      g.epilogue = GemmEpilogue::bias_gelu_aux;
      g.c = y_gelu.data();
      g.aux = aux.data();
      kernels::cpu::gemm(g);
      for (std::int64_t i = 0; i < s.m * s.n; ++i) {
        const double pre = ref.c[i] + bias[i % s.n];
        // The product's bound, its rounding to C's type, then the bias add's.
        const double tol = test::gemm_tolerance(ref.magnitude[i], ref.c[i], s.k, t.c) +
                           half_ulp(t.c) * std::fabs(pre) + 1e-30;
        REQUIRE(std::fabs(test::decode(y, t.c, i) - pre) <= tol);
        REQUIRE(std::fabs(test::decode(aux, t.c, i) - pre) <= tol);
        // GELU's slope is within [-0.13, 1.13]; its f32 evaluation is within
        // 1e-6 relative (Note [vector tanh]), then one rounding to C's type.
        const double want = gelu_tanh(pre);
        REQUIRE(std::fabs(test::decode(y_gelu, t.c, i) - want) <=
                1.13 * tol + 1e-6 * std::fabs(want) + half_ulp(t.c) * std::fabs(want) + 1e-30);
      }
    }
}

TEST_CASE("cpu gemm dgelu_bgrad epilogue matches PyTorch's GELU(tanh) derivative in float64",
          "[kernels][gemm]") {
  for (const Types t : kTypes)
    for (const Shape s : kShapes)
      for (bool accumulate : {false, true}) {
        INFO(dtype_name(t.ab) << "->" << dtype_name(t.c) << " m=" << s.m << " n=" << s.n
                              << " k=" << s.k << " accumulate=" << accumulate);
        // The next layer's dX GEMM: dy [m, k] times its W [k, n] (stored [k, n]).
        const auto dy = test::random_matrix(s.m * s.k, t.ab, 4);
        const auto w = test::random_matrix(s.k * s.n, t.ab, 5);
        auto pre = scaled(test::random_matrix(s.m * s.n, t.c, 6), t.c, 4.0f);
        const auto ref = test::reference_gemm(false, false, s.m, s.n, s.k, 1.0, dy.values, w.values,
                                              0.0, std::vector<float>(s.m * s.n, 0.0f));
        std::vector<std::uint8_t> out(static_cast<std::size_t>(s.m * s.n) * dtype_size(t.c));
        std::vector<float> db0 = random_bias(s.n, 7);
        std::vector<float> db =
            accumulate ? db0 : std::vector<float>(s.n, std::numeric_limits<float>::quiet_NaN());
        GemmArgs g;
        g.m = s.m, g.n = s.n, g.k = s.k;
        g.a = dy.bytes.data(), g.lda = s.k;
        g.b = w.bytes.data(), g.ldb = s.n;
        g.c = out.data(), g.ldc = s.n;
        g.ab_type = t.ab, g.c_type = t.c;
        g.epilogue = GemmEpilogue::dgelu_bgrad;
        g.aux = pre.bytes.data();
        g.bias_grad = db.data();
        g.bias_grad_accumulate = accumulate;
        kernels::cpu::gemm(g);
        for (std::int64_t i = 0; i < s.m * s.n; ++i) {
          const double x = pre.values[i];
          const double slope = gelu_tanh_grad(x);
          const double want = ref.c[i] * slope;
          // The product's rounding to C's type, times the slope; the slope's
          // f32 evaluation, within 1e-6 of its terms (which reach 1 + |x|
          // where they cancel near its zero at x = -0.75) times the product;
          // the result's rounding.
          const double tol =
              test::gemm_tolerance(ref.magnitude[i], ref.c[i], s.k, t.c) * std::fabs(slope) +
              2e-6 * (1.0 + std::fabs(x)) * std::fabs(ref.c[i]) + half_ulp(t.c) * std::fabs(want) +
              1e-30;
          REQUIRE(std::fabs(test::decode(out, t.c, i) - want) <= tol);
        }
        // The bias gradient sums the gradient as stored, in float64 (one f32 rounding).
        for (std::int64_t j = 0; j < s.n; ++j) {
          double sum = accumulate ? db0[j] : 0.0, magnitude = std::fabs(sum);
          for (std::int64_t i = 0; i < s.m; ++i) {
            sum += test::decode(out, t.c, i * s.n + j);
            magnitude += std::fabs(test::decode(out, t.c, i * s.n + j));
          }
          REQUIRE(std::fabs(db[j] - sum) <= std::ldexp(1.0, -23) * magnitude + 1e-30);
        }
      }
}

TEST_CASE("cpu gemm bgrad_a epilogue sums the dW GEMM's dy over rows, overwriting or adding",
          "[kernels][gemm]") {
  for (const Types t : kTypes)
    for (const Shape s : kShapes)
      for (bool accumulate : {false, true}) {
        // dW [m, n] (+)= dy^T x: dy stored [k, m], x [k, n]; C f32 with beta = 1.
        const Types wt{t.ab, DType::f32};
        INFO(dtype_name(t.ab) << " m=" << s.m << " n=" << s.n << " k=" << s.k
                              << " accumulate=" << accumulate);
        const auto dy = test::random_matrix(s.k * s.m, t.ab, 8);
        const auto x = test::random_matrix(s.k * s.n, t.ab, 9);
        auto dw = test::random_matrix(s.m * s.n, DType::f32, 10);
        const auto ref = test::reference_gemm(true, false, s.m, s.n, s.k, 1.0, dy.values, x.values,
                                              1.0, dw.values);
        const std::vector<float> db0 = random_bias(s.m, 11);
        std::vector<float> db =
            accumulate ? db0 : std::vector<float>(s.m, std::numeric_limits<float>::quiet_NaN());
        GemmArgs g;
        g.trans_a = true;
        g.m = s.m, g.n = s.n, g.k = s.k;
        g.beta = 1.0f;
        g.a = dy.bytes.data(), g.lda = s.m;
        g.b = x.bytes.data(), g.ldb = s.n;
        g.c = dw.bytes.data(), g.ldc = s.n;
        g.ab_type = wt.ab, g.c_type = wt.c;
        g.epilogue = GemmEpilogue::bgrad_a;
        g.bias_grad = db.data();
        g.bias_grad_accumulate = accumulate;
        kernels::cpu::gemm(g);
        for (std::int64_t i = 0; i < s.m * s.n; ++i)
          REQUIRE(std::fabs(test::decode(dw.bytes, DType::f32, i) - ref.c[i]) <=
                  test::gemm_tolerance(ref.magnitude[i], ref.c[i], s.k, DType::f32));
        for (std::int64_t j = 0; j < s.m; ++j) {
          double sum = accumulate ? db0[j] : 0.0, magnitude = std::fabs(sum);
          for (std::int64_t p = 0; p < s.k; ++p) {
            sum += dy.values[p * s.m + j];
            magnitude += std::fabs(dy.values[p * s.m + j]);
          }
          // f64 sums, one f32 rounding.
          REQUIRE(std::fabs(db[j] - sum) <= std::ldexp(1.0, -23) * magnitude + 1e-30);
        }
      }
}

TEST_CASE("cpu gemm epilogues give the bits of the separate ops they compose", "[kernels][gemm]") {
  const Shape s{33, 24, 37};
  for (const Types t : kTypes) {
    INFO(dtype_name(t.ab) << "->" << dtype_name(t.c));
    const auto x = test::random_matrix(s.m * s.k, t.ab, 12);
    const auto w = test::random_matrix(s.n * s.k, t.ab, 13);
    const std::vector<float> bias = random_bias(s.n, 14);
    const std::size_t bytes = static_cast<std::size_t>(s.m * s.n) * dtype_size(t.c);
    // Today's Linear then GELU: the product, add_bias, activation_forward.
    std::vector<std::uint8_t> y(bytes), act(bytes), fused(bytes), aux(bytes);
    GemmArgs g = linear_args(x, w, y.data(), s.m, s.n, s.k, t);
    kernels::cpu::gemm(g);
    kernels::cpu::add_bias(y.data(), t.c, bias.data(), s.m, s.n);
    kernels::cpu::activation_forward(kernels::Activation::gelu_tanh, y.data(), act.data(), t.c,
                                     s.m * s.n);
    g.c = fused.data();
    g.aux = aux.data();
    g.bias = bias.data();
    g.epilogue = GemmEpilogue::bias_gelu_aux;
    kernels::cpu::gemm(g);
    REQUIRE(std::memcmp(aux.data(), y.data(), bytes) == 0);
    REQUIRE(std::memcmp(fused.data(), act.data(), bytes) == 0);
  }
}

TEST_CASE("gemm epilogues refuse arguments they cannot take, naming them", "[kernels][gemm]") {
  const auto x = test::random_matrix(4 * 8, DType::f32, 1);
  const auto w = test::random_matrix(8 * 8, DType::f32, 2);
  std::vector<float> y(4 * 8), aux(4 * 8), bias(8), db(8);
  GemmArgs g = linear_args(x, w, y.data(), 4, 8, 8, {DType::f32, DType::f32});
  g.epilogue = GemmEpilogue::bias_gelu_aux;
  g.bias = bias.data();
  g.aux = aux.data();
  g.beta = 1.0f;
  REQUIRE_THROWS_WITH(kernels::cpu::gemm(g), Catch::Contains("needs beta=0"));
  g.beta = 0.0f;
  g.ldc = 9;
  REQUIRE_THROWS_WITH(kernels::cpu::gemm(g), Catch::Contains("dense C"));
  g.ldc = 8;
  g.epilogue = GemmEpilogue::bgrad_a;
  g.bias_grad = db.data();
  REQUIRE_THROWS_WITH(kernels::cpu::gemm(g), Catch::Contains("trans_a, lda=m"));
  g.epilogue = GemmEpilogue::bias;
  g.bias = nullptr;
  REQUIRE_THROWS_AS(kernels::cpu::gemm(g), InvalidArgument);
}
