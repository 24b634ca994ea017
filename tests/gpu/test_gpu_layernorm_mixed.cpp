// The mixed-type CUDA LayerNorm kernels (Note [low-type LayerNorm],
// kernels/layernorm.h) against their CPU twins: forward from and to f32, f16
// and bf16, the fused residual add + LayerNorm, the backward with the
// stream's gradient added, and the residual add, at GPT-2's [8192, 768] and
// at odd shapes; the same bits on a second run; and, at GPT-2's shape in
// bf16, the fused kernels' time beside the unfused casts, add and f32
// LayerNorm they replace (printed for docs/gpu-results.md).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <utility>
#include <vector>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/layernorm.h"
#include "support/reference.h"

using namespace lockstep;
using namespace lockstep::core;

namespace {

const Device kGpu = Device::cuda(0);

Tensor on_gpu(const test::RandomMatrix& m, DType type) {
  return Tensor::from_host(m.bytes.data(), {static_cast<std::int64_t>(m.values.size())}, type,
                           kGpu);
}

std::vector<float> read(const Tensor& t) { return t.cast(DType::f32).to_vector<float>(); }

std::vector<float> decode_all(const std::vector<std::uint8_t>& bytes, DType type) {
  std::vector<float> v(bytes.size() / dtype_size(type));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = test::decode(bytes, type, std::int64_t(i));
  return v;
}

// One low-type ulp relative: two f32 values a few f32 ulps apart can round
// to neighbours, 2^-7 (bf16) or 2^-10 (f16) apart at worst.
double ulp(DType type) {
  return type == DType::bf16 ? 1.0 / 128 : type == DType::f16 ? 1.0 / 1024 : 0.0;
}

// The message is built only for the element that fails (an INFO per element
// is slow at 6M elements).
void require_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double abs_tol,
                   double rel_tol, const char* what) {
  REQUIRE(gpu.size() == cpu.size());
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    if (std::fabs(gpu[k] - cpu[k]) <= abs_tol + rel_tol * std::fabs(cpu[k])) continue;
    INFO(what << " element " << k << ": cuda " << gpu[k] << ", cpu " << cpu[k]);
    REQUIRE(std::fabs(gpu[k] - cpu[k]) <= abs_tol + rel_tol * std::fabs(cpu[k]));
  }
}

// Column sums of f64 terms in different orders, then one f32 rounding: the
// bound of test_gpu_row_kernels.cpp's require_column_sums_close, with the
// terms' magnitudes bounded by rows x max|term| (terms here are |dy xhat| <=
// 1 x 4 and |dy| <= 1).
void require_sums_close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                        std::int64_t rows, const char* what) {
  for (std::size_t j = 0; j < cpu.size(); ++j) {
    const double tol = std::ldexp(std::fabs(cpu[j]), -23) + std::ldexp(rows * 4.0 * rows, -52);
    if (std::fabs(gpu[j] - cpu[j]) <= tol) continue;
    INFO(what << " column " << j << ": cuda " << gpu[j] << ", cpu " << cpu[j]);
    REQUIRE(std::fabs(gpu[j] - cpu[j]) <= tol);
  }
}

// Tolerances: both sides compute row statistics in f64 (in different orders)
// and round them to f32, which may then differ by an ulp: outputs agree to a
// few f32 ulps (1e-5 relative, 1e-5 absolute), plus one ulp of a low output
// type; the residual sum is one f32 addition on both sides: the same bits.
void check_shape(std::int64_t rows, std::int64_t cols, DType in_type, DType out_type) {
  INFO(rows << " x " << cols << ", in " << dtype_name(in_type) << ", out " << dtype_name(out_type));
  const std::int64_t n = rows * cols;
  const kernels::LayerNormShape s{rows, cols, 1e-5f};
  const auto x = test::random_matrix(n, in_type, 61);
  const auto gamma = test::random_matrix(cols, DType::f32, 62).values;
  const auto beta = test::random_matrix(cols, DType::f32, 63).values;
  const auto residual = test::random_matrix(n, DType::f32, 64).values;
  const Tensor gx = on_gpu(x, in_type);
  const Tensor ggamma = Tensor::from_vector(gamma, {cols}, DType::f32, kGpu);
  const Tensor gbeta = Tensor::from_vector(beta, {cols}, DType::f32, kGpu);
  const Tensor gresidual = Tensor::from_vector(residual, {n}, DType::f32, kGpu);
  const double out_tol = 1e-5 + ulp(out_type);

  // Forward.
  std::vector<std::uint8_t> y(n * dtype_size(out_type));
  std::vector<float> mean(rows), rstd(rows);
  kernels::cpu::layernorm_forward_mixed(s, x.bytes.data(), in_type, gamma.data(), beta.data(),
                                        y.data(), out_type, mean.data(), rstd.data());
  std::vector<float> runs[2];
  for (auto& run : runs) {
    Tensor gy = Tensor::empty({n}, out_type, kGpu);
    Tensor gm = Tensor::empty({rows}, DType::f32, kGpu),
           gr = Tensor::empty({rows}, DType::f32, kGpu);
    kernels::cuda::layernorm_forward_mixed(s, gx.data(), in_type, ggamma.data_as<float>(),
                                           gbeta.data_as<float>(), gy.data(), out_type,
                                           gm.data_as<float>(), gr.data_as<float>(), nullptr);
    run = read(gy);
    require_close(gm.to_vector<float>(), mean, 1e-6, 1e-6, "mean");
    require_close(gr.to_vector<float>(), rstd, 0.0, 1e-6, "rstd");
  }
  require_close(runs[0], decode_all(y, out_type), 1e-5, out_tol, "y");
  CHECK(runs[1] == runs[0]);

  // The fused residual add (branch = x) and LayerNorm.
  std::vector<float> sum(n);
  kernels::cpu::add_layernorm_forward(s, residual.data(), x.bytes.data(), in_type, gamma.data(),
                                      beta.data(), sum.data(), y.data(), out_type, mean.data(),
                                      rstd.data());
  {
    Tensor gsum = Tensor::empty({n}, DType::f32, kGpu), gy = Tensor::empty({n}, out_type, kGpu);
    Tensor gm = Tensor::empty({rows}, DType::f32, kGpu),
           gr = Tensor::empty({rows}, DType::f32, kGpu);
    kernels::cuda::add_layernorm_forward(s, gresidual.data_as<float>(), gx.data(), in_type,
                                         ggamma.data_as<float>(), gbeta.data_as<float>(),
                                         gsum.data_as<float>(), gy.data(), out_type,
                                         gm.data_as<float>(), gr.data_as<float>(), nullptr);
    CHECK(gsum.to_vector<float>() == sum);
    require_close(read(gy), decode_all(y, out_type), 1e-5, out_tol, "fused y");
    require_close(gr.to_vector<float>(), rstd, 0.0, 1e-6, "fused rstd");
  }

  // Backward from the CPU forward's statistics (both sides), dy in out_type,
  // the stream's gradient added, dx in in_type.
  kernels::cpu::layernorm_forward_mixed(s, x.bytes.data(), in_type, gamma.data(), beta.data(),
                                        y.data(), out_type, mean.data(), rstd.data());
  const auto dy = test::random_matrix(n, out_type, 65);
  const auto dresidual = test::random_matrix(n, DType::f32, 66).values;
  const auto dgamma0 = test::random_matrix(cols, DType::f32, 67).values;
  const auto dbeta0 = test::random_matrix(cols, DType::f32, 68).values;
  const Tensor gdy = on_gpu(dy, out_type);
  const Tensor gdres = Tensor::from_vector(dresidual, {n}, DType::f32, kGpu);
  const Tensor gm = Tensor::from_vector(mean, {rows}, DType::f32, kGpu);
  const Tensor gr = Tensor::from_vector(rstd, {rows}, DType::f32, kGpu);
  Tensor ws = Tensor::empty(
      {static_cast<std::int64_t>(kernels::cuda::layernorm_backward_workspace_bytes(s))}, DType::u8,
      kGpu);
  for (const bool with_stream : {true, false}) {
    INFO("the stream's gradient " << (with_stream ? "added" : "absent"));
    std::vector<std::uint8_t> dx(n * dtype_size(in_type));
    std::vector<float> dgamma = dgamma0, dbeta = dbeta0;
    kernels::cpu::layernorm_backward_mixed(s, dy.bytes.data(), out_type, x.bytes.data(), in_type,
                                           mean.data(), rstd.data(), gamma.data(),
                                           with_stream ? dresidual.data() : nullptr, dx.data(),
                                           dgamma.data(), dbeta.data());
    std::vector<float> dx_runs[2], dgamma_runs[2], dbeta_runs[2];
    for (int run = 0; run < 2; ++run) {
      Tensor gdx = Tensor::empty({n}, in_type, kGpu);
      Tensor gdgamma = Tensor::from_vector(dgamma0, {cols}, DType::f32, kGpu);
      Tensor gdbeta = Tensor::from_vector(dbeta0, {cols}, DType::f32, kGpu);
      kernels::cuda::layernorm_backward_mixed(
          s, gdy.data(), out_type, gx.data(), in_type, gm.data_as<float>(), gr.data_as<float>(),
          ggamma.data_as<float>(), with_stream ? gdres.data_as<float>() : nullptr, gdx.data(),
          gdgamma.data_as<float>(), gdbeta.data_as<float>(), ws.data(), nullptr);
      dx_runs[run] = read(gdx);
      dgamma_runs[run] = gdgamma.to_vector<float>();
      dbeta_runs[run] = gdbeta.to_vector<float>();
    }
    // dx: the same f64 row formula summed in another order (1e-5, as the f32
    // kernel's test), plus one ulp of a low input type.
    require_close(dx_runs[0], decode_all(dx, in_type), 1e-5, 1e-5 + ulp(in_type), "dx");
    require_sums_close(dgamma_runs[0], dgamma, rows, "dgamma");
    require_sums_close(dbeta_runs[0], dbeta, rows, "dbeta");
    CHECK(dx_runs[1] == dx_runs[0]);
    CHECK(dgamma_runs[1] == dgamma_runs[0]);
    CHECK(dbeta_runs[1] == dbeta_runs[0]);
  }

  // The residual add: one f32 addition, the same bits; in place too.
  std::vector<float> added(n);
  kernels::cpu::residual_add(n, residual.data(), x.bytes.data(), in_type, added.data());
  Tensor gadded = Tensor::from_vector(residual, {n}, DType::f32, kGpu);
  kernels::cuda::residual_add(n, gadded.data_as<float>(), gx.data(), in_type,
                              gadded.data_as<float>(), nullptr);
  CHECK(gadded.to_vector<float>() == added);
}

}  // namespace

TEST_CASE("cuda mixed-type LayerNorm and the fused residual add match the cpu twins",
          "[gpu][layernorm]") {
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  // gpt2's shape with the residual stream in f32 (the block's case) ...
  for (const DType out : types) check_shape(8192, 768, DType::f32, out);
  // ... and odd shapes, every pair of types: a row shorter than a warp, one
  // column, a width with a tail past the last whole warp, gpt2-xl's width.
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{5, 37}, {3, 1}, {333, 1023}, {9, 1600}};
  for (const auto& [rows, cols] : shapes)
    for (const DType in : types)
      for (const DType out : types) check_shape(rows, cols, in, out);
}

TEST_CASE("cuda fused residual add + LayerNorm at gpt2's shape, timed against the unfused ops",
          "[gpu][layernorm]") {
  // bf16 autocast at B x T = 8192, C = 768: the unfused block ran the
  // branch's cast to f32, the f32 add, the f32 LayerNorm and the next Linear's
  // cast to bf16; backward the cast of dy, the f32 LayerNorm backward and the
  // residual add. Printed, not asserted: a timing on a shared machine.
  const std::int64_t rows = 8192, cols = 768, n = rows * cols;
  const kernels::LayerNormShape s{rows, cols, 1e-5f};
  Stream stream = Stream::create(kGpu);
  const kernels::CudaStream h = stream.handle();
  auto f32 = [&](std::int64_t k) { return Tensor::empty({k}, DType::f32, kGpu, stream); };
  auto bf16 = [&](std::int64_t k) { return Tensor::empty({k}, DType::bf16, kGpu, stream); };
  Tensor x = f32(n), branch = bf16(n), sum = f32(n), y = bf16(n), y32 = f32(n), b32 = f32(n);
  Tensor dy = bf16(n), dy32 = f32(n), dx = f32(n), dstream = f32(n), mean = f32(rows),
         rstd = f32(rows), gamma = f32(cols), beta = f32(cols), dgamma = f32(cols),
         dbeta = f32(cols);
  for (Tensor* t : {&x, &sum, &dstream, &gamma, &beta, &dgamma, &dbeta, &mean, &rstd})
    kernels::cuda::fill(t->data(), DType::f32, t->numel(), 0.5, h);
  for (Tensor* t : {&branch, &dy}) kernels::cuda::fill(t->data(), DType::bf16, n, 0.25, h);
  Tensor ws = Tensor::empty(
      {static_cast<std::int64_t>(kernels::cuda::layernorm_backward_workspace_bytes(s))}, DType::u8,
      kGpu, stream);
  auto time_ms = [&](const std::function<void()>& run) {
    run();
    stream.synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) run();
    stream.synchronize();
    return 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
           20;
  };
  const float *g = gamma.data_as<float>(), *b = beta.data_as<float>();
  float *m = mean.data_as<float>(), *r = rstd.data_as<float>();
  const double unfused_fwd = time_ms([&] {
    kernels::cuda::cast(branch.data(), DType::bf16, b32.data(), DType::f32, n, h);
    kernels::cuda::add(b32.data(), x.data(), sum.data(), DType::f32, n, h);
    kernels::cuda::layernorm_forward(s, sum.data_as<float>(), g, b, y32.data_as<float>(), m, r, h);
    kernels::cuda::cast(y32.data(), DType::f32, y.data(), DType::bf16, n, h);
  });
  const double fused_fwd = time_ms([&] {
    kernels::cuda::add_layernorm_forward(s, x.data_as<float>(), branch.data(), DType::bf16, g, b,
                                         sum.data_as<float>(), y.data(), DType::bf16, m, r, h);
  });
  const double unfused_bwd = time_ms([&] {
    kernels::cuda::cast(dy.data(), DType::bf16, dy32.data(), DType::f32, n, h);
    kernels::cuda::layernorm_backward(s, dy32.data_as<float>(), sum.data_as<float>(), m, r, g,
                                      y32.data_as<float>(), dgamma.data_as<float>(),
                                      dbeta.data_as<float>(), ws.data(), h);
    kernels::cuda::add(y32.data(), dstream.data(), dx.data(), DType::f32, n, h);
  });
  const double fused_bwd = time_ms([&] {
    kernels::cuda::layernorm_backward_mixed(
        s, dy.data(), DType::bf16, sum.data(), DType::f32, m, r, g, dstream.data_as<float>(),
        dx.data(), dgamma.data_as<float>(), dbeta.data_as<float>(), ws.data(), h);
  });
  std::printf(
      "residual add + LayerNorm [8192, 768] bf16: forward unfused %.3f ms, fused %.3f ms; "
      "backward unfused %.3f ms, fused %.3f ms\n",
      unfused_fwd, fused_fwd, unfused_bwd, fused_bwd);
  CHECK(fused_fwd > 0.0);
}
