// Regression with mean squared error on float targets made in memory, trained
// data-parallel through the library's step (engine::Trainer: gradients
// averaged over the ranks during backward, clipping, non-finite skips, the
// schedule, the loss agreed over the global batch). Run it directly or under
// mpirun; it exits 1 when the held-out error shows it did not learn.
#include <fmt/core.h>

#include <cmath>
#include <random>

#include "comm/world.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/trainer.h"
#include "io/tensor_dataset.h"

using namespace lockstep;

// y = sin(3 x0) + x1^2 on [-1, 1]^2; every rank makes the same rows (one seed).
io::TensorDataset make_data(std::int64_t n, unsigned seed, io::TensorDatasetOptions options) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(2 * n), y(n);
  for (std::int64_t i = 0; i < n; ++i) {
    x[2 * i] = uniform(rng), x[2 * i + 1] = uniform(rng);
    y[i] = std::sin(3 * x[2 * i]) + x[2 * i + 1] * x[2 * i + 1];
  }
  return io::TensorDataset(core::Tensor::from_vector(x, {n, 2}, DType::f32),
                           core::Tensor::from_vector(y, {n, 1}, DType::f32), options);
}

int fit(comm::World& world) {
  io::TensorDatasetOptions o{
      .sampler = {.micro_batch = 32, .world_size = world.size(), .rank = world.rank(), .seed = 1},
      .device = world.device()};
  io::TensorDataset train = make_data(4096, 7, o);
  o.sampler.shuffle = o.sampler.drop_last = false;
  io::TensorDataset held_out = make_data(1024, 8, o);

  engine::Sequential model;
  model.emplace<engine::Linear>("fc1", 2, 64);
  model.emplace<engine::ReLU>("act");
  model.emplace<engine::Linear>("fc2", 64, 1);
  engine::initialize(model, 1);
  engine::ParameterStore store(model, world.device());
  engine::AdamW optimizer(store, engine::single_group(store, 0.01, 0.0));
  engine::LossScaler scaler = engine::LossScaler::for_autocast(std::nullopt);
  engine::StepOptions options{.loss = std::make_shared<engine::MSELoss>(), .max_grad_norm = 1.0};
  options.agreement = train.agreement_fields();  // every rank made the same rows
  const int epochs = 12;
  const auto schedule =
      engine::make_scheduler("cosine", {.total_steps = epochs * train.batches_per_epoch()});
  engine::Trainer trainer(model, store, optimizer, schedule, scaler, world, options, {});
  for (int epoch = 0; epoch < epochs; ++epoch) {
    train.start_epoch(epoch);
    while (const auto r = trainer.step(train))
      if (world.rank() == 0 && r->step % 100 == 0)
        fmt::print("step {}: mse {:.5f}\n", r->step, r->loss);
  }
  const double mse = trainer.evaluate(held_out).loss;
  if (world.rank() == 0)
    fmt::print("regression: held-out mse {:.5f} after {} steps\n", mse, trainer.steps());
  return mse < 0.01 ? 0 : 1;  // the targets' variance is about 0.6
}

// An error is printed once, by the rank that had it, and ends every rank.
int main(int argc, char** argv) { return comm::guarded_main("regression", argc, argv, {}, fit); }
