// Every model preset (engine/models.h, at a sixteenth of its width: the same
// tree of layers) and a user's own Sequential, trained under ZeRO-1, 2 and 3
// and, where the model has blocks to checkpoint, with activation
// checkpointing: after a few steps the parameters are plain data
// parallelism's bit for bit, on 1 and 2 ranks (a sum of two gradients is the
// same whichever rank adds it). A combination a model does not support is
// refused with a message naming the model and why: activation checkpointing
// of a model without blocks, ZeRO-3 of a model with no unit to gather.
// Hidden from the binary's default run (which includes 3 ranks, where sums
// may round differently): ctest runs these cases as mpi_zero_presets_1_ranks
// and mpi_zero_presets_2_ranks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/core/ops.h"
#include "engine/core/tensor_ops.h"
#include "engine/data_parallel_step.h"
#include "engine/models.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/checkpointed.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "mpi/mpi_world.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr int kSteps = 2;                   // the second step reads the first's update
constexpr std::int64_t kRows = 2;           // a rank's micro-batch
constexpr std::int64_t kTokens = 8;         // a GPT row: shorter than any preset's context
constexpr std::int64_t kWidthDivisor = 16;  // make_model's: a step of any preset in ms

// A layer of the user's own with a parameter: y = x * scale, scale [F], on
// [B, F] inputs, written on the device-generic ops. Its backward adds into
// the gradient after grad_to_add, which under ZeRO-2 and 3 gives the
// gradient its storage (Note [lazy zero_grad], engine/nn/module.h).
class FeatureScale : public Module {
 public:
  explicit FeatureScale(std::int64_t features) : Module("FeatureScale") {
    scale_ = &add_parameter("scale", {features}, ParamRole::weight);
  }
  void reset_parameters(core::Generator& rng) override { init_uniform(scale_->value, rng, 1.0f); }
  core::Tensor forward(const core::Tensor& x, Context& ctx) override {
    input_ = x;
    return core::ops::mul(x, scale_->value, ctx.stream);
  }
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override {
    grad_to_add(*scale_, ctx.stream);
    const core::Tensor dscale =
        core::ops::sum(core::ops::mul(dy, input_, ctx.stream), 0, false, ctx.stream);
    core::ops::add(scale_->grad, dscale, scale_->grad, ctx.stream);
    return core::ops::mul(dy, scale_->value, ctx.stream);
  }

 private:
  Parameter* scale_;
  core::Tensor input_;
};

// A user's own Sequential of 1 x 8 x 8 images and 5 classes, with what the
// presets lack: a first Conv2d of its own, a Residual child, BatchNorm, the
// layer above, a frozen Linear (a unit with nothing to gather) and, with
// `checkpointing`, a Checkpointed block of two layers.
std::unique_ptr<Module> users_model(bool checkpointing) {
  auto net = std::make_unique<Sequential>();
  net->emplace<Conv2d>("conv", 1, 4, 3, 2, 1);  // [B, 4, 4, 4]
  net->emplace<BatchNorm2d>("bn", 4);
  net->emplace<ReLU>("relu");
  auto inner = std::make_unique<Sequential>();
  inner->emplace<Conv2d>("conv1", 4, 4, 3, 1, 1);
  inner->emplace<ReLU>("relu");
  net->add("res", std::make_unique<Residual>(std::move(inner), nullptr));
  net->emplace<Flatten>("flatten");
  net->emplace<FeatureScale>("scale", 64);
  Linear& frozen = net->emplace<Linear>("frozen", 64, 16);
  frozen.weight().requires_grad = false;
  frozen.bias()->requires_grad = false;
  auto block = std::make_unique<Sequential>();
  block->emplace<Linear>("fc", 16, 16);
  block->emplace<GELU>("gelu", true);
  if (checkpointing)
    net->add("block", std::make_unique<Checkpointed>(std::move(block)));
  else
    net->add("block", std::move(block));
  net->emplace<Linear>("head", 16, 5);
  net->assign_names();
  net->set_input_grad(false);
  return net;
}

struct ModelCase {
  std::string name;
  std::function<std::unique_ptr<Module>(bool checkpointing)> build;
  core::Shape sample_shape;  // {T} tokens for a language model
  std::int64_t classes;
  bool language_model;
};

// Rank `rank`'s micro-batch of step `step`: normal inputs (tokens for a
// language model) and class targets, from a seed of its own.
MicroBatch micro_batch(const ModelCase& m, int step, int rank) {
  std::mt19937 rng(static_cast<unsigned>(1000 * step + rank + 1));
  std::uniform_int_distribution<std::int64_t> label(0, m.classes - 1);
  const std::int64_t targets_per_row = m.language_model ? kTokens : 1;
  std::vector<std::int64_t> targets(kRows * targets_per_row);
  for (std::int64_t& t : targets) t = label(rng);
  const core::Shape target_shape =
      m.language_model ? core::Shape{kRows, kTokens} : core::Shape{kRows};
  if (m.language_model) {
    std::vector<std::int64_t> tokens(kRows * kTokens);
    for (std::int64_t& t : tokens) t = label(rng);
    return {core::Tensor::from_vector(tokens, {kRows, kTokens}, DType::i64),
            core::Tensor::from_vector(targets, target_shape, DType::i64)};
  }
  core::Shape shape{kRows};
  shape.insert(shape.end(), m.sample_shape.begin(), m.sample_shape.end());
  std::normal_distribution<float> normal;
  std::vector<float> inputs(static_cast<std::size_t>(core::shape_numel(shape)));
  for (float& v : inputs) v = normal(rng);
  return {core::Tensor::from_vector(inputs, shape, DType::f32),
          core::Tensor::from_vector(targets, target_shape, DType::i64)};
}

struct Trained {
  std::vector<float> initial, final;  // every trainable value, slot after slot in ready order
};

std::vector<float> trainable_values(const ParameterStore& store) {
  std::vector<float> out;
  for (const ParameterStore::Slot& s : store.slots()) {
    const std::vector<float> v = s.parameter->value.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// kSteps of AdamW in ZeRO stage `zero` (0: plain data parallelism) over the
// test's world, as lockstep-train builds them (Note [parameter units]).
Trained train(const ModelCase& m, bool checkpointing, int zero) {
  comm::World& world = test::mpi_world();
  std::unique_ptr<Module> model = m.build(checkpointing);
  initialize(*model, 7);
  ParameterStore store(
      *model, core::Device::cpu(), {},
      zero >= 2 ? ParameterStore::Gradients::groups : ParameterStore::Gradients::flat,
      zero == 3 ? ParameterUnits{default_units(*model), world.size()} : ParameterUnits{});
  Trained t;
  t.initial = trainable_values(store);
  AdamW optimizer(store, decay_groups(store, 1e-2, 0.1));
  LossScaler scaler(LossScalerOptions{.enabled = false});
  StepOptions o;
  o.seed = 9;
  o.sync.zero_stage = zero;
  // About eight buckets a model, so that ZeRO-2's gradient groups cut it in
  // several places, as 25 MiB buckets cut a preset at full width.
  const auto bytes = static_cast<std::size_t>(store.size()) * 4;
  o.sync.bucket_cap_bytes = o.sync.first_bucket_cap_bytes =
      std::max<std::size_t>(256, bytes / 8 / 256 * 256);
  ScheduleOptions schedule;
  schedule.total_steps = kSteps;
  DataParallelStep step(*model, store, optimizer, make_scheduler("constant", schedule), scaler,
                        &world, o, core::Stream());
  for (int s = 0; s < kSteps; ++s) {
    const MicroBatch batch = micro_batch(m, s, world.rank());
    step.run({&batch, 1});
  }
  const auto full = step.full_parameters();  // ZeRO-3 keeps only shards between steps
  t.final = trainable_values(store);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Each stage, with and without checkpointing, against plain data
// parallelism without it (checkpointing recomputes the same bits, Note
// [activation checkpointing]); a checkpointing refusal is returned, for the
// caller to check, as the model's name.
std::optional<std::string> check_every_stage(const ModelCase& m) {
  const Trained plain = train(m, false, 0);
  REQUIRE_FALSE(same_bits(plain.final, plain.initial));  // the steps did move the parameters
  std::optional<std::string> refused;
  for (bool checkpointing : {false, true}) {
    if (checkpointing) {
      try {
        m.build(true);
      } catch (const InvalidArgument& e) {
        INFO(e.what());
        CHECK_THAT(e.what(),
                   Catch::Contains("model '" + m.name + "' has no blocks to checkpoint") &&
                       Catch::Contains("train it without activation checkpointing"));
        refused = m.name;
        continue;
      }
    }
    for (int zero = checkpointing ? 0 : 1; zero <= 3; ++zero) {
      INFO(m.name << ", ZeRO-" << zero << (checkpointing ? ", activation checkpointing" : "")
                  << ", " << test::mpi_world().size() << " ranks");
      CHECK(same_bits(train(m, checkpointing, zero).final, plain.final));
    }
  }
  return refused;
}

// The bits are claimed on 1 and 2 ranks; on 3, MPI may add three partial
// gradients in different orders (Note [3-rank tolerance], test_zero.cpp).
void require_one_or_two_ranks() {
  const int ranks = test::mpi_world().size();
  INFO("run on 1 or 2 ranks (mpi_zero_presets_1_ranks, _2_ranks), not " << ranks);
  REQUIRE(ranks <= 2);
}

}  // namespace

TEST_CASE("every preset trains under ZeRO-1, 2 and 3 to plain data parallelism's bits",
          "[mpi][.presets]") {
  require_one_or_two_ranks();
  std::set<std::string> refused;
  for (const ModelPreset& preset : model_presets()) {
    const ModelCase m{preset.name,
                      [name = preset.name](bool checkpointing) {
                        return make_model(name,
                                          ModelOptions{.activation_checkpointing = checkpointing,
                                                       .width_divisor = kWidthDivisor});
                      },
                      preset.sample_shape, preset.classes, preset.language_model};
    if (const auto name = check_every_stage(m)) refused.insert(*name);
  }
  // The presets without blocks, and only they, refuse activation checkpointing.
  CHECK(refused == std::set<std::string>{"cnn", "mlp", "mlp-large"});
}

TEST_CASE("a user's own Sequential trains under ZeRO-1, 2 and 3 to plain data parallelism's bits",
          "[mpi][.presets]") {
  require_one_or_two_ranks();
  const ModelCase m{"user's", users_model, {1, 8, 8}, 5, false};
  CHECK_FALSE(check_every_stage(m));
}

TEST_CASE(
    "a model without a Sequential trains under ZeRO-1 and 2 and ZeRO-3 refuses it, saying why",
    "[mpi][.presets]") {
  require_one_or_two_ranks();
  const ModelCase m{"Linear",
                    [](bool) {
                      auto model = std::make_unique<Linear>(6, 4);
                      model->set_input_grad(false);
                      return std::unique_ptr<Module>(std::move(model));
                    },
                    {6},
                    4,
                    false};
  const Trained plain = train(m, false, 0);
  for (int zero : {1, 2}) {
    INFO("ZeRO-" << zero);
    CHECK(same_bits(train(m, false, zero).final, plain.final));
  }
  // default_units finds nothing to gather: refused before any collective.
  CHECK_THROWS_WITH(train(m, false, 3),
                    Catch::Contains("ZeRO-3 (StepOptions::sync.zero_stage 3) gathers the "
                                    "parameters unit by unit") &&
                        Catch::Contains("Linear '<root>' has none: its tree holds no Sequential") &&
                        Catch::Contains("Put its layers in a Sequential"));
}
