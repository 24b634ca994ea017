// Channels-last convolution on CUDA (Note [channels-last convolution] in
// kernels/cuda/conv.cu) against the CPU (whose NHWC results are its NCHW
// ones transposed, tests/kernels/test_conv_channels_last.cpp) and against
// CUDA's own NCHW path: y with a bias, dx, and dw both written over a NaN
// gradient and accumulated onto a stale one, in f32, f16 and bf16, at
// resnet50's convolution shapes (batch 2, 224 x 224) and at odd ones
// (groups, depthwise, dilation, stride, the 1x1 path, channels that are no
// multiple of 8); in deterministic mode twice, bit for bit; and the NHWC
// bias gradient against the CPU.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "kernels/conv.h"
#include "kernels/layout.h"
#include "support/conv_settings.h"

using namespace lockstep;
using kernels::Conv2dShape;
using kernels::cuda::ConvPass;

namespace {

const core::Device kGpu = core::Device::cuda(0);

Conv2dShape shape(std::int64_t batch, std::int64_t in, std::int64_t h, std::int64_t w,
                  std::int64_t out, std::int64_t kh, std::int64_t kw, std::int64_t sh,
                  std::int64_t sw, std::int64_t ph, std::int64_t pw, std::int64_t dh,
                  std::int64_t dw, std::int64_t groups) {
  Conv2dShape s;
  s.batch = batch, s.in_channels = in, s.in_h = h, s.in_w = w, s.out_channels = out;
  s.kernel_h = kh, s.kernel_w = kw, s.stride_h = sh, s.stride_w = sw, s.pad_h = ph, s.pad_w = pw;
  s.dilation_h = dh, s.dilation_w = dw, s.groups = groups;
  return s;
}

// resnet50's (v1.5) distinct convolutions at batch 2, 224 x 224: the stem,
// each stage's 1x1 reduce and expand, its 3x3 (stride 2 in a stage's first
// block), and the stride-2 1x1 downsamples.
std::vector<Conv2dShape> resnet50_shapes() {
  struct Conv {
    std::int64_t in, out, k, stride, size;
  };
  const Conv convs[] = {
      {3, 64, 7, 2, 224},     {64, 64, 1, 1, 56},    {64, 64, 3, 1, 56},    {64, 256, 1, 1, 56},
      {256, 64, 1, 1, 56},    {256, 128, 1, 1, 56},  {128, 128, 3, 2, 56},  {128, 512, 1, 1, 28},
      {256, 512, 1, 2, 56},   {512, 128, 1, 1, 28},  {128, 128, 3, 1, 28},  {512, 256, 1, 1, 28},
      {256, 256, 3, 2, 28},   {256, 1024, 1, 1, 14}, {512, 1024, 1, 2, 28}, {1024, 256, 1, 1, 14},
      {256, 256, 3, 1, 14},   {1024, 512, 1, 1, 14}, {512, 512, 3, 2, 14},  {512, 2048, 1, 1, 7},
      {1024, 2048, 1, 2, 14}, {2048, 512, 1, 1, 7},  {512, 512, 3, 1, 7}};
  std::vector<Conv2dShape> shapes;
  for (const Conv& c : convs)
    shapes.push_back(shape(2, c.in, c.size, c.size, c.out, c.k, c.k, c.stride, c.stride, c.k / 2,
                           c.k / 2, 1, 1, 1));
  return shapes;
}

// Odd sizes: padding, stride, dilation, groups, a non-square kernel, the
// 1x1 path, depthwise, and channel counts that are no multiple of 8.
const Conv2dShape kOddShapes[] = {shape(2, 3, 5, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1),
                                  shape(2, 3, 5, 7, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1),
                                  shape(1, 2, 7, 5, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1),
                                  shape(2, 4, 5, 7, 6, 3, 2, 2, 1, 1, 0, 1, 1, 2),
                                  shape(3, 6, 6, 5, 3, 2, 3, 1, 2, 0, 2, 2, 1, 3),
                                  shape(2, 5, 3, 4, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1),
                                  shape(2, 16, 9, 11, 32, 3, 3, 1, 1, 1, 1, 1, 1, 16),
                                  shape(3, 24, 13, 9, 40, 3, 3, 2, 2, 1, 1, 1, 1, 1)};

// The operands of one test, on the host in NCHW (x, dy) and KCRS (w).
struct Operands {
  core::Tensor x, w, bias, dy;
};

Operands operands(const Conv2dShape& s, DType type, std::uint32_t seed) {
  const std::int64_t fan_in = s.in_channels / s.groups * s.kernel_h * s.kernel_w;
  auto uniform = [](const core::Shape& shape, std::uint32_t sd, float scale) {
    std::vector<float> v(static_cast<std::size_t>(core::shape_numel(shape)));
    std::uint32_t state = sd * 2654435761u + 12345u;
    for (float& x : v) {  // a small LCG: fast at resnet50's sizes
      state = state * 1664525u + 1013904223u;
      x = scale * (static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
    }
    return core::Tensor::from_vector(v, shape, DType::f32);
  };
  Operands o;
  o.x = uniform({s.batch, s.in_channels, s.in_h, s.in_w}, seed, 1.0f).cast(type);
  o.w = uniform({s.out_channels, s.in_channels / s.groups, s.kernel_h, s.kernel_w}, seed + 1,
                1.0f / std::sqrt(static_cast<float>(fan_in)))
            .cast(type);
  o.bias = uniform({s.out_channels}, seed + 2, 0.5f);
  o.dy = uniform({s.batch, s.out_channels, s.out_h(), s.out_w()}, seed + 3, 1.0f).cast(type);
  return o;
}

// Host NCHW <-> NHWC copies of a [n, c, h, w] / [n, h, w, c] tensor.
core::Tensor to_nhwc(const core::Tensor& t) {
  core::Tensor out = core::Tensor::empty({t.dim(0), t.dim(2), t.dim(3), t.dim(1)}, t.dtype());
  kernels::cpu::nchw_to_nhwc(t.dtype(), t.dim(0), t.dim(1), t.dim(2), t.dim(3), t.data(),
                             out.data());
  return out;
}
core::Tensor to_nchw(const core::Tensor& t) {
  core::Tensor out = core::Tensor::empty({t.dim(0), t.dim(3), t.dim(1), t.dim(2)}, t.dtype());
  kernels::cpu::nhwc_to_nchw(t.dtype(), t.dim(0), t.dim(3), t.dim(1), t.dim(2), t.data(),
                             out.data());
  return out;
}

// Every pass's results on the host, y and dx in NCHW whatever the layout run;
// dw_written: over a NaN gradient without accumulate; dw_added: onto 0.25s.
struct Results {
  core::Tensor y, dx, dw_written, dw_added;
};

Results run_cpu(const Conv2dShape& s, DType type, const Operands& o) {
  const bool nhwc = s.channels_last;
  const core::Tensor x = nhwc ? to_nhwc(o.x) : o.x, dy = nhwc ? to_nhwc(o.dy) : o.dy;
  core::Tensor y = core::Tensor::empty(dy.shape(), type), dx = core::Tensor::empty(x.shape(), type);
  kernels::cpu::conv2d_forward(s, type, x.data(), o.w.data(), o.bias.data_as<float>(), y.data());
  kernels::cpu::conv2d_backward_data(s, type, dy.data(), o.w.data(), dx.data());
  Results r;
  r.y = nhwc ? to_nchw(y) : y;
  r.dx = nhwc ? to_nchw(dx) : dx;
  r.dw_written = core::Tensor::empty(o.w.shape(), DType::f32);
  r.dw_written.fill_(std::numeric_limits<double>::quiet_NaN());
  kernels::cpu::conv2d_backward_filter(s, type, x.data(), dy.data(), r.dw_written.data_as<float>(),
                                       false);
  r.dw_added = core::Tensor::empty(o.w.shape(), DType::f32);
  r.dw_added.fill_(0.25);
  kernels::cpu::conv2d_backward_filter(s, type, x.data(), dy.data(), r.dw_added.data_as<float>(),
                                       true);
  return r;
}

Results run_cuda(const Conv2dShape& s, DType type, const Operands& o) {
  const bool nhwc = s.channels_last;
  const core::Tensor x = (nhwc ? to_nhwc(o.x) : o.x).to(kGpu);
  const core::Tensor dy = (nhwc ? to_nhwc(o.dy) : o.dy).to(kGpu);
  const core::Tensor w = o.w.to(kGpu), bias = o.bias.to(kGpu);
  core::Tensor y = core::Tensor::empty(dy.shape(), type, kGpu);
  core::Tensor dx = core::Tensor::empty(x.shape(), type, kGpu);
  core::Tensor dw_written = core::Tensor::empty(o.w.shape(), DType::f32, kGpu);
  dw_written.fill_(std::numeric_limits<double>::quiet_NaN());
  core::Tensor dw_added = core::Tensor::empty(o.w.shape(), DType::f32, kGpu);
  dw_added.fill_(0.25);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const core::Stream stream = core::Stream::create(kGpu);
  const kernels::CudaStream st = stream.handle();
  auto workspace = [&](ConvPass pass) {
    const std::size_t bytes = kernels::cuda::conv2d_workspace_bytes(s, type, pass, st);
    return std::make_pair(
        core::Tensor::empty({static_cast<std::int64_t>(bytes) + 1}, DType::u8, kGpu), bytes);
  };
  const auto [fwd, fwd_bytes] = workspace(ConvPass::forward);
  const auto [data, data_bytes] = workspace(ConvPass::backward_data);
  const auto [filter, filter_bytes] = workspace(ConvPass::backward_filter);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  kernels::cuda::conv2d_forward(s, type, x.data(), w.data(), bias.data_as<float>(), y.data(),
                                fwd.data(), fwd_bytes, st);
  kernels::cuda::conv2d_backward_data(s, type, dy.data(), w.data(), dx.data(), data.data(),
                                      data_bytes, st);
  kernels::cuda::conv2d_backward_filter(s, type, x.data(), dy.data(), dw_written.data_as<float>(),
                                        false, filter.data(), filter_bytes, st);
  kernels::cuda::conv2d_backward_filter(s, type, x.data(), dy.data(), dw_added.data_as<float>(),
                                        true, filter.data(), filter_bytes, st);
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  Results r;
  r.y = y.to(core::Device::cpu());
  r.dx = dx.to(core::Device::cpu());
  if (nhwc) r.y = to_nchw(r.y), r.dx = to_nchw(r.dx);
  r.dw_written = dw_written.to(core::Device::cpu());
  r.dw_added = dw_added.to(core::Device::cpu());
  return r;
}

// Tolerance, relative to |want| + rms(want): f32 runs with FMA math, but
// cuDNN may pick Winograd or FFT, good to about 1e-4 of the values'
// magnitude; a 16-bit result is rounded once on both sides after sums in a
// different order, so two ulps of the type (f16 2^-10, bf16 2^-7 each), the
// rms term covering results that cancel to near zero.
double tolerance(DType type) {
  switch (type) {
    case DType::f16:
      return std::ldexp(1.0, -9);
    case DType::bf16:
      return std::ldexp(1.0, -6);
    default:
      return 1e-4;
  }
}

void require_close(const core::Tensor& got, const core::Tensor& want, double tol,
                   const std::string& what) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<float> g = got.cast(DType::f32).to_vector<float>();
  const std::vector<float> w = want.cast(DType::f32).to_vector<float>();
  double squares = 0.0;
  for (float v : w) squares += static_cast<double>(v) * v;
  const double rms = std::sqrt(squares / static_cast<double>(w.size() ? w.size() : 1));
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (diff <= tol * (std::fabs(w[i]) + rms)) continue;  // NaN fails here
    if (bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << g.size() << " elements out of tolerance " << tol << " (rms "
            << rms << "); first, element " << first << ": " << g[first] << " against " << w[first]);
  CHECK(bad == 0);
}

void require_same_bits(const core::Tensor& a, const core::Tensor& b, const std::string& what) {
  REQUIRE(a.nbytes() == b.nbytes());
  INFO(what);
  CHECK(std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

std::string describe(const Conv2dShape& s, DType type) {
  return std::string(dtype_name(type)) + " x [" + std::to_string(s.batch) + ", " +
         std::to_string(s.in_channels) + ", " + std::to_string(s.in_h) + ", " +
         std::to_string(s.in_w) + "] -> " + std::to_string(s.out_channels) + " kernel " +
         std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w) + " stride " +
         std::to_string(s.stride_h) + "x" + std::to_string(s.stride_w) + " groups " +
         std::to_string(s.groups);
}

// CUDA NHWC against the CPU and against CUDA NCHW, every pass.
void check_shape(const Conv2dShape& nchw, DType type, std::uint32_t seed) {
  Conv2dShape nhwc = nchw;
  nhwc.channels_last = true;
  const Operands o = operands(nchw, type, seed);
  const std::string what = describe(nchw, type);
  const Results cpu = run_cpu(nhwc, type, o);
  const Results gpu = run_cuda(nhwc, type, o);
  const Results gpu_nchw = run_cuda(nchw, type, o);
  const double tol = tolerance(type);
  for (const auto& [other, against] : {std::make_pair(&cpu, " NHWC cuda vs cpu"),
                                       std::make_pair(&gpu_nchw, " NHWC vs NCHW cuda")}) {
    require_close(gpu.y, other->y, tol, what + against + ": y");
    require_close(gpu.dx, other->dx, tol, what + against + ": dx");
    require_close(gpu.dw_written, other->dw_written, tol, what + against + ": dw written");
    require_close(gpu.dw_added, other->dw_added, tol, what + against + ": dw accumulated");
  }
}

}  // namespace

TEST_CASE("cuda channels-last convolution matches the cpu and cuda NCHW at resnet50's shapes",
          "[gpu][conv][layout][nhwc]") {
  test::ConvSettingsScope settings(false, false);  // the heuristic's choice: 23 shapes untimed
  std::uint32_t seed = 1;
  for (const DType type : {DType::bf16, DType::f16, DType::f32})
    for (const Conv2dShape& s : resnet50_shapes()) check_shape(s, type, seed += 4);
}

TEST_CASE("cuda channels-last convolution matches the cpu and cuda NCHW at odd shapes, timed",
          "[gpu][conv][layout][nhwc]") {
  test::ConvSettingsScope settings(false, true);
  std::uint32_t seed = 100;
  for (const DType type : {DType::f32, DType::f16, DType::bf16})
    for (const Conv2dShape& s : kOddShapes) check_shape(s, type, seed += 4);
  bool described = false;  // the plans say their layout
  for (const std::string& line : kernels::cuda::conv2d_plan_descriptions())
    described = described || line.find("NHWC x [2, 5, 7, 3]") != std::string::npos;
  CHECK(described);
}

TEST_CASE("deterministic cuda channels-last convolution repeats bit for bit",
          "[gpu][conv][layout][nhwc]") {
  test::ConvSettingsScope settings(true, false);
  std::vector<Conv2dShape> shapes(std::begin(kOddShapes), std::end(kOddShapes));
  const std::vector<Conv2dShape> resnet = resnet50_shapes();
  shapes.push_back(resnet[0]);   // the stem
  shapes.push_back(resnet[6]);   // 3x3 stride 2
  shapes.push_back(resnet[21]);  // 2048 -> 512 1x1
  std::uint32_t seed = 200;
  for (const DType type : {DType::bf16, DType::f32})
    for (Conv2dShape s : shapes) {
      s.channels_last = true;
      const Operands o = operands(s, type, seed += 4);
      const std::string what = describe(s, type) + " deterministic";
      const Results first = run_cuda(s, type, o), second = run_cuda(s, type, o);
      require_same_bits(first.y, second.y, what + ": y");
      require_same_bits(first.dx, second.dx, what + ": dx");
      require_same_bits(first.dw_written, second.dw_written, what + ": dw written");
      require_same_bits(first.dw_added, second.dw_added, what + ": dw accumulated");
      const Results cpu = run_cpu(s, type, o);
      require_close(first.y, cpu.y, tolerance(type), what + ": y vs cpu");
      require_close(first.dw_added, cpu.dw_added, tolerance(type), what + ": dw vs cpu");
    }
  bool described = false;
  for (const std::string& line : kernels::cuda::conv2d_plan_descriptions())
    described = described || (line.find("NHWC x [") != std::string::npos &&
                              line.find("(deterministic)") != std::string::npos);
  CHECK(described);
}

// Tolerance: both sum in f64 and round once to f32; the sums differ in f64
// rounding only (Note [column chunks]), so the f32 results differ by at most
// one f32 ulp: 2^-23 relative to the result, plus 2^-23 of the column's
// magnitude sum for results that cancel.
TEST_CASE("cuda NHWC bias gradient matches the cpu", "[gpu][conv][layout][nhwc]") {
  for (const DType type : {DType::f32, DType::bf16}) {
    const std::int64_t batch = 3, spatial = 17 * 19, channels = 70;
    std::vector<float> v(static_cast<std::size_t>(batch * spatial * channels));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>((i * 7919) % 2003) / 1001.0f - 1.0f;
    const core::Tensor dy =
        core::Tensor::from_vector(v, {batch * spatial, channels}, DType::f32).cast(type);
    std::vector<float> db(static_cast<std::size_t>(channels), 0.5f);
    kernels::cpu::channel_bias_grad_nhwc(dy.data(), type, batch, spatial, channels, db.data());
    const core::Tensor dy_dev = dy.to(kGpu);
    const core::Tensor db_dev = core::Tensor::from_vector(std::vector<float>(db.size(), 0.5f),
                                                          {channels}, DType::f32, kGpu);
    const std::size_t bytes =
        kernels::cuda::channel_bias_grad_nhwc_workspace_bytes(batch, spatial, channels);
    const core::Tensor workspace =
        core::Tensor::empty({static_cast<std::int64_t>(bytes) + 1}, DType::u8, kGpu);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const core::Stream stream = core::Stream::create(kGpu);
    kernels::cuda::channel_bias_grad_nhwc(dy_dev.data(), type, batch, spatial, channels,
                                          db_dev.data_as<float>(), workspace.data(),
                                          stream.handle());
    REQUIRE(cudaStreamSynchronize(stream.handle()) == cudaSuccess);
    const std::vector<float> got = db_dev.to_vector<float>();
    const std::vector<float> host = dy.cast(DType::f32).to_vector<float>();
    for (std::int64_t c = 0; c < channels; ++c) {
      double magnitude = 0.5;
      for (std::int64_t r = 0; r < batch * spatial; ++r)
        magnitude += std::fabs(host[static_cast<std::size_t>(r * channels + c)]);
      const auto i = static_cast<std::size_t>(c);
      INFO(dtype_name(type) << " channel " << c << ": cuda " << got[i] << ", cpu " << db[i]);
      CHECK(std::fabs(got[i] - db[i]) <= std::ldexp(1.0, -23) * (std::fabs(db[i]) + magnitude));
    }
  }
}
