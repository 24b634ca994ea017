// A training program of your own, built against an installed lockstep
// (find_package(lockstep)): its own layer on the device-generic ops, its own
// model, data it makes in memory, AdamW through the library's data-parallel
// step (engine::Trainer), and checkpoints it resumes from bit for bit
// (engine::RunCheckpoints). Run it directly or under mpirun; run it again
// with the same directory and it continues. Usage: custom [CHECKPOINT_DIR]
#include <fmt/core.h>

#include <random>

#include "comm/world.h"
#include "engine/core/tensor_ops.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/run_checkpoints.h"
#include "engine/trainer.h"
#include "io/tensor_dataset.h"

using namespace lockstep;
namespace ops = lockstep::core::ops;

// A layer the library does not have: y = x * sigmoid(x) (SiLU). Forward and
// backward on the ops of engine/core/tensor_ops.h run on the CPU or a GPU,
// queued on the step's stream; containers do the rest.
class SiLU : public engine::Module {
  core::Tensor input_;  // forward's, for backward

 public:
  SiLU() : Module("SiLU") {}
  core::Tensor forward(const core::Tensor& x, engine::Context& ctx) override {
    input_ = x;
    return ops::mul(x, ops::sigmoid(x, ctx.stream), ctx.stream);
  }
  core::Tensor backward(const core::Tensor& dy, engine::Context& ctx) override {
    const core::Stream& s = ctx.stream;
    const core::Tensor sig = ops::sigmoid(input_, s);  // dx = dy s (1 + x (1 - s))
    const core::Tensor slope = ops::add(1.0, ops::mul(input_, ops::sub(1.0, sig, s), s), s);
    return ops::mul(ops::mul(dy, sig, s), slope, s);
  }
};

// Two noisy clusters per class in 2-D (an XOR layout): learnable, not
// linearly separable. Every rank makes the same rows (the same seed).
io::TensorDataset make_data(const io::TensorDatasetOptions& options) {
  const std::int64_t n = 2048;
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> x(2 * n);
  std::vector<std::int64_t> y(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const float sign = (i / 2) % 2 ? 1.0f : -1.0f;
    y[i] = i % 2, x[2 * i] = sign + noise(rng), x[2 * i + 1] = (y[i] ? sign : -sign) + noise(rng);
  }
  return io::TensorDataset(core::Tensor::from_vector(x, {n, 2}, DType::f32),
                           core::Tensor::from_vector(y, {n}, DType::i64), options);
}

int train(comm::World& world, const std::string& checkpoint_dir) {
  constexpr int kEpochs = 10;
  engine::Sequential model;
  model.emplace<engine::Linear>("fc1", 2, 32);
  model.emplace<SiLU>("act");
  model.emplace<engine::Linear>("fc2", 32, 2);
  engine::initialize(model, 1);
  engine::ParameterStore store(model, world.device());
  engine::AdamW optimizer(store, engine::single_group(store, 0.01, 0.0));
  io::TensorDataset data = make_data(
      {.sampler = {.micro_batch = 64, .world_size = world.size(), .rank = world.rank(), .seed = 3},
       .device = world.device()});
  // The newest good checkpoint of the directory, if any (rank 0 holds its
  // lock). A resume may not change the model, the loss, the precision, the
  // global batch or the data's order (RunCheckpoints records them itself);
  // `config` adds what only this program knows.
  engine::RunCheckpoints checkpoints(
      world, {.directory = checkpoint_dir, .config = {{"run", "fc1 SiLU fc2, AdamW lr=0.01"}}});
  // Every rank checks that the others have the same settings, data and checkpoint.
  engine::StepOptions options{.agreement = data.agreement_fields()};
  options.agreement.push_back(checkpoints.agreement_field());
  engine::LossScaler scaler = engine::LossScaler::for_autocast(std::nullopt);
  engine::Trainer trainer(model, store, optimizer, engine::make_scheduler("constant", {}), scaler,
                          world, options, {});
  engine::DataParallelStep& step = trainer.data_parallel_step();
  const auto start = checkpoints.restore(model, optimizer, step, scaler, data, {});
  double last_loss = 0;
  for (std::int64_t epoch = start.data.epoch; epoch < kEpochs; ++epoch) {
    data.start_epoch(epoch, epoch == start.data.epoch ? start.data.position : 0);
    while (const auto r = trainer.step(data)) last_loss = r->loss;  // over every rank's rows
    if (world.rank() == 0) fmt::print("epoch {}: loss {:.4f}\n", epoch + 1, last_loss);
    checkpoints.save(model, optimizer, step, scaler, data, {});  // rank 0 writes ckpt-<step>.h5
  }
  if (world.rank() == 0) fmt::print("custom: done at step {}\n", trainer.steps());
  return start.step < trainer.steps() && last_loss > 0.2 ? 1 : 0;  // easy: say so if not learnt
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "";  // none: no checkpoints
  return comm::guarded_main("custom", argc, argv, {},
                            [&](comm::World& w) { return train(w, dir); });
}
