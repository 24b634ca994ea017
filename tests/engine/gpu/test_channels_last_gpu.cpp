// Channels-last resnet and resnet50 on a GPU (Note [channels-last layers] in
// engine/nn/channels_last.h): the CUDA NHWC model against the CUDA NCHW model
// and against the CPU (where NHWC and NCHW agree bit for bit:
// tests/engine/test_channels_last.cpp), one forward and backward (logits,
// loss, every parameter gradient, BatchNorm's running statistics) and three
// data-parallel SGD steps (the losses, the parameters after), in f32 and
// under bf16 autocast; at a sixteenth of the widths, and resnet50 at
// its full widths (the channel counts cuDNN's NHWC tensor-core kernels see
// in training) for one pass. A checkpoint of the CUDA NHWC run continues in
// CUDA NCHW and on the CPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "comm/world.h"
#include "engine/checkpoint.h"
#include "engine/data_parallel_step.h"
#include "engine/models.h"
#include "engine/nn/loss.h"
#include "engine/optim/lr_scheduler.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

struct Setup {
  std::string name;
  std::int64_t width_divisor, size, batch;
  int steps;
};

// What one model did, on the host in f32.
struct Outcome {
  std::vector<float> logits;
  double loss = 0.0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads, buffers, values_after;
  std::vector<double> step_losses;
};

std::vector<float> host(const core::Tensor& t, const core::Stream& stream) {
  const core::Tensor f = t.dtype() == DType::f32 ? t : t.cast(DType::f32, stream);
  const core::Tensor h = f.to(core::Device::cpu(), stream);
  stream.synchronize();
  return h.to_vector<float>();
}

Outcome run(const Setup& s, const core::Device& device, bool channels_last,
            std::optional<DType> autocast) {
  core::Stream stream = core::Stream::create(device);
  auto model = make_model(
      s.name, ModelOptions{
                  .width_divisor = s.width_divisor, .classes = 10, .channels_last = channels_last});
  initialize(*model, 7);
  ParameterStore store(*model, device, stream);
  core::Tensor x =
      core::Tensor::empty({s.batch, 3, s.size, s.size}, DType::f32, core::Device::cpu());
  core::Generator(5).normal(x, 0.0f, 1.0f);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(s.batch));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>(i * 3 % 10);
  const core::Tensor y = core::Tensor::from_vector(labels, {s.batch}, DType::i64, device, stream);
  x = x.to(device, stream);

  Outcome out;
  {
    Context ctx;
    ctx.stream = stream;
    ctx.autocast = autocast;
    CrossEntropyLoss loss;
    const core::Tensor logits = model->forward(x, ctx);
    out.logits = host(logits, stream);
    out.loss = host(loss.forward(logits, y, ctx), stream)[0];
    model->backward(loss.backward(1.0f, ctx), ctx);
    model->report_ready(ctx);
    for (Parameter* p : model->parameters()) {
      out.names.push_back(p->name);
      out.grads.push_back(host(p->grad, stream));
    }
    for (Buffer* b : model->buffers())
      if (b->value.dtype() == DType::f32) out.buffers.push_back(host(b->value, stream));
  }
  if (s.steps == 0) return out;
  comm::World& world = test::gpu_world_of_one();  // host() for the cpu's steps
  SGD sgd(store, single_group(store, 0.05, 1e-4), SgdOptions{.momentum = 0.9}, stream);
  LossScaler scaler = LossScaler::for_autocast(autocast);
  StepOptions o;
  o.autocast = autocast;
  DataParallelStep step(*model, store, sgd, make_scheduler("constant", {}), scaler, &world, o,
                        stream);
  const MicroBatch batch{x, y};
  for (int i = 0; i < s.steps; ++i) out.step_losses.push_back(step.run({&batch, 1}).loss);
  for (Parameter* p : model->parameters()) out.values_after.push_back(host(p->value, stream));
  return out;
}

// ||a - b|| / ||b||, the whole tensor's relative error: one element near a
// rounding boundary of the low type does not decide it, a wrong layout does
// (a transposed gradient is off by about sqrt(2)). A gradient of zero would
// have no scale; resnet's are not (no zero_init_residual here).
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// Tolerances, relative L2 over a tensor. f32: cuDNN runs true f32 (FMA math,
// no TF32) with its own summation orders and algorithms (Winograd, implicit
// GEMM) in each layout, and BatchNorm over a batch of 4 to 8 amplifies an
// input's relative error by up to its 1/std; 1e-3 is about a hundred times the
// rounding seen through resnet's 20 layers and holds a wrong layout (error
// ~1) out. bf16: each layer rounds its output to 8 significant bits, the
// layouts' algorithms round at other points, and the CPU keeps BatchNorm's
// output in f32 where CUDA rounds it (Note [batchnorm paths]); the errors
// compound through resnet50's 53 layers: 2^-8 per rounding over ~50
// roundings in sequence gives 0.06, taken as 0.1 (a wrong layout is ~1).
double tolerance(std::optional<DType> autocast) { return autocast ? 0.1 : 1e-3; }

void require_close(const Outcome& got, const Outcome& want, double tol, const std::string& what) {
  INFO(what);
  CHECK(relative_error(got.logits, want.logits) <= tol);
  CHECK(std::fabs(got.loss - want.loss) <= tol * std::fabs(want.loss));
  REQUIRE(got.names == want.names);
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    INFO(want.names[i] << " gradient");
    CHECK(relative_error(got.grads[i], want.grads[i]) <= tol);
  }
  REQUIRE(got.buffers.size() == want.buffers.size());
  for (std::size_t i = 0; i < want.buffers.size(); ++i) {
    INFO("f32 buffer " << i << " (running statistics)");
    CHECK(relative_error(got.buffers[i], want.buffers[i]) <= tol);
  }
  REQUIRE(got.step_losses.size() == want.step_losses.size());
  for (std::size_t i = 0; i < want.step_losses.size(); ++i) {
    INFO("step " << i + 1 << " loss: " << got.step_losses[i] << " against " << want.step_losses[i]);
    CHECK(std::fabs(got.step_losses[i] - want.step_losses[i]) <=
          tol * std::fabs(want.step_losses[i]));
  }
  for (std::size_t i = 0; i < want.values_after.size(); ++i) {
    INFO(want.names[i] << " after the steps");
    CHECK(relative_error(got.values_after[i], want.values_after[i]) <= tol);
  }
}

}  // namespace

TEST_CASE("cuda channels-last resnet and resnet50 train as the cuda NCHW and the cpu models",
          "[gpu][engine][channels_last][nhwc]") {
  const core::Device gpu = test::gpu_world_of_one().device();
  const Setup setups[] = {
      {"resnet", 16, 32, 8, 3},
      {"resnet50", 16, 64, 8, 3},
      // Full widths (64 to 2048 channels, multiples of 8 as NHWC tensor cores
      // want) at a resolution the CPU reference passes in seconds.
      {"resnet50", 1, 96, 4, 0},
  };
  for (const Setup& s : setups)
    for (const std::optional<DType> autocast :
         {std::optional<DType>(), std::optional<DType>(DType::bf16)}) {
      const std::string what = s.name + " width/" + std::to_string(s.width_divisor) + " " +
                               (autocast ? dtype_name(*autocast) : "f32");
      const double tol = tolerance(autocast);
      const Outcome cpu = run(s, core::Device::cpu(), false, autocast);
      const Outcome nchw = run(s, gpu, false, autocast);
      const Outcome nhwc = run(s, gpu, true, autocast);
      require_close(nhwc, nchw, tol, what + ": cuda NHWC against cuda NCHW");
      require_close(nhwc, cpu, tol, what + ": cuda NHWC against the cpu");
    }
}

namespace {

std::unique_ptr<Module> resnet(bool channels_last) {
  auto model = make_model(
      "resnet", ModelOptions{.width_divisor = 16, .classes = 10, .channels_last = channels_last});
  initialize(*model, 7);
  return model;
}

// A resnet of a sixteenth of the widths training on `device`: its store,
// SGD with momentum and the data-parallel step, on one fixed batch.
struct Training {
  Training(const core::Device& device, bool channels_last)
      : stream(core::Stream::create(device)),
        model(resnet(channels_last)),
        store(*model, device, stream),
        sgd(store, single_group(store, 0.05, 1e-4), SgdOptions{.momentum = 0.9}, stream),
        scaler(LossScaler::for_autocast(std::nullopt)),
        step(*model, store, sgd, make_scheduler("constant", {}), scaler, &test::gpu_world_of_one(),
             StepOptions{}, stream) {
    core::Tensor host_x = core::Tensor::empty({8, 3, 32, 32}, DType::f32, core::Device::cpu());
    core::Generator(5).normal(host_x, 0.0f, 1.0f);
    x = host_x.to(device, stream);
    y = core::Tensor::from_vector<std::int64_t>({0, 3, 6, 9, 2, 5, 8, 1}, {8}, DType::i64, device,
                                                stream);
  }
  double run_step() {
    const MicroBatch batch{x, y};
    return step.run({&batch, 1}).loss;
  }
  std::vector<std::vector<float>> values() {
    std::vector<std::vector<float>> out;
    for (Parameter* p : model->parameters()) out.push_back(host(p->value, stream));
    return out;
  }
  core::Stream stream;
  std::unique_ptr<Module> model;
  ParameterStore store;
  SGD sgd;
  LossScaler scaler;
  DataParallelStep step;
  core::Tensor x, y;
};

}  // namespace

TEST_CASE("a checkpoint of a cuda channels-last run continues in cuda NCHW and on the cpu",
          "[gpu][engine][channels_last][nhwc]") {
  // The checkpoint holds PyTorch's layouts whatever the run's: step 3 from it
  // is the channels-last run's own step 3 within f32's tolerance above (the
  // same weights and momentum; one step's summation orders apart).
  const core::Device gpu = test::gpu_world_of_one().device();
  Training nhwc(gpu, true);
  for (int i = 0; i < 2; ++i) nhwc.run_step();
  TrainingState state;
  state.step = 2;
  const CheckpointContents saved = capture_checkpoint(*nhwc.model, nhwc.sgd, state, nhwc.stream);
  Training nchw(gpu, false), cpu(core::Device::cpu(), false);
  for (Training* t : {&nchw, &cpu}) {
    restore_checkpoint(saved, "the channels-last run's", *t->model, t->sgd, {}, {}, t->stream);
    t->step.set_steps(2);
  }
  const double loss = nhwc.run_step();
  const auto want = nhwc.values();
  for (Training* t : {&nchw, &cpu}) {
    INFO((t == &cpu ? "cpu" : "cuda NCHW"));
    CHECK(std::fabs(t->run_step() - loss) <= 1e-3 * std::fabs(loss));
    const auto got = t->values();
    for (std::size_t i = 0; i < want.size(); ++i) {
      INFO("parameter " << i << " after step 3");
      CHECK(relative_error(got[i], want[i]) <= 1e-3);
    }
  }
}
