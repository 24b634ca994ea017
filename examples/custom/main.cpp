// A training program of your own, built against an installed lockstep
// (find_package(lockstep)): its own layer, its own model, its own loop over
// the library's parts. Run it directly or under mpirun; it makes its data.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>

#include "comm/agreement.h"
#include "comm/gradient_synchronizer.h"
#include "comm/step_agreement.h"
#include "comm/world.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/nn/loss.h"
#include "engine/optim/adamw.h"
#include "engine/parameter_store.h"
#include "io/loader.h"
#include "io/shard_writer.h"

using namespace lockstep;

// A layer the library does not have: y = x * sigmoid(x) (SiLU). Implementing
// forward and backward is all it takes; containers do the rest.
class SiLU : public engine::Module {
 public:
  SiLU() : Module("SiLU") {}
  core::Tensor forward(const core::Tensor& x, engine::Context&) override {
    input_ = x.to(core::Device::cpu());
    core::Tensor y = input_.cast(DType::f32);
    for (float& v : std::span(y.data_as<float>(), y.numel())) v = v / (1.0f + std::exp(-v));
    return y.to(x.device());
  }
  core::Tensor backward(const core::Tensor& dy, engine::Context&) override {
    core::Tensor g = dy.to(core::Device::cpu()).cast(DType::f32);
    const float* x = input_.data_as<float>();
    float* d = g.data_as<float>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      const float s = 1.0f / (1.0f + std::exp(-x[i]));
      d[i] *= s * (1.0f + x[i] * (1.0f - s));
    }
    return g.to(dy.device());
  }

 private:
  core::Tensor input_;
};

// Two noisy clusters per class in 2-D: learnable, not linearly separable.
std::filesystem::path make_data(int rank) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("custom-example-" + std::to_string(rank));
  std::filesystem::remove_all(dir);
  const std::int64_t n = 2048;
  io::DatasetWriter writer(dir, {DType::f32, {2}, DType::i64}, n, 2);
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> x(2 * n);
  std::vector<std::int64_t> y(n);
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = i % 2;
    const float sign = (i / 2) % 2 ? 1.0f : -1.0f;  // XOR layout
    x[2 * i] = sign + noise(rng);
    x[2 * i + 1] = (y[i] ? sign : -sign) + noise(rng);
  }
  writer.append(x.data(), y.data(), n);
  writer.close();
  return dir;
}

int main(int argc, char** argv) {
  auto world = comm::init(argc, argv);
  const core::Device device = world->device();

  engine::Sequential model;
  model.emplace<engine::Linear>("fc1", 2, 32);
  model.emplace<SiLU>("act");
  model.emplace<engine::Linear>("fc2", 32, 2);
  model.set_input_grad(false);
  engine::initialize(model, 1);
  engine::ParameterStore store(model, device);
  engine::AdamW optimizer(store, engine::single_group(store, 0.01, 0.0));

  comm::SynchronizedModel shared{store.values(), store.grads(), {}, {}};
  for (const auto& s : store.slots())
    shared.segments.push_back({s.parameter->name, s.offset, s.numel, s.parameter->value.shape()});
  comm::GradientSynchronizer sync(world->for_device(device), shared);

  io::LoaderOptions options;
  options.sampler = {
      .micro_batch = 64, .world_size = world->size(), .rank = world->rank(), .seed = 3};
  options.device = device;
  const io::Dataset data = io::Dataset::open(make_data(world->rank()));
  // Before the first step every rank checks that the others have the same
  // settings and data (each rank wrote its own copy: same names, sizes, rows).
  comm::NamedValues agreed = data.agreement_fields();
  agreed.emplace_back("optimizer", "AdamW lr=0.01");
  comm::check_agreement(world->host(), agreed);
  io::DataLoader loader(data, options);
  engine::CrossEntropyLoss loss;

  std::int64_t step = 0;
  for (int epoch = 0; epoch < 10; ++epoch) {
    loader.start_epoch(epoch);
    double loss_sum = 0;
    std::int64_t samples = 0;
    while (auto batch = loader.next()) {
      store.zero_grad();
      sync.begin_step(step++);
      engine::Context ctx;
      ctx.on_grad_ready = [&](engine::Parameter& p) { sync.mark_ready(store.index_of(p)); };
      const core::Tensor value =
          loss.forward(model.forward(batch->inputs, ctx), batch->labels, ctx);
      model.backward(loss.backward(1.0f, ctx), ctx);
      sync.finish();  // gradients are now averaged over every rank
      optimizer.step();
      loss_sum += value.to_vector<float>()[0] * batch->valid;
      samples += batch->valid;
    }
    const comm::StepTotals totals = comm::agree_on_step(world->host(), loss_sum, samples);
    if (world->rank() == 0) std::printf("epoch %d  loss %.4f\n", epoch, totals.mean_loss());
    if (epoch == 9 && totals.mean_loss() > 0.2) return 1;  // the task is easy: say so if not learnt
  }
  world->shutdown();
  return 0;
}
