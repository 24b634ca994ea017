// Conv2d, pooling and BatchNorm2d on CUDA (cuDNN and our kernels) against the
// same layers on the CPU, forward and backward, in f32, f16 and bf16; the
// algorithm settings (deterministic, autotune); f16 overflow; and cnn's stack
// end to end. Two copies of a model are built from one seed; each gets a
// ParameterStore (parameters and buffers) on its device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>

#include "engine/models.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/linear.h"
#include "engine/nn/pooling.h"
#include "engine/parameter_store.h"
#include "kernels/conv.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);

// Tolerances: in f32 the backends differ in summation order (f64 CPU sums,
// cuDNN's blocking) and cuDNN may pick Winograd or FFT algorithms, whose
// transforms add rounding of their own: 1e-4 on O(1) values. Under autocast
// both round the same inputs and accumulate in f32, but a result near a
// rounding boundary can land an ulp of the low type apart, and the bias add
// rounds once more: two ulps, 2^-9 (f16) and 2^-6 (bf16) relative.
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

// A 16-bit result may be one ulp of its type apart whatever its computation's
// tolerance: both tolerances widen to that. `stream` is the one that computed
// `gpu` (the default stream when omitted): the read is queued behind that
// work, then waits for it.
void require_close(const core::Tensor& gpu, const core::Tensor& cpu, double abs_tol, double rel_tol,
                   const std::string& what, const core::Stream& stream = {}) {
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  if (gpu.dtype() != DType::f32) {
    abs_tol = std::max(abs_tol, tolerance(gpu.dtype()));
    rel_tol = std::max(rel_tol, tolerance(gpu.dtype()));
  }
  const auto g = gpu.cast(DType::f32, stream).to_vector<float>(stream);
  const auto c = cpu.cast(DType::f32).to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if ((std::isinf(c[i]) && g[i] == c[i]) || (std::isnan(c[i]) && std::isnan(g[i]))) continue;
    if (std::fabs(g[i] - c[i]) <= abs_tol + rel_tol * std::fabs(c[i]))
      continue;  // a message only for the element that fails
    INFO(what << " element " << i << ": cuda " << g[i] << ", cpu " << c[i]);
    REQUIRE(std::fabs(g[i] - c[i]) <= abs_tol + rel_tol * std::fabs(c[i]));
  }
}

struct Run {
  DType compute = DType::f32;  // the autocast type, or f32
  std::optional<DType> autocast;
  // Terms summed into one weight-gradient element (batch * output positions):
  // summation-order differences grow with its square root.
  double grad_terms = 1;
};

// Forward in training mode and backward on both devices; compares y, dx, the
// flat gradients and the buffers (running statistics).
void compare(const std::function<std::unique_ptr<Module>()>& make, const core::Tensor& x,
             const Run& run) {
  auto cpu_model = make(), gpu_model = make();
  initialize(*cpu_model, 17);
  initialize(*gpu_model, 17);
  ParameterStore cpu_store(*cpu_model, core::Device::cpu());
  ParameterStore gpu_store(*gpu_model, kGpu);
  core::Stream stream = core::Stream::create(kGpu);
  Context cpu_ctx, gpu_ctx;
  cpu_ctx.autocast = gpu_ctx.autocast = run.autocast;
  gpu_ctx.stream = stream;
  const double tol = tolerance(run.compute);
  // Two steps, so that BatchNorm's running statistics move twice.
  for (int step = 0; step < 2; ++step) {
    const core::Tensor y_cpu = cpu_model->forward(x, cpu_ctx);
    const core::Tensor y_gpu = gpu_model->forward(x.to(kGpu, stream), gpu_ctx);
    // BatchNorm2d under autocast keeps the 16-bit type on CUDA and returns f32
    // on the CPU (Note [batchnorm paths]): the CPU's output rounded to it.
    require_close(y_gpu, y_gpu.dtype() == y_cpu.dtype() ? y_cpu : y_cpu.cast(y_gpu.dtype()), tol,
                  tol, cpu_model->describe() + " forward", stream);
    // In the GPU output's type, so that both sides take the same gradient.
    const core::Tensor dy = test::random_f32(y_cpu.shape(), 6 + step).cast(y_gpu.dtype());
    const core::Tensor dx_cpu = cpu_model->backward(dy, cpu_ctx);
    const core::Tensor dx_gpu = gpu_model->backward(dy.to(kGpu, stream), gpu_ctx);
    stream.synchronize();
    require_close(dx_gpu, dx_cpu, tol, tol, "dx");
  }
  if (cpu_store.size() > 0)
    require_close(gpu_store.grads(), cpu_store.grads(), 4 * tol * std::sqrt(run.grad_terms), tol,
                  "flat gradients");
  const auto cpu_buffers = cpu_model->buffers(), gpu_buffers = gpu_model->buffers();
  for (std::size_t i = 0; i < cpu_buffers.size(); ++i)
    require_close(gpu_buffers[i]->value.cast(DType::f32), cpu_buffers[i]->value.cast(DType::f32),
                  1e-6, 1e-5, cpu_buffers[i]->name);
}

// Restores the process-wide algorithm settings when a test ends.
struct ConvSettings {
  ConvSettings(bool deterministic, bool autotune) {
    kernels::set_deterministic(deterministic);
    kernels::set_conv_autotune(autotune);
  }
  ~ConvSettings() {
    kernels::set_deterministic(false);
    kernels::set_conv_autotune(false);
  }
};

const std::optional<DType> kAutocasts[] = {std::nullopt, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("cuda Conv2d matches the cpu in f32, f16 and bf16", "[gpu][engine][conv]") {
  struct Case {
    std::function<std::unique_ptr<Module>()> make;
    core::Shape input;
    double terms;
  };
  const Case cases[] = {
      {[] { return std::make_unique<Conv2d>(3, 8, 3, 1, 1); }, {3, 3, 9, 7}, 3 * 63},
      {[] { return std::make_unique<Conv2d>(4, 6, 3, 2, 1, 1, 2); }, {2, 4, 9, 8}, 2 * 20},
      {[] { return std::make_unique<Conv2d>(5, 4, 3, 1, 2, 2, 1, false); }, {2, 5, 7, 9}, 2 * 63},
      {[] { return std::make_unique<Conv2d>(8, 16, 1, 2); }, {4, 8, 5, 5}, 4 * 9},
  };
  for (const Case& c : cases)
    for (const std::optional<DType>& autocast : kAutocasts) {
      INFO("autocast " << (autocast ? dtype_name(*autocast) : "off") << ", input "
                       << core::shape_str(c.input));
      compare(c.make, test::random_f32(c.input, 5),
              {autocast.value_or(DType::f32), autocast, c.terms});
    }
}

TEST_CASE("cuda Conv2d honours the deterministic and autotune settings", "[gpu][engine][conv]") {
  auto make = [] { return std::make_unique<Conv2d>(16, 32, 3, 1, 1); };
  const core::Tensor x = test::random_f32({8, 16, 12, 12}, 3);
  {
    ConvSettings settings(true, false);
    for (const std::optional<DType>& autocast : kAutocasts)
      compare(make, x, {autocast.value_or(DType::f32), autocast, 8 * 144});
    // Bitwise the same weight gradient twice.
    Conv2d conv(16, 32, 3, 1, 1);
    initialize(conv, 3);
    ParameterStore store(conv, kGpu);
    Context ctx;
    std::vector<float> first;
    for (int i = 0; i < 2; ++i) {
      store.zero_grad();
      const core::Tensor y = conv.forward(x.to(kGpu), ctx);
      conv.backward(test::random_f32(y.shape(), 4).to(kGpu), ctx);
      const auto grads = store.grads().to_vector<float>();
      if (i == 0) first = grads;
      CHECK(grads == first);
    }
  }
  ConvSettings settings(false, true);
  compare(make, x, {DType::f32, std::nullopt, 8 * 144});
  compare(make, x, {DType::f16, DType::f16, 8 * 144});
}

TEST_CASE("cuda Conv2d overflows to inf under f16 like the cpu", "[gpu][engine][conv]") {
  Conv2d conv(1, 1, 1, 1, 0, 1, 1, false);
  conv.weight().value.fill_(300.0);
  ParameterStore store(conv, kGpu);
  Context f16;
  f16.autocast = DType::f16;
  const core::Tensor x300 =
      core::Tensor::from_vector<float>({300.0f}, {1, 1, 1, 1}, DType::f32).to(kGpu);
  const core::Tensor y = conv.forward(x300, f16);
  conv.backward(x300, f16);
  CHECK(std::isinf(y.cast(DType::f32).to_vector<float>()[0]));
  CHECK(std::isinf(store.grads().to_vector<float>()[0]));
}

TEST_CASE("cuda pooling matches the cpu in f32, f16 and bf16", "[gpu][engine][pooling]") {
  const std::function<std::unique_ptr<Module>()> layers[] = {
      [] { return std::make_unique<MaxPool2d>(2); },
      [] { return std::make_unique<MaxPool2d>(3, 2, 1); },
      [] { return std::make_unique<AvgPool2d>(2); },
      [] { return std::make_unique<AvgPool2d>(3, 2, 1); },
      [] {
        return std::make_unique<AvgPool2d>(Size2{3, 2}, Size2{1, 2}, Size2{1, 1}, false);
      },
      [] { return std::make_unique<GlobalAvgPool2d>(); },
  };
  // Pooling keeps its input's dtype, so the 16-bit cases feed 16-bit inputs;
  // both backends read the same bits and select or add in the same order.
  for (const auto& make : layers)
    for (DType type : {DType::f32, DType::f16, DType::bf16}) {
      INFO(dtype_name(type));
      compare(make, test::random_f32({3, 5, 9, 11}, 8).cast(type), {type, std::nullopt, 1});
    }
}

TEST_CASE("cuda BatchNorm2d matches the cpu, running statistics included",
          "[gpu][engine][batchnorm]") {
  for (const std::optional<DType>& autocast : kAutocasts) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    // The input arrives in the autocast type, as from a convolution; the
    // normalisation itself is f32 on both sides.
    const core::Tensor x =
        test::random_f32({6, 5, 7, 3}, 9, 3.0f).cast(autocast.value_or(DType::f32));
    compare([] { return std::make_unique<BatchNorm2d>(5); }, x, {DType::f32, autocast, 6 * 21});
    compare([] { return std::make_unique<BatchNorm2d>(5, 1e-3, 0.3, false, false); }, x,
            {DType::f32, autocast, 6 * 21});
  }
  // Eval: the running statistics moved by two training steps, then inference.
  BatchNorm2d cpu_bn(5), gpu_bn(5);
  ParameterStore cpu_store(cpu_bn, core::Device::cpu()), gpu_store(gpu_bn, kGpu);
  Context ctx;
  for (int step = 0; step < 2; ++step) {
    const core::Tensor x = test::random_f32({4, 5, 3, 3}, 10 + step, 2.0f);
    cpu_bn.forward(x, ctx);
    gpu_bn.forward(x.to(kGpu), ctx);
  }
  cpu_bn.eval();
  gpu_bn.eval();
  const core::Tensor x = test::random_f32({2, 5, 3, 3}, 12);
  require_close(gpu_bn.forward(x.to(kGpu), ctx), cpu_bn.forward(x, ctx), 1e-5, 1e-5, "eval");
  CHECK(gpu_bn.num_batches_tracked()->value.to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{2});
}

TEST_CASE("cuda cnn stack matches the cpu", "[gpu][engine]") {
  auto cpu_model = make_model("cnn"), gpu_model = make_model("cnn");
  initialize(*cpu_model, 17);
  initialize(*gpu_model, 17);
  ParameterStore cpu_store(*cpu_model, core::Device::cpu()), gpu_store(*gpu_model, kGpu);
  Context ctx;
  const core::Tensor x = test::random_f32({8, 1, 28, 28}, 2);
  const core::Tensor y_cpu = cpu_model->forward(x, ctx);
  require_close(gpu_model->forward(x.to(kGpu), ctx), y_cpu, 1e-4, 1e-4, "cnn forward");
  const core::Tensor dy = test::random_f32(y_cpu.shape(), 3);
  cpu_model->backward(dy, ctx);
  gpu_model->backward(dy.to(kGpu), ctx);
  // Only the fully connected layers' gradients: the backends' convolutions
  // differ by ~1e-6, enough to decide a near-tie in max pooling differently
  // (expected about once per run at this size) and route one gradient to
  // another element. The per-layer cases above compare conv and pooling
  // gradients on inputs shared bit for bit.
  const auto cpu_params = cpu_model->parameters(), gpu_params = gpu_model->parameters();
  for (std::size_t i = 0; i < cpu_params.size(); ++i)
    if (cpu_params[i]->name.rfind("fc", 0) == 0)
      require_close(gpu_params[i]->grad, cpu_params[i]->grad, 1e-3, 1e-4, cpu_params[i]->name);
}
