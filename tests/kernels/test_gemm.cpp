// CPU GEMM against a float64 triple loop, for odd shapes, every transpose
// combination and each (input, output) dtype pair; tolerances from
// tests/support/reference.h (f32 accumulation bound plus output rounding).
#include <catch2/catch.hpp>

#include <vector>

#include "kernels/error.h"
#include "kernels/gemm.h"
#include "support/reference.h"

using namespace lockstep;
using lockstep::kernels::GemmArgs;

namespace {

struct Case {
  DType ab, c;
};

void check_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, Case types,
                float alpha, float beta) {
  const auto a = test::random_matrix(m * k, types.ab, 1);
  const auto b = test::random_matrix(k * n, types.ab, 2);
  auto c = test::random_matrix(m * n, types.c, 3);
  const auto ref = test::reference_gemm(ta, tb, m, n, k, alpha, a.values, b.values, beta, c.values);
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m, g.n = n, g.k = k;
  g.alpha = alpha, g.beta = beta;
  g.a = a.bytes.data(), g.lda = ta ? m : k;
  g.b = b.bytes.data(), g.ldb = tb ? k : n;
  g.c = c.bytes.data(), g.ldc = n;
  g.ab_type = types.ab, g.c_type = types.c;
  kernels::cpu::gemm(g);
  for (std::int64_t i = 0; i < m * n; ++i) {
    const double got = test::decode(c.bytes, types.c, i);
    const double tol = test::gemm_tolerance(ref.magnitude[i], ref.c[i], k, types.c);
    if (std::fabs(got - ref.c[i]) > tol) {
      FAIL_CHECK("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " "
                      << dtype_name(types.ab) << "->" << dtype_name(types.c) << " element " << i
                      << ": got " << got << ", float64 reference " << ref.c[i] << ", tolerance "
                      << tol);
      return;
    }
  }
}

// Each CPU GEMM library the build has (Note [CPU GEMM libraries]), the
// default restored after.
template <typename Body>
void for_each_library(Body&& body) {
  const std::vector<kernels::cpu::GemmLibrary> libraries = kernels::cpu::gemm_libraries();
  for (kernels::cpu::GemmLibrary library : libraries) {
    INFO("library " << kernels::cpu::gemm_library_name(library));
    kernels::cpu::use_gemm_library(library);
    body();
  }
  kernels::cpu::use_gemm_library(libraries.front());
}

}  // namespace

TEST_CASE("cpu gemm matches a float64 loop for odd shapes, transposes and dtypes",
          "[kernels][gemm]") {
  const Case cases[] = {{DType::f32, DType::f32},
                        {DType::f16, DType::f32},
                        {DType::f16, DType::f16},
                        {DType::bf16, DType::f32},
                        {DType::bf16, DType::bf16}};
  const std::int64_t sizes[] = {1, 7, 33, 129};
  for_each_library([&] {
    for (const Case& types : cases)
      for (std::int64_t m : sizes)
        for (std::int64_t n : sizes)
          for (std::int64_t k : sizes)
            for (int t = 0; t < 4; ++t) check_gemm(t & 1, t & 2, m, n, k, types, 1.0f, 0.0f);
  });
}

TEST_CASE("cpu gemm applies alpha and accumulates with beta", "[kernels][gemm]") {
  for_each_library([] {
    for (DType c_type : {DType::f32, DType::bf16}) {
      const DType ab = c_type == DType::f32 ? DType::f32 : DType::bf16;
      check_gemm(false, true, 33, 7, 129, {ab, c_type}, 0.5f, 1.0f);
      check_gemm(true, false, 7, 33, 1, {ab, c_type}, -2.0f, 0.25f);
    }
  });
}

TEST_CASE("the cpu gemm library is chosen by name among those the build has", "[kernels][gemm]") {
  using kernels::cpu::GemmLibrary;
  const std::vector<GemmLibrary> libraries = kernels::cpu::gemm_libraries();
  // OpenBLAS is always built in, and last: the fallback.
  REQUIRE(libraries.back() == GemmLibrary::openblas);
  CHECK(kernels::cpu::gemm_library() == libraries.front());
  CHECK(kernels::cpu::parse_gemm_library("OpenBLAS", "--x") == GemmLibrary::openblas);
  CHECK(kernels::cpu::gemm_library() == GemmLibrary::openblas);
  CHECK(kernels::cpu::cpu_gemm_kernels().library.rfind("OpenBLAS ", 0) == 0);
  CHECK_THROWS_WITH(kernels::cpu::parse_gemm_library("mkl", "LOCKSTEP_CPU_GEMM"),
                    Catch::Contains("LOCKSTEP_CPU_GEMM 'mkl' is not a CPU GEMM library") &&
                        Catch::Contains("openblas"));
  if (libraries.front() == GemmLibrary::onednn) {
    CHECK(kernels::cpu::parse_gemm_library("onednn", "--x") == GemmLibrary::onednn);
    const kernels::cpu::CpuGemmKernels k = kernels::cpu::cpu_gemm_kernels();
    CHECK(k.library.rfind("oneDNN ", 0) == 0);
    CHECK(k.better_coretype.empty());  // OPENBLAS_CORETYPE advice is OpenBLAS's alone
  } else {
    CHECK_THROWS_WITH(kernels::cpu::use_gemm_library(GemmLibrary::onednn),
                      Catch::Contains("oneDNN is not in this build"));
  }
  kernels::cpu::use_gemm_library(libraries.front());
}

TEST_CASE("gemm rejects inconsistent arguments with a message naming them", "[kernels][gemm]") {
  float a[4] = {}, b[4] = {}, c[4] = {};
  GemmArgs g;
  g.m = g.n = g.k = 2;
  g.a = a, g.b = b, g.c = c;
  g.lda = 1, g.ldb = 2, g.ldc = 2;
  CHECK_THROWS_WITH(kernels::cpu::gemm(g),
                    Catch::Contains("lda=1") && Catch::Contains("row length 2"));
  g.lda = 2;
  g.ab_type = DType::f16;
  g.c_type = DType::bf16;
  CHECK_THROWS_AS(kernels::cpu::gemm(g), InvalidArgument);
  g.ab_type = DType::i32;
  CHECK_THROWS_WITH(kernels::cpu::gemm(g), Catch::Contains("i32"));
}

TEST_CASE("cpu strided-batched gemm equals one float64 gemm per batch", "[kernels][gemm]") {
  // Three [5 x 7] x [7 x 6]^T products, operands a fixed stride apart with a
  // gap between batches; each batch checked against its own float64 GEMM.
  const std::int64_t batch = 3, m = 5, n = 6, k = 7, gap = 4;
  const std::int64_t stride_a = m * k + gap, stride_b = n * k + gap, stride_c = m * n + gap;
  const auto a = test::random_matrix(batch * stride_a, DType::f32, 4);
  const auto b = test::random_matrix(batch * stride_b, DType::f32, 5);
  auto c = test::random_matrix(batch * stride_c, DType::f32, 6);
  const auto c_before = c.values;
  GemmArgs g;
  g.trans_b = true;
  g.m = m, g.n = n, g.k = k;
  g.beta = 0.5f;
  g.a = a.bytes.data(), g.lda = k;
  g.b = b.bytes.data(), g.ldb = k;
  g.c = c.bytes.data(), g.ldc = n;
  g.batch = batch, g.stride_a = stride_a, g.stride_b = stride_b, g.stride_c = stride_c;
  kernels::cpu::gemm(g);
  for (std::int64_t i = 0; i < batch; ++i) {
    auto slice = [&](const std::vector<float>& v, std::int64_t at, std::int64_t count) {
      return std::vector<float>(v.begin() + at, v.begin() + at + count);
    };
    const auto ref = test::reference_gemm(
        false, true, m, n, k, 1.0f, slice(a.values, i * stride_a, m * k),
        slice(b.values, i * stride_b, n * k), 0.5f, slice(c_before, i * stride_c, m * n));
    for (std::int64_t e = 0; e < m * n; ++e) {
      const double got = test::decode(c.bytes, DType::f32, i * stride_c + e);
      INFO("batch " << i << " element " << e);
      REQUIRE(std::fabs(got - ref.c[e]) <=
              test::gemm_tolerance(ref.magnitude[e], ref.c[e], k, DType::f32));
    }
    for (std::int64_t e = m * n; e < stride_c; ++e)  // the gap is never written
      REQUIRE(test::decode(c.bytes, DType::f32, i * stride_c + e) == c_before[i * stride_c + e]);
  }
  g.stride_c = m * n - 1;
  CHECK_THROWS_WITH(kernels::cpu::gemm(g), Catch::Contains("batch strides"));
}

TEST_CASE("cpu strided-batched gemm writes outputs side by side in C's rows", "[kernels][gemm]") {
  // Attention's heads in place (Note [heads in place], engine/nn/attention.cpp):
  // batch i's [m x n] output is columns [i * n, (i + 1) * n) of a [m x batch * n]
  // C, read from A's columns the same way. Each batch against its own float64 GEMM.
  const std::int64_t batch = 3, m = 5, n = 4, k = 6;
  const auto a = test::random_matrix(m * batch * k, DType::f32, 7);
  const auto b = test::random_matrix(batch * k * n, DType::f32, 8);
  auto c = test::random_matrix(m * batch * n, DType::f32, 9);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = a.bytes.data(), g.lda = batch * k;
  g.b = b.bytes.data(), g.ldb = n;
  g.c = c.bytes.data(), g.ldc = batch * n;
  g.batch = batch, g.stride_a = k, g.stride_b = k * n, g.stride_c = n;
  kernels::cpu::gemm(g);
  for (std::int64_t i = 0; i < batch; ++i) {
    std::vector<float> ai(m * k),
        bi(b.values.begin() + i * k * n, b.values.begin() + (i + 1) * k * n);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t e = 0; e < k; ++e) ai[r * k + e] = a.values[r * batch * k + i * k + e];
    const auto ref = test::reference_gemm(false, false, m, n, k, 1.0f, ai, bi, 0.0f,
                                          std::vector<float>(m * n, 0.0f));
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t col = 0; col < n; ++col) {
        const double got = test::decode(c.bytes, DType::f32, r * batch * n + i * n + col);
        INFO("batch " << i << " row " << r << " column " << col);
        REQUIRE(
            std::fabs(got - ref.c[r * n + col]) <=
            test::gemm_tolerance(ref.magnitude[r * n + col], ref.c[r * n + col], k, DType::f32));
      }
  }
  g.stride_c = n - 1;  // the batches' columns would overlap
  CHECK_THROWS_WITH(kernels::cpu::gemm(g), Catch::Contains("batch strides"));
  g.stride_c = n + 1;  // the last batch's columns would pass the row's end
  CHECK_THROWS_WITH(kernels::cpu::gemm(g), Catch::Contains("inside ldc=12"));
}

TEST_CASE("each cpu gemm library gives the same bits again at two threads", "[kernels][gemm]") {
  // The claim behind Note [deterministic runs] (docs/architecture.md): no
  // library's split of the work across threads makes a result depend on timing.
  const std::int64_t m = 64, n = 96, k = 1031;  // a long k, where a library may split it
  const auto a = test::random_matrix(m * k, DType::f32, 4);
  const auto b = test::random_matrix(k * n, DType::f32, 5);
  kernels::cpu::set_gemm_threads(2);
  for_each_library([&] {
    std::vector<float> first(static_cast<std::size_t>(m * n)), again(first.size());
    for (std::vector<float>* c : {&first, &again}) {
      GemmArgs g;
      g.m = m, g.n = n, g.k = k;
      g.a = a.bytes.data(), g.lda = k;
      g.b = b.bytes.data(), g.ldb = n;
      g.c = c->data(), g.ldc = n;
      for (int repeat = 0; repeat < 20; ++repeat) kernels::cpu::gemm(g);
    }
    CHECK(first == again);
  });
  kernels::cpu::set_gemm_threads(1);
}
