// The fused BatchNorm kernels on CUDA (Note [fused batchnorm] in
// kernels/batchnorm.h) against their CPU twin, in f32, f16 and bf16, with no
// epilogue, a ReLU and an add + ReLU, at resnet50's shapes and odd ones:
// forward (training and eval), statistics, running statistics and backward;
// then the engine's layers on CUDA under autocast (BatchNorm2d with its relu,
// a Bottleneck's fused block end, Note [fused block end]) against the CPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/batchnorm.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/parameter_store.h"
#include "kernels/batchnorm.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using kernels::BatchNormEpilogue;

namespace {

const core::Device kGpu = core::Device::cuda(0);

// One ulp of the type relative to the value: both sides compute in f32 (the
// twin partly in f64) and round once to the type, so a value near a rounding
// boundary may land one ulp apart.
double ulp(DType type) {
  return type == DType::f16 ? 1.0 / 1024 : type == DType::bf16 ? 1.0 / 128 : 0.0;
}

// |gpu - cpu| <= abs + rel |cpu| per element, both read as f32.
void require_close(const core::Tensor& gpu, const core::Tensor& cpu, double abs_tol, double rel_tol,
                   const std::string& what) {
  REQUIRE(gpu.shape() == cpu.shape());
  const auto g = gpu.cast(DType::f32).to_vector<float>();
  const auto c = cpu.cast(DType::f32).to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::fabs(g[i] - c[i]) <= abs_tol + rel_tol * std::fabs(c[i])) continue;
    INFO(what << " element " << i << ": cuda " << g[i] << ", cpu " << c[i]);
    REQUIRE(std::fabs(g[i] - c[i]) <= abs_tol + rel_tol * std::fabs(c[i]));
  }
}

core::Tensor f32_vector(const std::vector<float>& v) {
  return core::Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, DType::f32);
}

// The f32 inputs of one shape, made once for its nine cases.
struct Inputs {
  core::Tensor x_shifted, x, identity, dy;
  explicit Inputs(const core::Shape& shape) {
    // A mean of 1.5 and a spread of 3: the statistics are not those of N(0, 1).
    auto values = test::random_f32(shape, 3, 3.0f).to_vector<float>();
    for (float& v : values) v += 1.5f;
    x_shifted = core::Tensor::from_vector(values, shape, DType::f32);
    x = test::random_f32(shape, 13, 3.0f);  // for eval
    identity = test::random_f32(shape, 4);
    dy = test::random_f32(shape, 5);
  }
};

void compare_kernels(const core::Shape& shape, const Inputs& inputs, DType type,
                     BatchNormEpilogue epi) {
  INFO(core::shape_str(shape) << " " << dtype_name(type) << " epilogue " << static_cast<int>(epi));
  const kernels::BatchNormShape s{shape[0], shape[1], shape[2] * shape[3], 1e-5};
  const std::int64_t c = shape[1];
  const bool add = epi == BatchNormEpilogue::add_relu;
  const core::Tensor x_shifted = inputs.x_shifted.cast(type), x = inputs.x.cast(type);
  const core::Tensor id = inputs.identity.cast(type), dy = inputs.dy.cast(type);
  std::vector<float> w(c), b(c);
  for (std::int64_t i = 0; i < c; ++i) {
    w[i] = 0.5f + 0.01f * static_cast<float>(i % 97);
    b[i] = -0.3f + 0.005f * static_cast<float>(i % 61);
  }
  core::Stream stream = core::Stream::create(kGpu);
  const kernels::CudaStream h = stream.handle();
  core::Tensor workspace =
      core::Tensor::empty({static_cast<std::int64_t>(kernels::batchnorm_fused_workspace_bytes(s))},
                          DType::u8, kGpu, stream);

  // Forward, training: two steps, so the running statistics move twice.
  std::vector<float> mean(c), rstd(c), run_mean(c, 0.0f), run_var(c, 1.0f);
  core::Tensor y = core::Tensor::empty(shape, type);
  const core::Tensor gx = x_shifted.to(kGpu, stream), gid = id.to(kGpu, stream);
  const core::Tensor gw = f32_vector(w).to(kGpu, stream), gb = f32_vector(b).to(kGpu, stream);
  core::Tensor g_mean = core::Tensor::empty({c}, DType::f32, kGpu, stream);
  core::Tensor g_rstd = core::Tensor::empty({c}, DType::f32, kGpu, stream);
  core::Tensor g_run_mean = f32_vector(run_mean).to(kGpu, stream);
  core::Tensor g_run_var = f32_vector(run_var).to(kGpu, stream);
  core::Tensor gy = core::Tensor::empty(shape, type, kGpu, stream);
  for (int step = 0; step < 2; ++step) {
    kernels::cpu::batchnorm_fused_forward_training(
        s, type, epi, x_shifted.data(), add ? id.data() : nullptr, w.data(), b.data(), y.data(),
        mean.data(), rstd.data(), 0.1, run_mean.data(), run_var.data());
    kernels::cuda::batchnorm_fused_forward_training(
        s, type, epi, gx.data(), add ? gid.data() : nullptr, gw.data_as<float>(),
        gb.data_as<float>(), gy.data(), g_mean.data_as<float>(), g_rstd.data_as<float>(), 0.1,
        g_run_mean.data_as<float>(), g_run_var.data_as<float>(), workspace.data(), h);
  }
  stream.synchronize();
  // y: f32 arithmetic on O(10) terms (1e-5), then one rounding to the type.
  require_close(gy, y, 1e-5, ulp(type) + 1e-6, "y");
  // Statistics: f64 sums on both sides (the CUDA side single-pass, shifted by
  // the channel's first value), rounded once to f32.
  require_close(g_mean, f32_vector(mean), 1e-6, 1e-6, "save_mean");
  require_close(g_rstd, f32_vector(rstd), 0, 1e-6, "save_rstd");
  require_close(g_run_mean, f32_vector(run_mean), 1e-6, 1e-6, "running_mean");
  require_close(g_run_var, f32_vector(run_var), 0, 1e-6, "running_var");

  // Backward: both sides from the same x, y, dy and statistics (the CPU's),
  // so the ReLU masks are the same elements.
  const core::Tensor gy_cpu = y.to(kGpu, stream), gdy = dy.to(kGpu, stream);
  const core::Tensor gm = f32_vector(mean).to(kGpu, stream), gr = f32_vector(rstd).to(kGpu, stream);
  core::Tensor dx = core::Tensor::empty(shape, type), d_id = core::Tensor::empty(shape, type);
  core::Tensor gdx = core::Tensor::empty(shape, type, kGpu, stream);
  core::Tensor gd_id = core::Tensor::empty(shape, type, kGpu, stream);
  std::vector<float> dw(c, 0.25f), db(c, -0.5f);  // they accumulate
  core::Tensor gdw = f32_vector(dw).to(kGpu, stream), gdb = f32_vector(db).to(kGpu, stream);
  kernels::cpu::batchnorm_fused_backward(s, type, epi, x_shifted.data(), y.data(), dy.data(),
                                         w.data(), mean.data(), rstd.data(), dx.data(),
                                         add ? d_id.data() : nullptr, dw.data(), db.data());
  kernels::cuda::batchnorm_fused_backward(
      s, type, epi, gx.data(), gy_cpu.data(), gdy.data(), gw.data_as<float>(), gm.data_as<float>(),
      gr.data_as<float>(), gdx.data(), add ? gd_id.data() : nullptr, gdw.data_as<float>(),
      gdb.data_as<float>(), workspace.data(), h);
  stream.synchronize();
  // dx: f32 arithmetic on terms of O(w rstd |dy|) <= 2 (1e-5), one rounding.
  require_close(gdx, dx, 1e-5, ulp(type) + 1e-5, "dx");
  if (add) require_close(gd_id, d_id, 0, 0, "d_identity");  // dy or 0 on both sides: exact
  // The sums: f64 on both sides over the same terms, rounded once to f32.
  require_close(gdw, f32_vector(dw), 1e-5, 1e-6, "dweight");
  require_close(gdb, f32_vector(db), 1e-5, 1e-6, "dbias");

  // Eval: the running statistics the CPU reached.
  kernels::cpu::batchnorm_fused_forward_inference(s, type, epi, x.data(), add ? id.data() : nullptr,
                                                  w.data(), b.data(), run_mean.data(),
                                                  run_var.data(), y.data());
  const core::Tensor grm = f32_vector(run_mean).to(kGpu, stream);
  const core::Tensor grv = f32_vector(run_var).to(kGpu, stream);
  const core::Tensor gx_eval = x.to(kGpu, stream);
  kernels::cuda::batchnorm_fused_forward_inference(
      s, type, epi, gx_eval.data(), add ? gid.data() : nullptr, gw.data_as<float>(),
      gb.data_as<float>(), grm.data_as<float>(), grv.data_as<float>(), gy.data(), workspace.data(),
      h);
  stream.synchronize();
  require_close(gy, y, 1e-5, ulp(type) + 1e-6, "eval y");
}

}  // namespace

TEST_CASE("cuda fused batchnorm matches its cpu twin at resnet50's shapes and odd ones",
          "[gpu][engine][batchnorm]") {
  // layer1's bn3 at batch 32, layer4's (one row split per channel), and an
  // odd shape (C 5, H*W 21: no alignment, several splits per channel).
  const core::Shape shapes[] = {{32, 256, 56, 56}, {32, 2048, 7, 7}, {3, 5, 7, 3}, {37, 3, 5, 1}};
  for (const core::Shape& shape : shapes) {
    const Inputs inputs(shape);
    for (DType type : {DType::f32, DType::f16, DType::bf16})
      for (BatchNormEpilogue epi :
           {BatchNormEpilogue::none, BatchNormEpilogue::relu, BatchNormEpilogue::add_relu})
        compare_kernels(shape, inputs, type, epi);
  }
}

TEST_CASE("cuda fused batchnorm gives the same bits on every run", "[gpu][engine][batchnorm]") {
  const core::Shape shape{8, 64, 32, 32};
  const kernels::BatchNormShape s{8, 64, 1024, 1e-5};
  core::Stream stream = core::Stream::create(kGpu);
  const kernels::CudaStream h = stream.handle();
  const core::Tensor x = test::random_f32(shape, 7, 2.0f).cast(DType::f16).to(kGpu, stream);
  const core::Tensor dy = test::random_f32(shape, 8).cast(DType::f16).to(kGpu, stream);
  core::Tensor w = core::Tensor::empty({64}, DType::f32, kGpu, stream);
  core::Tensor b = core::Tensor::empty({64}, DType::f32, kGpu, stream);
  w.fill_(1.0, stream);
  b.fill_(0.1, stream);
  std::vector<std::vector<float>> results;
  for (int run = 0; run < 2; ++run) {
    core::Tensor ws = core::Tensor::empty(
        {static_cast<std::int64_t>(kernels::batchnorm_fused_workspace_bytes(s))}, DType::u8, kGpu,
        stream);
    core::Tensor mean = core::Tensor::empty({64}, DType::f32, kGpu, stream);
    core::Tensor rstd = core::Tensor::empty({64}, DType::f32, kGpu, stream);
    core::Tensor y = core::Tensor::empty(shape, DType::f16, kGpu, stream);
    core::Tensor dx = core::Tensor::empty(shape, DType::f16, kGpu, stream);
    core::Tensor dw = core::Tensor::zeros({64}, DType::f32, kGpu, stream);
    core::Tensor db = core::Tensor::zeros({64}, DType::f32, kGpu, stream);
    kernels::cuda::batchnorm_fused_forward_training(
        s, DType::f16, BatchNormEpilogue::relu, x.data(), nullptr, w.data_as<float>(),
        b.data_as<float>(), y.data(), mean.data_as<float>(), rstd.data_as<float>(), 0.1, nullptr,
        nullptr, ws.data(), h);
    kernels::cuda::batchnorm_fused_backward(
        s, DType::f16, BatchNormEpilogue::relu, x.data(), y.data(), dy.data(), w.data_as<float>(),
        mean.data_as<float>(), rstd.data_as<float>(), dx.data(), nullptr, dw.data_as<float>(),
        db.data_as<float>(), ws.data(), h);
    stream.synchronize();
    std::vector<float> all = dx.cast(DType::f32).to_vector<float>();
    for (const core::Tensor* t : {&y, &mean, &rstd, &dw, &db}) {
      const auto v = t->cast(DType::f32).to_vector<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    results.push_back(all);
  }
  CHECK(results[0] == results[1]);  // fixed row ranges and trees, no atomics
}

namespace {

// A Bottleneck as engine/models.cpp builds it: conv-bn(relu) twice, conv-bn,
// a downsample shortcut, the add and the relu.
std::unique_ptr<Module> bottleneck(std::int64_t in, std::int64_t width) {
  auto inner = std::make_unique<Sequential>();
  inner->emplace<Conv2d>("conv1", in, width, 1, 1, 0, 1, 1, false);
  inner->emplace<BatchNorm2d>("bn1", width, 1e-5, 0.1, true, true, BatchNormActivation::relu);
  inner->emplace<Conv2d>("conv2", width, width, 3, 1, 1, 1, 1, false);
  inner->emplace<BatchNorm2d>("bn2", width, 1e-5, 0.1, true, true, BatchNormActivation::relu);
  inner->emplace<Conv2d>("conv3", width, 4 * width, 1, 1, 0, 1, 1, false);
  inner->emplace<BatchNorm2d>("bn3", 4 * width);
  auto shortcut = std::make_unique<Sequential>();
  shortcut->emplace<Conv2d>("0", in, 4 * width, 1, 1, 0, 1, 1, false);
  shortcut->emplace<BatchNorm2d>("1", 4 * width);
  auto block =
      std::make_unique<Residual>(std::move(inner), std::move(shortcut), "downsample", true);
  block->assign_names();
  block->set_input_grad(true);
  return block;
}

}  // namespace

TEST_CASE("a cuda Bottleneck under autocast runs its block end fused and follows the cpu",
          "[gpu][engine][batchnorm]") {
  for (DType type : {DType::f16, DType::bf16}) {
    INFO(dtype_name(type));
    auto cpu_block = bottleneck(16, 8), gpu_block = bottleneck(16, 8);
    initialize(*cpu_block, 5);
    initialize(*gpu_block, 5);
    ParameterStore cpu_store(*cpu_block, core::Device::cpu()), gpu_store(*gpu_block, kGpu);
    Context cpu_ctx, gpu_ctx;
    cpu_ctx.autocast = gpu_ctx.autocast = type;
    const core::Tensor x = test::random_f32({4, 16, 9, 7}, 11).cast(type);
    const core::Tensor y_cpu = cpu_block->forward(x, cpu_ctx);
    const core::Tensor y_gpu = gpu_block->forward(x.to(kGpu), gpu_ctx);
    // On CUDA the block's output keeps the autocast type (no f32 round trip).
    CHECK(y_gpu.dtype() == type);
    // Three convolutions and three normalisations, each input one ulp of the
    // type apart at most, on O(1) values: 8 ulps.
    const double tol = 8 * ulp(type);
    require_close(y_gpu, y_cpu, tol, tol, "block output");
    const core::Tensor dy = test::random_f32(y_cpu.shape(), 12).cast(type);
    const core::Tensor dx_cpu = cpu_block->backward(dy, cpu_ctx);
    const core::Tensor dx_gpu = gpu_block->backward(dy.to(kGpu), gpu_ctx);
    CHECK(dx_gpu.dtype() == type);
    require_close(dx_gpu, dx_cpu, tol, tol, "dx");
    // Gradients sum 4 * 63 terms per weight: the per-term error grows with
    // the square root of their count.
    require_close(gpu_store.grads(), cpu_store.grads(), tol * std::sqrt(4.0 * 63), tol,
                  "flat gradients");
    const auto cpu_buffers = cpu_block->buffers(), gpu_buffers = gpu_block->buffers();
    for (std::size_t i = 0; i < cpu_buffers.size(); ++i)
      require_close(gpu_buffers[i]->value.cast(DType::f32), cpu_buffers[i]->value.cast(DType::f32),
                    tol, tol, cpu_buffers[i]->name);
  }
}
