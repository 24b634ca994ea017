// How CUDA convolutions choose their algorithms (Note [conv algorithm choice]
// in kernels/cuda/conv.cu): a new shape is timed once outside deterministic
// runs and its plan reused, deterministic runs and set_conv_autotune(false)
// take the heuristic, a plan made while the stream is captured into a CUDA
// graph takes the heuristic and replays; results against the CPU in each case.
// And the 16-bit weight gradient (Note [16-bit weight gradient]) across a
// stale gradient and two accumulating micro-batches, against the CPU, at
// ResNet-18's CIFAR shapes and at odd ones; and that cuDNN still refuses to
// write that gradient in f32 from 16-bit data, the reason for the scratch.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/nn/conv.h"
#include "engine/parameter_store.h"
#include "kernels/conv.h"
#include "support/conv_settings.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);

// The plan cache's lines (kernels::cuda::conv2d_plan_descriptions) naming `text`.
std::vector<std::string> plans_with(const std::string& text) {
  std::vector<std::string> lines;
  for (const std::string& line : kernels::cuda::conv2d_plan_descriptions())
    if (line.find(text) != std::string::npos) lines.push_back(line);
  return lines;
}

bool contains(const std::string& line, const std::string& text) {
  return line.find(text) != std::string::npos;
}

// Today's tolerances of the cuda Conv2d tests (tests/engine/gpu/
// test_spatial_gpu.cpp): summation order and Winograd/FFT transforms, 1e-4 on
// O(1) values in f32; two ulps of the 16-bit type, relative, under autocast.
double tolerance(DType type) {
  switch (type) {
    case DType::f16:
      return 1.0 / 512;
    case DType::bf16:
      return 1.0 / 64;
    default:
      return 1e-4;
  }
}

void require_close(const core::Tensor& gpu, const core::Tensor& cpu, double tol,
                   const std::string& what) {
  REQUIRE(gpu.shape() == cpu.shape());
  const auto g = gpu.cast(DType::f32).to_vector<float>();
  const auto c = cpu.cast(DType::f32).to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::fabs(g[i] - c[i]) <= tol + tol * std::fabs(c[i])) continue;
    INFO(what << " element " << i << ": cuda " << g[i] << ", cpu " << c[i]);
    REQUIRE(std::fabs(g[i] - c[i]) <= tol + tol * std::fabs(c[i]));
  }
}

const std::optional<DType> kAutocasts[] = {std::nullopt, DType::f16, DType::bf16};

// Two training steps of one Conv2d on both devices (the gradient accumulating
// over the second), checking y, dx and the gradients against the CPU, and
// after each step `after_step(step, type)`.
void run_both(const std::function<std::unique_ptr<Conv2d>()>& make, const core::Tensor& x,
              std::optional<DType> autocast, double grad_terms,
              const std::function<void(int, DType)>& after_step) {
  auto cpu = make(), gpu = make();
  initialize(*cpu, 23);
  initialize(*gpu, 23);
  ParameterStore cpu_store(*cpu, core::Device::cpu());
  ParameterStore gpu_store(*gpu, kGpu);
  Context cpu_ctx, gpu_ctx;
  cpu_ctx.autocast = gpu_ctx.autocast = autocast;
  const DType type = autocast.value_or(DType::f32);
  const double tol = tolerance(type);
  for (int step = 0; step < 2; ++step) {
    const core::Tensor y_cpu = cpu->forward(x, cpu_ctx);
    const core::Tensor y_gpu = gpu->forward(x.to(kGpu), gpu_ctx);
    require_close(y_gpu, y_cpu, tol, "y");
    const core::Tensor dy = test::random_f32(y_cpu.shape(), 40 + step).cast(y_cpu.dtype());
    const core::Tensor dx_cpu = cpu->backward(dy, cpu_ctx);
    const core::Tensor dx_gpu = gpu->backward(dy.to(kGpu), gpu_ctx);
    require_close(dx_gpu, dx_cpu, tol, "dx");
    after_step(step, type);
  }
  // As test_spatial_gpu.cpp: order differences grow with the root of the terms.
  require_close(gpu_store.grads(), cpu_store.grads(), 4 * tol * std::sqrt(grad_terms), "gradients");
}

}  // namespace

TEST_CASE("cuda Conv2d times a new shape once and reuses its plan", "[gpu][engine][conv]") {
  test::ConvSettingsScope settings(false, true);
  auto make = [] { return std::make_unique<Conv2d>(24, 40, 3, 1, 1); };
  const core::Tensor x = test::random_f32({6, 24, 17, 15}, 31);
  for (const std::optional<DType>& autocast : kAutocasts) {
    const std::string shape = std::string(dtype_name(autocast.value_or(DType::f32))) +
                              " x [6, 24, 17, 15] w [40, 24, 3, 3]";
    INFO(shape);
    std::vector<std::string> first;
    run_both(make, x, autocast, 6 * 17 * 15, [&](int step, DType) {
      const std::vector<std::string> lines = plans_with(shape);
      std::string all;
      for (const std::string& line : lines) all += line + "\n";
      INFO(all);
      REQUIRE(lines.size() == 3);  // forward, backward data, backward filter
      for (const std::string& line : lines) CHECK(contains(line, ": timed #"));
      if (step == 0) first = lines;
      CHECK(lines == first);  // the same algorithm and time: not timed again
    });
  }
  for (const std::string& line : plans_with("x [6, 24, 17, 15]")) WARN(line);
}

TEST_CASE("cuda Conv2d never times in deterministic mode, nor with timing off",
          "[gpu][engine][conv]") {
  auto make = [] { return std::make_unique<Conv2d>(20, 36, 3, 1, 1); };
  {
    test::ConvSettingsScope settings(true, true);  // deterministic overrules the timing setting
    for (const std::optional<DType>& autocast : kAutocasts)
      run_both(make, test::random_f32({5, 20, 13, 11}, 32), autocast, 5 * 13 * 11,
               [](int, DType type) {
                 const std::vector<std::string> lines =
                     plans_with(std::string(dtype_name(type)) + " x [5, 20, 13, 11]");
                 REQUIRE(lines.size() == 3);
                 for (const std::string& line : lines) {
                   INFO(line);
                   CHECK(contains(line, "(deterministic)"));
                   CHECK_FALSE(contains(line, "timed"));
                 }
               });
  }
  test::ConvSettingsScope settings(false, false);
  run_both(make, test::random_f32({5, 20, 11, 13}, 33), DType::f16, 5 * 11 * 13, [](int, DType) {
    const std::vector<std::string> lines = plans_with("f16 x [5, 20, 11, 13]");
    REQUIRE(lines.size() == 3);
    for (const std::string& line : lines) {
      INFO(line);
      CHECK(contains(line, "(timing off)"));
    }
  });
}

TEST_CASE("a conv2d first planned during graph capture takes the heuristic and replays",
          "[gpu][conv]") {
  test::ConvSettingsScope settings(false, true);
  kernels::Conv2dShape s;
  s.batch = 4, s.in_channels = 12, s.in_h = 19, s.in_w = 13, s.out_channels = 20;
  s.kernel_h = s.kernel_w = 3, s.pad_h = s.pad_w = 1;
  const DType type = DType::f16;
  const core::Tensor x = test::random_f32({4, 12, 19, 13}, 34).cast(type);
  const core::Tensor w = test::random_f32({20, 12, 3, 3}, 35, 0.3f).cast(type);
  core::Tensor y_cpu = core::Tensor::empty({4, 20, 19, 13}, type, core::Device::cpu());
  kernels::cpu::conv2d_forward(s, type, x.data(), w.data(), nullptr, y_cpu.data());

  const core::Tensor x_gpu = x.to(kGpu), w_gpu = w.to(kGpu);
  core::Tensor y_gpu = core::Tensor::empty({4, 20, 19, 13}, type, kGpu);
  const std::size_t workspace_bytes = std::size_t{272} << 20;  // over the 256 MiB cap
  const core::Tensor workspace =
      core::Tensor::empty({static_cast<std::int64_t>(workspace_bytes)}, DType::u8, kGpu);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  // The thread's cuDNN handle is made before the capture (cudnnCreate allocates).
  kernels::cuda::conv2d_workspace_bytes(s, DType::f32, kernels::cuda::ConvPass::forward, stream);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  const std::size_t bytes =
      kernels::cuda::conv2d_workspace_bytes(s, type, kernels::cuda::ConvPass::forward, stream);
  REQUIRE(bytes <= workspace_bytes);
  kernels::cuda::conv2d_forward(s, type, x_gpu.data(), w_gpu.data(), nullptr, y_gpu.data(),
                                workspace.data(), bytes, stream);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  require_close(y_gpu, y_cpu, tolerance(type), "y replayed");

  const std::string shape = "forward f16 x [4, 12, 19, 13]";
  std::vector<std::string> lines = plans_with(shape);
  REQUIRE(lines.size() == 1);
  INFO(lines[0]);
  CHECK(contains(lines[0], "(stream capturing)"));
  // Outside the capture the shape is timed after all, as a plan of its own.
  kernels::cuda::conv2d_workspace_bytes(s, type, kernels::cuda::ConvPass::forward, stream);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaStreamDestroy(stream);
  lines = plans_with(shape);
  REQUIRE(lines.size() == 2);
  CHECK((contains(lines[0], ": timed #") || contains(lines[1], ": timed #")));
}

// Per element: each micro-batch's gradient is an f32 sum of `terms` products
// rounded once to the 16-bit type, on both devices (kernels/conv.h), so they
// differ by the two f32 summations (terms x 2^-24 x S each, S = sum |x||dy|),
// a transform's rounding for Winograd/FFT algorithms (2^-14 S, far above
// f32's), and one rounding to the type landing an ulp apart (2 x half an ulp
// x S); the f32 additions into the gradient add 2^-23 of the total S.
TEST_CASE("cuda Conv2d's 16-bit weight gradient replaces a stale gradient and accumulates",
          "[gpu][engine][conv]") {
  struct Case {
    std::function<std::unique_ptr<Conv2d>()> make;
    core::Shape input;
  };
  const Case cases[] = {
      // ResNet-18 on CIFAR: a basic block's 3x3, a stage's strided 3x3, the 1x1 shortcut.
      {[] { return std::make_unique<Conv2d>(64, 64, 3, 1, 1, 1, 1, false); }, {8, 64, 32, 32}},
      {[] { return std::make_unique<Conv2d>(128, 256, 3, 2, 1, 1, 1, false); }, {8, 128, 16, 16}},
      {[] { return std::make_unique<Conv2d>(64, 128, 1, 2, 0, 1, 1, false); }, {8, 64, 32, 32}},
      // Odd sizes, strided with padding; grouped with a 3x1 kernel.
      {[] { return std::make_unique<Conv2d>(5, 7, 3, 2, 1, 1, 1, false); }, {3, 5, 11, 9}},
      {[] { return std::make_unique<Conv2d>(6, 9, Size2(3, 1), 1, Size2(1, 0), 1, 3, false); },
       {2, 6, 7, 5}},
  };
  for (const Case& c : cases)
    for (const DType type : {DType::f16, DType::bf16}) {
      INFO(dtype_name(type) << " input " << core::shape_str(c.input));
      auto cpu = c.make(), gpu = c.make();
      initialize(*cpu, 29);
      initialize(*gpu, 29);
      ParameterStore cpu_store(*cpu, core::Device::cpu());
      ParameterStore gpu_store(*gpu, kGpu);
      Context cpu_ctx, gpu_ctx;
      cpu_ctx.autocast = gpu_ctx.autocast = type;
      const kernels::Conv2dShape s = [&] {
        kernels::Conv2dShape shape = cpu->config();
        shape.batch = c.input[0], shape.in_h = c.input[2], shape.in_w = c.input[3];
        return shape;
      }();
      const std::int64_t weights =
          s.out_channels * (s.in_channels / s.groups) * s.kernel_h * s.kernel_w;
      const double half_ulp = std::ldexp(1.0, type == DType::f16 ? -11 : -8);
      const double terms = static_cast<double>(s.batch * s.out_h() * s.out_w());
      std::vector<double> bound(static_cast<std::size_t>(weights), 0.0), total(bound);
      // The CPU twin composed by hand: micro-batch 1 written, 2 added.
      std::vector<float> composed(static_cast<std::size_t>(weights));
      // Micro-batch 0 leaves a gradient that zero_grad makes stale (Note
      // [lazy zero_grad]): micro-batch 1 must write over it, 2 add to it.
      for (int micro = 0; micro < 3; ++micro) {
        if (micro == 1) {
          cpu_store.zero_grad();
          gpu_store.zero_grad();
        }
        const core::Tensor x = test::random_f32(c.input, 50 + micro).cast(type);
        const core::Tensor y = cpu->forward(x, cpu_ctx);
        const core::Tensor dy = test::random_f32(y.shape(), 60 + micro).cast(type);
        cpu->backward(dy, cpu_ctx);
        gpu->forward(x.to(kGpu), gpu_ctx);
        gpu->backward(dy.to(kGpu), gpu_ctx);
        if (micro == 0) continue;
        kernels::cpu::conv2d_backward_filter(s, type, x.data(), dy.data(), composed.data(),
                                             micro == 2);
        // S = sum |x||dy| per weight: the CPU's f32 weight gradient of |x| and |dy|.
        const auto magnitude = [](const core::Tensor& t) {
          std::vector<float> v = t.cast(DType::f32).to_vector<float>();
          for (float& e : v) e = std::fabs(e);
          return v;
        };
        const std::vector<float> ax = magnitude(x), ady = magnitude(dy);
        std::vector<float> sums(static_cast<std::size_t>(weights));
        kernels::cpu::conv2d_backward_filter(s, DType::f32, ax.data(), ady.data(), sums.data(),
                                             false);
        for (std::size_t i = 0; i < sums.size(); ++i) {
          bound[i] +=
              sums[i] * (2 * half_ulp + 2 * terms * std::ldexp(1.0, -24) + std::ldexp(1.0, -14));
          total[i] += sums[i];
        }
      }
      const std::vector<float> want = cpu->weight().grad.to_vector<float>();
      const std::vector<float> got = gpu->weight().grad.to_vector<float>();
      CHECK(want == composed);  // the CPU module replaced the stale gradient, bit for bit
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double tol = bound[i] + std::ldexp(total[i], -23);
        if (std::fabs(got[i] - want[i]) <= tol) continue;
        INFO("weight gradient element " << i << ": cuda " << got[i] << ", cpu " << want[i]);
        REQUIRE(std::fabs(got[i] - want[i]) <= tol);
      }
    }
}

// Note [16-bit weight gradient] keeps a scratch and an add kernel because the
// legacy API has no configuration with 16-bit x and dy and an f32 dw. Every
// backward-filter algorithm is tried with such descriptors; if one ever runs,
// the note is out of date: cuDNN could then accumulate with beta = 1 straight
// into the f32 gradient (beta = 0 on a stale one) and the scratch could go.
TEST_CASE("cuDNN refuses an f32 weight gradient from 16-bit x and dy", "[gpu][conv]") {
  for (const cudnnDataType_t data : {CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16}) {
    INFO((data == CUDNN_DATA_HALF ? "f16" : "bf16") << " x and dy, f32 dw");
    cudnnHandle_t handle = nullptr;
    REQUIRE(cudnnCreate(&handle) == CUDNN_STATUS_SUCCESS);
    cudnnTensorDescriptor_t x_desc = nullptr, dy_desc = nullptr;
    cudnnFilterDescriptor_t dw_desc = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    REQUIRE(cudnnCreateTensorDescriptor(&x_desc) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnCreateTensorDescriptor(&dy_desc) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnCreateFilterDescriptor(&dw_desc) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnCreateConvolutionDescriptor(&conv) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetTensor4dDescriptor(x_desc, CUDNN_TENSOR_NCHW, data, 8, 64, 16, 16) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetTensor4dDescriptor(dy_desc, CUDNN_TENSOR_NCHW, data, 8, 64, 16, 16) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetFilter4dDescriptor(dw_desc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 64, 64, 3,
                                       3) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_FLOAT) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetConvolutionMathType(conv, CUDNN_TENSOR_OP_MATH) == CUDNN_STATUS_SUCCESS);
    void *x = nullptr, *dy = nullptr, *dw = nullptr, *workspace = nullptr;
    const std::size_t activations = std::size_t{8} * 64 * 16 * 16 * 2;
    const std::size_t workspace_bytes = std::size_t{256} << 20;
    REQUIRE(cudaMalloc(&x, activations) == cudaSuccess);
    REQUIRE(cudaMalloc(&dy, activations) == cudaSuccess);
    REQUIRE(cudaMalloc(&dw, std::size_t{64} * 64 * 9 * 4) == cudaSuccess);
    REQUIRE(cudaMalloc(&workspace, workspace_bytes) == cudaSuccess);
    REQUIRE(cudaMemset(x, 0, activations) == cudaSuccess);
    REQUIRE(cudaMemset(dy, 0, activations) == cudaSuccess);
    const float one = 1.0f;
    for (int a = 0; a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT; ++a) {
      const auto algo = static_cast<cudnnConvolutionBwdFilterAlgo_t>(a);
      std::size_t needed = 0;
      const cudnnStatus_t sized = cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, x_desc, dy_desc, conv, dw_desc, algo, &needed);
      const cudnnStatus_t ran =
          sized == CUDNN_STATUS_SUCCESS && needed <= workspace_bytes
              ? cudnnConvolutionBackwardFilter(handle, &one, x_desc, x, dy_desc, dy, conv, algo,
                                               workspace, needed, &one, dw_desc, dw)
              : sized;
      INFO("algorithm " << a << ": " << cudnnGetErrorString(ran));
      CHECK(ran != CUDNN_STATUS_SUCCESS);
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    cudaFree(workspace);
    cudaFree(dw);
    cudaFree(dy);
    cudaFree(x);
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(dw_desc);
    cudnnDestroyTensorDescriptor(dy_desc);
    cudnnDestroyTensorDescriptor(x_desc);
    cudnnDestroy(handle);
  }
}
