// The CUDA kernels that reduce or scatter over rows, against their CPU twins:
// the two-pass column sums (a Linear's bias gradient, LayerNorm's dgamma and
// dbeta: Note [column chunks]) within f64 reordering plus one f32 rounding,
// and the same bits on a second run.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/bias.h"
#include "kernels/layernorm.h"
#include "support/reference.h"

using namespace lockstep;
using namespace lockstep::core;

namespace {

const Device kGpu = Device::cuda(0);

Tensor workspace(std::size_t bytes) {
  return Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::u8, kGpu);
}

// Both sides add the same f64 terms, in different orders: they differ by at most
// 2^-52 rows sum|terms| ((n - 1) 2^-53 sum|t| each), then by one f32 rounding.
void require_column_sums_close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                               const std::vector<double>& magnitude, std::int64_t rows,
                               const char* what) {
  REQUIRE(gpu.size() == cpu.size());
  for (std::size_t j = 0; j < cpu.size(); ++j) {
    INFO(what << " column " << j << ": cuda " << gpu[j] << ", cpu " << cpu[j]);
    const double tol = std::ldexp(std::fabs(cpu[j]), -23) +
                       std::ldexp(static_cast<double>(rows) * magnitude[j], -52) + 1e-30;
    REQUIRE(std::fabs(gpu[j] - cpu[j]) <= tol);
  }
}

}  // namespace

TEST_CASE("cuda bias gradient matches the cpu over many row chunks, the same bits each run",
          "[gpu][bias]") {
  // 5000 x 77: 79 chunks of 64 rows (the last 8) x 3 tiles (the last 13 columns);
  // 16384 x 768 is gpt2's; one row and no rows are the edges.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {5000, 77}, {16384, 768}, {1, 40}, {0, 33}};
  for (const auto& [rows, cols] : shapes) {
    for (DType type : {DType::f32, DType::f16, DType::bf16}) {
      INFO(rows << " x " << cols << " " << dtype_name(type));
      const auto dy = test::random_matrix(rows * cols, type, 41);
      const auto db0 = test::random_matrix(cols, DType::f32, 42).values;
      std::vector<float> cpu = db0;
      kernels::cpu::bias_grad(dy.bytes.data(), type, rows, cols, cpu.data());
      std::vector<double> magnitude(cols, 0.0);
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) magnitude[j] += std::fabs(dy.values[i * cols + j]);
      const Tensor g = Tensor::from_host(dy.bytes.data(), {rows * cols}, type, kGpu);
      Tensor ws = workspace(kernels::cuda::bias_grad_workspace_bytes(rows, cols));
      std::vector<float> runs[2];
      for (auto& run : runs) {
        Tensor db = Tensor::from_vector(db0, {cols}, DType::f32, kGpu);
        kernels::cuda::bias_grad(g.data(), type, rows, cols, db.data_as<float>(), ws.data(),
                                 nullptr);
        run = db.to_vector<float>();
      }
      require_column_sums_close(runs[0], cpu, magnitude, rows, "db");
      CHECK(runs[1] == runs[0]);
    }
  }
}

TEST_CASE("cuda LayerNorm weight and bias gradients match the cpu, the same bits each run",
          "[gpu][layernorm]") {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {5000, 77}, {16384, 768}, {3, 40}};
  for (const auto& [rows, cols] : shapes) {
    INFO(rows << " x " << cols);
    const kernels::LayerNormShape s{rows, cols, 1e-5f};
    const auto x = test::random_matrix(rows * cols, DType::f32, 43).values;
    const auto dy = test::random_matrix(rows * cols, DType::f32, 44).values;
    const auto gamma = test::random_matrix(cols, DType::f32, 45).values;
    const auto beta = test::random_matrix(cols, DType::f32, 46).values;
    const auto dgamma0 = test::random_matrix(cols, DType::f32, 47).values;
    const auto dbeta0 = test::random_matrix(cols, DType::f32, 48).values;
    // One set of statistics for both backwards: the CPU forward's.
    std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols);
    kernels::cpu::layernorm_forward(s, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                    rstd.data());
    std::vector<float> dgamma = dgamma0, dbeta = dbeta0;
    kernels::cpu::layernorm_backward(s, dy.data(), x.data(), mean.data(), rstd.data(), gamma.data(),
                                     dx.data(), dgamma.data(), dbeta.data());
    std::vector<double> mag_gamma(cols, 0.0), mag_beta(cols, 0.0);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        const double g = dy[i * cols + j];
        mag_gamma[j] += std::fabs(g * (x[i * cols + j] - static_cast<double>(mean[i])) * rstd[i]);
        mag_beta[j] += std::fabs(g);
      }
    const Tensor gx = Tensor::from_vector(x, {rows * cols}, DType::f32, kGpu);
    const Tensor gdy = Tensor::from_vector(dy, {rows * cols}, DType::f32, kGpu);
    const Tensor gmean = Tensor::from_vector(mean, {rows}, DType::f32, kGpu);
    const Tensor grstd = Tensor::from_vector(rstd, {rows}, DType::f32, kGpu);
    const Tensor ggamma = Tensor::from_vector(gamma, {cols}, DType::f32, kGpu);
    Tensor gdx = Tensor::empty({rows * cols}, DType::f32, kGpu);
    Tensor ws = workspace(kernels::cuda::layernorm_backward_workspace_bytes(s));
    std::vector<float> runs_gamma[2], runs_beta[2];
    for (int run = 0; run < 2; ++run) {
      Tensor gdgamma = Tensor::from_vector(dgamma0, {cols}, DType::f32, kGpu);
      Tensor gdbeta = Tensor::from_vector(dbeta0, {cols}, DType::f32, kGpu);
      kernels::cuda::layernorm_backward(
          s, gdy.data_as<float>(), gx.data_as<float>(), gmean.data_as<float>(),
          grstd.data_as<float>(), ggamma.data_as<float>(), gdx.data_as<float>(),
          gdgamma.data_as<float>(), gdbeta.data_as<float>(), ws.data(), nullptr);
      runs_gamma[run] = gdgamma.to_vector<float>();
      runs_beta[run] = gdbeta.to_vector<float>();
    }
    require_column_sums_close(runs_gamma[0], dgamma, mag_gamma, rows, "dgamma");
    require_column_sums_close(runs_beta[0], dbeta, mag_beta, rows, "dbeta");
    CHECK(runs_gamma[1] == runs_gamma[0]);
    CHECK(runs_beta[1] == runs_beta[0]);
    // dx: the same row formula in f64 (differing in summation order): 1e-5 relative.
    const auto gpu_dx = gdx.to_vector<float>();
    for (std::size_t k = 0; k < dx.size(); ++k) {
      INFO("dx element " << k << ": cuda " << gpu_dx[k] << ", cpu " << dx[k]);
      REQUIRE(std::fabs(gpu_dx[k] - dx[k]) <= 1e-5 + 1e-5 * std::fabs(dx[k]));
    }
  }
}
