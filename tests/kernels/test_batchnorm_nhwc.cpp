// CPU BatchNorm on channels-last data (Note [cpu channels-last batchnorm]):
// an NHWC activation passed as BatchNormShape{N * H * W, C, 1} gives the NCHW
// call's statistics, running statistics and parameter gradients bit for bit
// and its y and dx transposed, unfused in f32 and fused (every epilogue) in
// f32, f16 and bf16: the property the channels-last layers rely on.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/batchnorm.h"
#include "support/pool_nhwc_cases.h"

using namespace lockstep;
using kernels::BatchNormEpilogue;
using kernels::BatchNormShape;
using test::bit_mismatches;
using test::transpose_images;

namespace {

struct Case {
  std::int64_t n, c, h, w;
};
// Odd sizes, a 64-channel one (the vectorisable inner loop), and H = 1.
constexpr Case kCases[] = {{3, 5, 7, 3}, {2, 64, 5, 4}, {2, 3, 1, 9}, {4, 17, 2, 3}};

std::vector<float> affine(std::int64_t c, float base, float step) {
  std::vector<float> v(static_cast<std::size_t>(c));
  for (std::int64_t i = 0; i < c; ++i) v[i] = base + step * static_cast<float>(i % 7);
  return v;
}

template <typename T>
std::vector<char> bytes_of(const std::vector<T>& v) {
  return test::as_raw(v);
}

}  // namespace

TEST_CASE("cpu batchnorm on NHWC rows equals the NCHW call transposed, bit for bit",
          "[kernels][batchnorm]") {
  for (const Case k : kCases) {
    CAPTURE(k.n, k.c, k.h, k.w);
    const std::int64_t hw = k.h * k.w, count = k.n * k.c * hw;
    const BatchNormShape planes{k.n, k.c, hw, 1e-5}, rows{k.n * hw, k.c, 1, 1e-5};
    auto x = test::random_values(count, 81);
    for (float& v : x) v = 3.0f * v + 1.5f;  // statistics away from N(0, 1)
    const auto dy = test::random_values(count, 82);
    const auto x_rows = transpose_images(bytes_of(x), 4, k.n, k.c, hw);
    const auto dy_rows = transpose_images(bytes_of(dy), 4, k.n, k.c, hw);
    const auto w = affine(k.c, 0.5f, 0.1f), b = affine(k.c, -0.3f, 0.05f);

    struct Run {
      std::vector<float> y, mean, rstd, run_mean, run_var, dx, dw, db, y_eval;
    };
    auto run = [&](const BatchNormShape& s, const float* xs, const float* dys) {
      Run r{std::vector<float>(count),      std::vector<float>(k.c),
            std::vector<float>(k.c),        std::vector<float>(k.c, 0.2f),
            std::vector<float>(k.c, 1.5f),  std::vector<float>(count),
            std::vector<float>(k.c, 0.25f), std::vector<float>(k.c, -0.5f),
            std::vector<float>(count)};
      kernels::cpu::batchnorm_forward_training(s, xs, w.data(), b.data(), r.y.data(), r.mean.data(),
                                               r.rstd.data(), 0.1, r.run_mean.data(),
                                               r.run_var.data());
      kernels::cpu::batchnorm_backward(s, xs, dys, w.data(), r.mean.data(), r.rstd.data(),
                                       r.dx.data(), r.dw.data(), r.db.data());
      kernels::cpu::batchnorm_forward_inference(s, xs, w.data(), b.data(), r.run_mean.data(),
                                                r.run_var.data(), r.y_eval.data());
      return r;
    };
    const Run p = run(planes, x.data(), dy.data());
    const Run r = run(rows, reinterpret_cast<const float*>(x_rows.data()),
                      reinterpret_cast<const float*>(dy_rows.data()));
    auto to_rows = [&](const std::vector<float>& v) {
      return transpose_images(bytes_of(v), 4, k.n, k.c, hw);
    };
    CHECK(bit_mismatches(bytes_of(r.mean), bytes_of(p.mean), 4) == 0);
    CHECK(bit_mismatches(bytes_of(r.rstd), bytes_of(p.rstd), 4) == 0);
    CHECK(bit_mismatches(bytes_of(r.run_mean), bytes_of(p.run_mean), 4) == 0);
    CHECK(bit_mismatches(bytes_of(r.run_var), bytes_of(p.run_var), 4) == 0);
    CHECK(bit_mismatches(bytes_of(r.dw), bytes_of(p.dw), 4) == 0);
    CHECK(bit_mismatches(bytes_of(r.db), bytes_of(p.db), 4) == 0);
    CHECK(bit_mismatches(bytes_of(r.y), to_rows(p.y), 4) == 0);
    CHECK(bit_mismatches(bytes_of(r.dx), to_rows(p.dx), 4) == 0);
    CHECK(bit_mismatches(bytes_of(r.y_eval), to_rows(p.y_eval), 4) == 0);
  }
}

TEST_CASE(
    "cpu fused batchnorm on NHWC rows equals the NCHW call transposed in every dtype and "
    "epilogue",
    "[kernels][batchnorm]") {
  for (const DType type : {DType::f32, DType::f16, DType::bf16})
    for (const BatchNormEpilogue epi :
         {BatchNormEpilogue::none, BatchNormEpilogue::relu, BatchNormEpilogue::add_relu})
      for (const Case k : kCases) {
        CAPTURE(dtype_name(type), static_cast<int>(epi), k.n, k.c, k.h, k.w);
        const std::size_t e = dtype_size(type);
        const std::int64_t hw = k.h * k.w, count = k.n * k.c * hw;
        const BatchNormShape planes{k.n, k.c, hw, 1e-5}, rows{k.n * hw, k.c, 1, 1e-5};
        const bool add = epi == BatchNormEpilogue::add_relu;
        auto xv = test::random_values(count, 91);
        for (float& v : xv) v = 2.0f * v + 0.5f;
        const auto x = test::raw_from_f32(xv, type);
        const auto id = test::raw_from_f32(test::random_values(count, 92), type);
        const auto dy = test::raw_from_f32(test::random_values(count, 93), type);
        const auto w = affine(k.c, 0.5f, 0.1f), b = affine(k.c, -0.3f, 0.05f);
        auto nhwc = [&](const std::vector<char>& v) {
          return transpose_images(v, e, k.n, k.c, hw);
        };
        const auto x_rows = nhwc(x), id_rows = nhwc(id), dy_rows = nhwc(dy);

        struct Run {
          std::vector<char> y, dx, d_id, y_eval;
          std::vector<float> mean, rstd, run_mean, run_var, dw, db;
        };
        auto run = [&](const BatchNormShape& s, const std::vector<char>& xs,
                       const std::vector<char>& ids, const std::vector<char>& dys) {
          Run r{std::vector<char>(count * e),   std::vector<char>(count * e),
                std::vector<char>(count * e),   std::vector<char>(count * e),
                std::vector<float>(k.c),        std::vector<float>(k.c),
                std::vector<float>(k.c, 0.0f),  std::vector<float>(k.c, 1.0f),
                std::vector<float>(k.c, 0.25f), std::vector<float>(k.c, -0.5f)};
          kernels::cpu::batchnorm_fused_forward_training(
              s, type, epi, xs.data(), add ? ids.data() : nullptr, w.data(), b.data(), r.y.data(),
              r.mean.data(), r.rstd.data(), 0.1, r.run_mean.data(), r.run_var.data());
          kernels::cpu::batchnorm_fused_backward(
              s, type, epi, xs.data(), r.y.data(), dys.data(), w.data(), r.mean.data(),
              r.rstd.data(), r.dx.data(), add ? r.d_id.data() : nullptr, r.dw.data(), r.db.data());
          kernels::cpu::batchnorm_fused_forward_inference(
              s, type, epi, xs.data(), add ? ids.data() : nullptr, w.data(), b.data(),
              r.run_mean.data(), r.run_var.data(), r.y_eval.data());
          return r;
        };
        const Run p = run(planes, x, id, dy);
        const Run r = run(rows, x_rows, id_rows, dy_rows);
        CHECK(bit_mismatches(bytes_of(r.mean), bytes_of(p.mean), 4) == 0);
        CHECK(bit_mismatches(bytes_of(r.rstd), bytes_of(p.rstd), 4) == 0);
        CHECK(bit_mismatches(bytes_of(r.run_var), bytes_of(p.run_var), 4) == 0);
        CHECK(bit_mismatches(bytes_of(r.dw), bytes_of(p.dw), 4) == 0);
        CHECK(bit_mismatches(bytes_of(r.db), bytes_of(p.db), 4) == 0);
        CHECK(bit_mismatches(r.y, nhwc(p.y), e) == 0);
        CHECK(bit_mismatches(r.dx, nhwc(p.dx), e) == 0);
        if (add) CHECK(bit_mismatches(r.d_id, nhwc(p.d_id), e) == 0);
        CHECK(bit_mismatches(r.y_eval, nhwc(p.y_eval), e) == 0);
      }
}
