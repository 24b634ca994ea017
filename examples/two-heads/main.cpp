// A model with a shared trunk and two heads (class logits and a regression
// value), trained on cross-entropy plus MSE under bf16 autocast through the
// library's step (engine::Trainer), data made in memory. The batch carries
// the value target by name beside the class targets; the model returns two
// named outputs (Module::forward_named). Run it directly or under mpirun; it
// exits 1 unless the held-out loss and accuracy show it learnt both tasks.
#include <fmt/core.h>

#include <cmath>
#include <random>

#include "comm/world.h"
#include "engine/core/tensor_ops.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/trainer.h"
#include "io/tensor_dataset.h"

using namespace lockstep;

class TwoHeads : public engine::Module {
  engine::Module *trunk_, *classes_, *value_;

 public:
  TwoHeads() : Module("TwoHeads") {
    auto trunk = std::make_unique<engine::Sequential>();
    trunk->emplace<engine::Linear>("fc1", 2, 64);
    trunk->emplace<engine::ReLU>("act");
    trunk->set_input_grad(false);
    trunk_ = &add_child("trunk", std::move(trunk));
    classes_ = &add_child("classes", std::make_unique<engine::Linear>(64, 4));
    value_ = &add_child("value", std::make_unique<engine::Linear>(64, 1));
  }
  core::NamedTensors forward_named(const core::NamedTensors& in, engine::Context& ctx) override {
    const core::Tensor h = trunk_->forward(in.at("inputs", describe()), ctx);
    return {{"logits", classes_->forward(h, ctx)}, {"value", value_->forward(h, ctx)}};
  }
  // Children backward in ready order (last registered first), each reported
  // ready after its backward, so the gradient sync overlaps as in a chain.
  core::NamedTensors backward_named(const core::NamedTensors& d, engine::Context& ctx) override {
    const core::Tensor dv = value_->backward(d.at("value", describe()), ctx);
    value_->report_ready(ctx);
    const core::Tensor dc = classes_->backward(d.at("logits", describe()), ctx);
    classes_->report_ready(ctx);
    trunk_->backward(core::ops::add(dv, dc, ctx.stream), ctx);
    trunk_->report_ready(ctx);
    return {};
  }
};

// Class: the quadrant of x; value: sin(3 x0) + x1^2. Every rank makes the same rows.
io::TensorDataset make_data(std::int64_t n, unsigned seed, io::TensorDatasetOptions options) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(2 * n), value(n);
  std::vector<std::int64_t> label(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = x[2 * i] = uniform(rng), b = x[2 * i + 1] = uniform(rng);
    label[i] = (a > 0) + 2 * (b > 0), value[i] = std::sin(3 * a) + b * b;
  }
  return io::TensorDataset(core::Tensor::from_vector(x, {n, 2}, DType::f32),
                           core::Tensor::from_vector(label, {n}, DType::i64),
                           {{"value", core::Tensor::from_vector(value, {n, 1}, DType::f32)}},
                           options);
}

int fit(comm::World& world) {
  io::TensorDatasetOptions o{
      .sampler = {.micro_batch = 32, .world_size = world.size(), .rank = world.rank(), .seed = 1},
      .device = world.device()};
  io::TensorDataset train = make_data(4096, 7, o);
  o.sampler.shuffle = o.sampler.drop_last = false;
  io::TensorDataset held_out = make_data(1024, 8, o);

  TwoHeads model;
  engine::initialize(model, 1);
  engine::ParameterStore store(model, world.device());
  engine::AdamW optimizer(store, engine::single_group(store, 0.01, 0.0));
  engine::LossScaler scaler = engine::LossScaler::for_autocast(DType::bf16);
  auto loss = std::make_shared<engine::WeightedLosses>(std::vector<engine::WeightedLosses::Term>{
      {std::make_shared<engine::CrossEntropyLoss>(), "logits", "targets", 1.0f},
      {std::make_shared<engine::MSELoss>(), "value", "value", 1.0f}});
  engine::StepOptions options{.loss = loss, .autocast = DType::bf16, .max_grad_norm = 1.0};
  options.agreement = train.agreement_fields();  // every rank made the same rows
  const int epochs = 12;
  const auto schedule =
      engine::make_scheduler("cosine", {.total_steps = epochs * train.batches_per_epoch()});
  engine::Trainer trainer(model, store, optimizer, schedule, scaler, world, options, {});
  for (int epoch = 0; epoch < epochs; ++epoch) {
    train.start_epoch(epoch);
    while (trainer.step(train)) continue;
  }
  const engine::EvalResult e = trainer.evaluate(held_out);
  if (world.rank() == 0)
    fmt::print("two-heads: held-out loss {:.4f} (cross-entropy + mse), accuracy {:.3f}\n", e.loss,
               *e.accuracy);
  // Both terms are at least 0, so the sum bounds the mse (the values' variance is about 0.6).
  return e.loss < 0.15 && *e.accuracy > 0.97 ? 0 : 1;
}

int main(int argc, char** argv) { return comm::guarded_main("two-heads", argc, argv, {}, fit); }
