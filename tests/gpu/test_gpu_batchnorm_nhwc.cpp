// The fused BatchNorm's channels-last CUDA kernels (spatial == 1, Note
// [channels-last batchnorm] in kernels/cuda/batchnorm_rows.cu): against the CPU
// twin at the same shape, at resnet50's NHWC shapes at batch 256 ([256*56*56,
// 64], [256*7*7, 2048]) and odd ones ([1000003, 3], channel counts that do and
// do not fill a 16-byte pack), every epilogue, f32/f16/bf16; the same bits on
// a second run; and against the NCHW CUDA kernels on the transposed data.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/batchnorm.h"
#include "kernels/half.h"
#include "support/pool_nhwc_cases.h"

using namespace lockstep;
using namespace lockstep::core;
using kernels::BatchNormEpilogue;
using kernels::BatchNormShape;
using test::transpose_images;

namespace {

const Device kGpu = Device::cuda(0);
constexpr BatchNormEpilogue kEpilogues[] = {BatchNormEpilogue::none, BatchNormEpilogue::relu,
                                            BatchNormEpilogue::add_relu};

// One ulp of the type relative to the value (as test_batchnorm_fused_gpu.cpp):
// both sides compute in f32 (the twin partly in f64) and round once.
double ulp(DType type) {
  return type == DType::f16 ? 1.0 / 1024 : type == DType::bf16 ? 1.0 / 128 : 0.0;
}

std::vector<float> widen(const std::vector<char>& raw, DType type) {
  const std::size_t e = dtype_size(type);
  std::vector<float> out(raw.size() / e);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (type == DType::f32) {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
      continue;
    }
    std::uint16_t b;
    std::memcpy(&b, raw.data() + 2 * i, 2);
    out[i] = type == DType::f16 ? kernels::f16_bits_to_f32(b) : kernels::bf16_bits_to_f32(b);
  }
  return out;
}

// |gpu - cpu| <= abs + rel |cpu| for every element (NaN nowhere).
void require_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double abs_tol,
                   double rel_tol, const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (std::fabs(gpu[i] - cpu[i]) <= abs_tol + rel_tol * std::fabs(cpu[i])) continue;
    INFO(what << " element " << i << ": cuda " << gpu[i] << ", cpu " << cpu[i]);
    REQUIRE(std::fabs(gpu[i] - cpu[i]) <= abs_tol + rel_tol * std::fabs(cpu[i]));
  }
}

Tensor on_gpu(const std::vector<char>& raw, DType type) {
  return Tensor::from_host(raw.data(), {static_cast<std::int64_t>(raw.size() / dtype_size(type))},
                           type, kGpu);
}
Tensor on_gpu(const std::vector<float>& v) { return on_gpu(test::as_raw(v), DType::f32); }
std::vector<char> raw(const Tensor& t) {
  std::vector<char> out(static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()));
  t.copy_to_host(out.data());
  return out;
}
std::vector<float> floats(const Tensor& t) { return widen(raw(t), t.dtype()); }

Tensor workspace(const BatchNormShape& s) {
  return Tensor::empty({static_cast<std::int64_t>(kernels::batchnorm_fused_workspace_bytes(s))},
                       DType::u8, kGpu);
}

std::vector<float> affine(std::int64_t c, float base, float step, int period) {
  std::vector<float> v(static_cast<std::size_t>(c));
  for (std::int64_t i = 0; i < c; ++i) v[i] = base + step * static_cast<float>(i % period);
  return v;
}

// The f32 inputs of one shape, made once for its nine cases: x with a mean of
// 1.5 and a spread of 3, so the statistics are not those of N(0, 1).
struct Inputs {
  std::vector<float> x, x_eval, identity, dy, w, b;
  Inputs(std::int64_t n, std::int64_t c)
      : x(test::random_values(n, 101)),
        x_eval(test::random_values(n, 102)),
        identity(test::random_values(n, 103)),
        dy(test::random_values(n, 104)),
        w(affine(c, 0.5f, 0.01f, 97)),
        b(affine(c, -0.3f, 0.005f, 61)) {
    for (float& v : x) v = 3.0f * v + 1.5f;
    for (float& v : x_eval) v *= 3.0f;
  }
};

// The GPU side of one case: buffers, two training steps, backward from the
// given y and statistics, and eval from the given running statistics.
struct GpuRun {
  std::vector<char> y, dx, d_id, y_eval;
  std::vector<float> mean, rstd, run_mean, run_var, dw, db;
};

GpuRun run_gpu(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
               const std::vector<char>& x, const std::vector<char>& id, const std::vector<char>& dy,
               const std::vector<char>& x_eval, const std::vector<float>& w,
               const std::vector<float>& b, const std::vector<char>& y_for_backward,
               const std::vector<float>& mean_for_backward,
               const std::vector<float>& rstd_for_backward,
               const std::vector<float>& running_mean_for_eval,
               const std::vector<float>& running_var_for_eval) {
  const std::int64_t c = s.channels, n = s.batch * s.channels * s.spatial;
  const bool add = epi == BatchNormEpilogue::add_relu;
  Tensor ws = workspace(s);
  const Tensor gx = on_gpu(x, type), gid = on_gpu(id, type), gdy = on_gpu(dy, type);
  const Tensor gw = on_gpu(w), gb = on_gpu(b);
  Tensor gy = Tensor::empty({n}, type, kGpu);
  Tensor mean = Tensor::empty({c}, DType::f32, kGpu), rstd = Tensor::empty({c}, DType::f32, kGpu);
  Tensor run_mean = on_gpu(std::vector<float>(c, 0.0f)),
         run_var = on_gpu(std::vector<float>(c, 1.0f));
  for (int step = 0; step < 2; ++step)
    kernels::cuda::batchnorm_fused_forward_training(
        s, type, epi, gx.data(), add ? gid.data() : nullptr, gw.data_as<float>(),
        gb.data_as<float>(), gy.data(), mean.data_as<float>(), rstd.data_as<float>(), 0.1,
        run_mean.data_as<float>(), run_var.data_as<float>(), ws.data(), nullptr);
  GpuRun r;
  r.y = raw(gy);
  r.mean = floats(mean);
  r.rstd = floats(rstd);
  r.run_mean = floats(run_mean);
  r.run_var = floats(run_var);

  const Tensor gyb = on_gpu(y_for_backward, type);
  const Tensor gm = on_gpu(mean_for_backward), gr = on_gpu(rstd_for_backward);
  Tensor gdx = Tensor::empty({n}, type, kGpu), gd_id = Tensor::empty({n}, type, kGpu);
  Tensor gdw = on_gpu(std::vector<float>(c, 0.25f)), gdb = on_gpu(std::vector<float>(c, -0.5f));
  kernels::cuda::batchnorm_fused_backward(
      s, type, epi, gx.data(), gyb.data(), gdy.data(), gw.data_as<float>(), gm.data_as<float>(),
      gr.data_as<float>(), gdx.data(), add ? gd_id.data() : nullptr, gdw.data_as<float>(),
      gdb.data_as<float>(), ws.data(), nullptr);
  r.dx = raw(gdx);
  if (add) r.d_id = raw(gd_id);
  r.dw = floats(gdw);
  r.db = floats(gdb);

  const Tensor gxe = on_gpu(x_eval, type);
  const Tensor grm = on_gpu(running_mean_for_eval), grv = on_gpu(running_var_for_eval);
  kernels::cuda::batchnorm_fused_forward_inference(
      s, type, epi, gxe.data(), add ? gid.data() : nullptr, gw.data_as<float>(),
      gb.data_as<float>(), grm.data_as<float>(), grv.data_as<float>(), gy.data(), ws.data(),
      nullptr);
  r.y_eval = raw(gy);
  return r;
}

// The CPU twin of the same case.
struct CpuRun {
  std::vector<char> y, dx, d_id, y_eval;
  std::vector<float> mean, rstd, run_mean, run_var, dw, db;
};

CpuRun run_cpu(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
               const std::vector<char>& x, const std::vector<char>& id, const std::vector<char>& dy,
               const std::vector<char>& x_eval, const std::vector<float>& w,
               const std::vector<float>& b) {
  const std::int64_t c = s.channels, n = s.batch * s.channels * s.spatial;
  const std::size_t e = dtype_size(type);
  const bool add = epi == BatchNormEpilogue::add_relu;
  CpuRun r{std::vector<char>(n * e),    std::vector<char>(n * e),    std::vector<char>(n * e),
           std::vector<char>(n * e),    std::vector<float>(c),       std::vector<float>(c),
           std::vector<float>(c, 0.0f), std::vector<float>(c, 1.0f), std::vector<float>(c, 0.25f),
           std::vector<float>(c, -0.5f)};
  for (int step = 0; step < 2; ++step)
    kernels::cpu::batchnorm_fused_forward_training(
        s, type, epi, x.data(), add ? id.data() : nullptr, w.data(), b.data(), r.y.data(),
        r.mean.data(), r.rstd.data(), 0.1, r.run_mean.data(), r.run_var.data());
  kernels::cpu::batchnorm_fused_backward(s, type, epi, x.data(), r.y.data(), dy.data(), w.data(),
                                         r.mean.data(), r.rstd.data(), r.dx.data(),
                                         add ? r.d_id.data() : nullptr, r.dw.data(), r.db.data());
  kernels::cpu::batchnorm_fused_forward_inference(
      s, type, epi, x_eval.data(), add ? id.data() : nullptr, w.data(), b.data(), r.run_mean.data(),
      r.run_var.data(), r.y_eval.data());
  return r;
}

// Tolerances, as Note [fused batchnorm]'s test states them: y from f32
// arithmetic on O(10) terms (1e-5) then one rounding to the type; statistics
// f64 on both sides (the CUDA side single-pass, shifted by the channel's first
// value, in another order), rounded once to f32 (1e-6); dx from f32 terms of
// O(w rstd |dy|) <= 2 (1e-5) and one rounding; d_identity dy or 0 (exact);
// dweight and dbias f64 sums rounded once to f32.
template <typename A, typename B>
void require_twins(const A& gpu, const B& cpu, DType type, bool add, bool statistics) {
  require_close(widen(gpu.y, type), widen(cpu.y, type), 1e-5, ulp(type) + 1e-6, "y");
  if (statistics) {
    require_close(gpu.mean, cpu.mean, 1e-6, 1e-6, "save_mean");
    require_close(gpu.rstd, cpu.rstd, 0, 1e-6, "save_rstd");
    require_close(gpu.run_mean, cpu.run_mean, 1e-6, 1e-6, "running_mean");
    require_close(gpu.run_var, cpu.run_var, 0, 1e-6, "running_var");
  }
  require_close(widen(gpu.dx, type), widen(cpu.dx, type), 1e-5, ulp(type) + 1e-5, "dx");
  if (add) require_close(widen(gpu.d_id, type), widen(cpu.d_id, type), 0, 0, "d_identity");
  require_close(gpu.dw, cpu.dw, 1e-5, 1e-6, "dweight");
  require_close(gpu.db, cpu.db, 1e-5, 1e-6, "dbias");
  require_close(widen(gpu.y_eval, type), widen(cpu.y_eval, type), 1e-5, ulp(type) + 1e-6, "eval y");
}

}  // namespace

TEST_CASE(
    "cuda channels-last batchnorm matches its cpu twin at resnet50's NHWC shapes and odd "
    "ones",
    "[gpu][batchnorm][nhwc]") {
  // [rows, C]: layer1 at batch 256 (1024 splits of 784 rows), layer4 at batch
  // 256 (64 splits, 16 channel tiles), an odd row count with 3 channels (no
  // packs), 24 channels (a tile of 3 packs in f16, 6 in f32), 100 (packs in
  // f32 only) and the fewest rows training allows.
  const std::pair<std::int64_t, std::int64_t> shapes[] = {
      {256 * 56 * 56, 64}, {256 * 7 * 7, 2048}, {1000003, 3}, {5001, 24}, {4099, 100}, {2, 7}};
  for (const auto& [rows, channels] : shapes) {
    const BatchNormShape s{rows, channels, 1, 1e-5};
    const Inputs in(rows * channels, channels);
    for (const DType type : {DType::f32, DType::f16, DType::bf16}) {
      const auto x = test::raw_from_f32(in.x, type), id = test::raw_from_f32(in.identity, type);
      const auto dy = test::raw_from_f32(in.dy, type), xe = test::raw_from_f32(in.x_eval, type);
      for (const BatchNormEpilogue epi : kEpilogues) {
        INFO(rows << " x " << channels << " " << dtype_name(type) << " epilogue "
                  << static_cast<int>(epi));
        const CpuRun cpu = run_cpu(s, type, epi, x, id, dy, xe, in.w, in.b);
        // Backward from the CPU's y and statistics, so the ReLU masks are the
        // same elements; eval from the CPU's running statistics.
        const GpuRun gpu = run_gpu(s, type, epi, x, id, dy, xe, in.w, in.b, cpu.y, cpu.mean,
                                   cpu.rstd, cpu.run_mean, cpu.run_var);
        require_twins(gpu, cpu, type, epi == BatchNormEpilogue::add_relu, true);
      }
    }
  }
}

TEST_CASE("cuda channels-last batchnorm gives the same bits on every run",
          "[gpu][batchnorm][nhwc]") {
  const std::int64_t rows = 32 * 28 * 28, channels = 128;
  const BatchNormShape s{rows, channels, 1, 1e-5};
  const Inputs in(rows * channels, channels);
  for (const DType type : {DType::f16, DType::f32}) {
    INFO(dtype_name(type));
    const auto x = test::raw_from_f32(in.x, type), id = test::raw_from_f32(in.identity, type);
    const auto dy = test::raw_from_f32(in.dy, type);
    const CpuRun cpu = run_cpu(s, type, BatchNormEpilogue::add_relu, x, id, dy, x, in.w, in.b);
    GpuRun runs[2];
    for (GpuRun& r : runs)
      r = run_gpu(s, type, BatchNormEpilogue::add_relu, x, id, dy, x, in.w, in.b, cpu.y, cpu.mean,
                  cpu.rstd, cpu.run_mean, cpu.run_var);
    CHECK(runs[0].y == runs[1].y);  // fixed row ranges, lanes and trees; no atomics
    CHECK(runs[0].mean == runs[1].mean);
    CHECK(runs[0].rstd == runs[1].rstd);
    CHECK(runs[0].run_var == runs[1].run_var);
    CHECK(runs[0].dx == runs[1].dx);
    CHECK(runs[0].dw == runs[1].dw);
    CHECK(runs[0].db == runs[1].db);
  }
}

// NCHW [N, C, H, W] through the NCHW kernels against its NHWC transpose
// through the channels-last ones. Eval has the same coefficients on both
// sides, so its y is the same bits; training sums in other orders, so y, the
// statistics and the gradients agree within the twin tolerances. Backward on
// both sides from the NCHW forward's y and statistics.
TEST_CASE("cuda channels-last batchnorm agrees with the NCHW kernels on the transposed data",
          "[gpu][batchnorm][nhwc]") {
  struct Case {
    std::int64_t n, c, h, w;
  };
  for (const Case k : {Case{32, 64, 56, 56}, Case{16, 2048, 7, 7}, Case{3, 5, 7, 3}}) {
    const std::int64_t hw = k.h * k.w, count = k.n * k.c * hw;
    const BatchNormShape planes{k.n, k.c, hw, 1e-5}, rows{k.n * hw, k.c, 1, 1e-5};
    const Inputs in(count, k.c);
    for (const DType type : {DType::f32, DType::f16, DType::bf16})
      for (const BatchNormEpilogue epi : kEpilogues) {
        INFO(k.n << "x" << k.c << "x" << k.h << "x" << k.w << " " << dtype_name(type)
                 << " epilogue " << static_cast<int>(epi));
        const std::size_t e = dtype_size(type);
        const bool add = epi == BatchNormEpilogue::add_relu;
        auto nhwc = [&](const std::vector<char>& v) {
          return transpose_images(v, e, k.n, k.c, hw);
        };
        const auto x = test::raw_from_f32(in.x, type), id = test::raw_from_f32(in.identity, type);
        const auto dy = test::raw_from_f32(in.dy, type), xe = test::raw_from_f32(in.x_eval, type);
        const std::vector<float> run_mean = affine(k.c, -0.2f, 0.05f, 9);
        const std::vector<float> run_var = affine(k.c, 0.5f, 0.25f, 7);
        // The NCHW pass twice: the first gives the y and statistics both
        // backwards start from, the second runs the backward from them.
        GpuRun p = run_gpu(planes, type, epi, x, id, dy, xe, in.w, in.b,
                           std::vector<char>(count * e), std::vector<float>(k.c, 0.0f),
                           std::vector<float>(k.c, 1.0f), run_mean, run_var);
        p = run_gpu(planes, type, epi, x, id, dy, xe, in.w, in.b, p.y, p.mean, p.rstd, run_mean,
                    run_var);
        GpuRun r = run_gpu(rows, type, epi, nhwc(x), nhwc(id), nhwc(dy), nhwc(xe), in.w, in.b,
                           nhwc(p.y), p.mean, p.rstd, run_mean, run_var);
        CHECK(r.y_eval == nhwc(p.y_eval));  // the same coefficients: the same bits
        if (add) CHECK(r.d_id == nhwc(p.d_id));
        GpuRun p_rows = p;  // p's tensors in NHWC order, for the tolerant checks
        p_rows.y = nhwc(p.y);
        p_rows.dx = nhwc(p.dx);
        p_rows.d_id = add ? nhwc(p.d_id) : p.d_id;
        p_rows.y_eval = nhwc(p.y_eval);
        require_twins(r, p_rows, type, add, true);
      }
  }
}
