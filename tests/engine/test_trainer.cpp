// The Trainer end to end on a learnable synthetic task, in a world of one,
// fed by an in-memory TensorDataset: the loss falls in f32, f16 and bf16; K
// accumulation micro-batches equal one batch K times larger; a run saved and
// restored continues bit for bit; a non-finite gradient skips the step in
// every precision, too many in a row stop the run naming the parameter, and
// non-finite weights are never saved. The same rows written as HDF5 shards
// and read by the DataLoader give the same losses bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>

#include "comm/world.h"
#include "engine/checkpoint.h"
#include "engine/core/memory.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/optim/sgd.h"
#include "engine/trainer.h"
#include "io/loader.h"
#include "io/shard_writer.h"
#include "io/tensor_dataset.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;
namespace fs = std::filesystem;

namespace {

comm::World& world() { return test::world_of_one(); }

// 512 samples of 8 features; the label is the argmax of a fixed linear map,
// which a small MLP learns quickly.
struct Task {
  std::vector<float> x;
  std::vector<std::int64_t> y;
};
const Task& task() {
  static const Task t = [] {
    Task t{std::vector<float>(512 * 8), std::vector<std::int64_t>(512)};
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    for (float& v : t.x) v = normal(rng);
    for (int i = 0; i < 512; ++i) {
      float best = -1e9f;
      for (int c = 0; c < 4; ++c) {
        float score = 0;
        for (int j = 0; j < 8; ++j) score += t.x[i * 8 + j] * std::sin(1.0f + c * 8 + j);
        if (score > best) best = score, t.y[i] = c;
      }
    }
    return t;
  }();
  return t;
}

io::SamplerOptions sampler(std::int64_t batch) {
  return {.micro_batch = batch, .world_size = 1, .rank = 0, .shuffle = true, .seed = 5};
}

// The task in memory, batch rows at a time.
io::TensorDataset source(std::int64_t batch) {
  io::TensorDatasetOptions o;
  o.sampler = sampler(batch);
  o.num_classes = 4;
  return io::TensorDataset(core::Tensor::from_vector(task().x, {512, 8}, DType::f32),
                           core::Tensor::from_vector(task().y, {512}, DType::i64), o);
}

// Passes its input through; its one parameter, unused by forward, gets the
// gradient 0, or `poison` at the steps listed: a gradient gone non-finite in
// one known parameter.
class Probe : public Module {
 public:
  Probe() : Module("Probe"), gain_(add_parameter("gain", {4}, ParamRole::weight)) {}
  core::Tensor forward(const core::Tensor& x, Context&) override { return x; }
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override {
    if (std::find(poisoned.begin(), poisoned.end(), ctx.step) != poisoned.end())
      gain_.grad.view(2, {1}).fill_(poison, ctx.stream);
    return dy;
  }
  std::vector<std::uint64_t> poisoned;  // Context::step values (0 for the first step)
  double poison = std::numeric_limits<double>::quiet_NaN();

 private:
  Parameter& gain_;
};

std::unique_ptr<Sequential> net(bool dropout, Probe** probe = nullptr) {
  auto n = std::make_unique<Sequential>();
  n->emplace<Linear>("fc1", 8, 32);
  n->emplace<ReLU>("relu");
  if (probe) *probe = &n->emplace<Probe>("probe");
  if (dropout) n->emplace<Dropout>("drop", 0.2f);
  n->emplace<Linear>("fc2", 32, 4);
  n->set_input_grad(false);
  return n;
}

// A training run: model, store, optimizer, scaler and trainer, built alike.
struct Run {
  Probe* probe = nullptr;  // set when made with_probe (before `model`, which sets it)
  std::unique_ptr<Sequential> model;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<Optimizer> optimizer;
  LossScaler scaler;
  std::unique_ptr<Trainer> trainer;

  Run(bool adamw, bool dropout, std::optional<DType> autocast, int accumulation,
      bool with_probe = false, int max_consecutive_skips = 20)
      : model(net(dropout, with_probe ? &probe : nullptr)),
        scaler(LossScaler::for_autocast(autocast)) {
    initialize(*model, 11);
    store = std::make_unique<ParameterStore>(*model, core::Device::cpu());
    if (adamw)
      optimizer = std::make_unique<AdamW>(*store, single_group(*store, 0.01, 0.01));
    else
      optimizer = std::make_unique<SGD>(*store, single_group(*store, 0.1, 0.0),
                                        SgdOptions{.momentum = 0.9});
    StepOptions o;
    o.accumulation = accumulation;
    o.autocast = autocast;
    o.seed = 9;
    o.max_consecutive_skips = max_consecutive_skips;
    ScheduleOptions s;
    s.total_steps = 100;
    trainer = std::make_unique<Trainer>(*model, *store, *optimizer, make_scheduler("constant", s),
                                        scaler, world(), o, core::Stream());
  }
};

}  // namespace

TEST_CASE("training reduces the loss in f32, f16 and bf16", "[engine][trainer]") {
  for (std::optional<DType> autocast :
       {std::optional<DType>{}, std::optional{DType::f16}, std::optional{DType::bf16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    Run run(false, false, autocast, 1);
    io::TensorDataset loader = source(32);
    double first = 0, last = 0;
    for (int epoch = 0; epoch < 5; ++epoch) {
      loader.start_epoch(epoch);
      while (auto r = run.trainer->step(loader)) {
        if (r->step == 1) first = r->loss;
        last = r->loss;
        CHECK_FALSE(r->skipped);
        CHECK(std::isfinite(r->grad_norm));
      }
    }
    // ln 4 = 1.39 at the start; a learnable 4-class task ends well below half.
    CHECK(first > 1.0);
    CHECK(last < 0.5 * first);
    const EvalResult e = run.trainer->evaluate(loader);
    CHECK(e.samples == 512);
    REQUIRE(e.accuracy);
    CHECK(*e.accuracy > 0.8);
  }
}

TEST_CASE("K accumulated micro-batches equal one batch K times larger", "[engine][trainer]") {
  Run accumulated(false, false, std::nullopt, 4), whole(false, false, std::nullopt, 1);
  io::TensorDataset small = source(8), big = source(32);
  small.start_epoch(0);
  big.start_epoch(0);
  // The two runs differ only in how the 32 rows' terms are grouped in the f32
  // sums (4 x 8 or 32), which errs by at most 32 u (u = 2^-24) of the terms'
  // magnitude: about 2e-6 relative for the mean loss (terms ~ ln 4), and for
  // the gradients (terms O(1)) 2e-6, times lr 0.1 and momentum 0.9 over three
  // steps (1 + 1.9 + 2.71), about 1e-6 in parameters below 1. 1e-5 allows
  // that worst case five times over (measured: under 1e-7 for both), while a
  // missing 1/K would scale every update by K.
  for (int step = 0; step < 3; ++step) {
    const auto a = accumulated.trainer->step(small);
    const auto b = whole.trainer->step(big);
    CHECK(a->loss == Approx(b->loss).epsilon(1e-5));
  }
  const auto pa = accumulated.store->values().to_vector<float>();
  const auto pb = whole.store->values().to_vector<float>();
  for (std::size_t i = 0; i < pa.size(); ++i) REQUIRE(pa[i] == Approx(pb[i]).margin(1e-5));
}

TEST_CASE("a run restored from its checkpoint continues bit for bit", "[engine][trainer]") {
  const std::map<std::string, std::string> config{{"model", "test"}};
  auto train = [](Run& run, io::BatchSource& loader, int steps) {
    for (int i = 0; i < steps; ++i) REQUIRE(run.trainer->step(loader));
  };
  Run straight(true, true, DType::f16, 2);
  io::TensorDataset l1 = source(16);
  l1.start_epoch(0);
  train(straight, l1, 6);

  Run first(true, true, DType::f16, 2);
  io::TensorDataset l2 = source(16);
  l2.start_epoch(0);
  train(first, l2, 3);
  TrainingState saved{
      first.trainer->steps(), 0, l2.position().position, first.scaler.state(), 9, 1, 16, config};
  const CheckpointContents contents = capture_checkpoint(*first.model, *first.optimizer, saved, {});

  Run resumed(true, true, DType::f16, 2);
  const TrainingState s =
      restore_checkpoint(contents, "in-memory", *resumed.model, *resumed.optimizer, config, {}, {});
  resumed.trainer->set_steps(s.step);
  resumed.scaler.set_state(s.scaler);
  io::TensorDataset l3 = source(16);
  l3.start_epoch(s.epoch, s.position);
  train(resumed, l3, 3);
  CHECK(resumed.store->values().to_vector<float>() == straight.store->values().to_vector<float>());
  CHECK(resumed.optimizer->state_tensors()[0].value.to_vector<float>() ==
        straight.optimizer->state_tensors()[0].value.to_vector<float>());
  const auto other = std::map<std::string, std::string>{{"model", "other"}};
  CHECK_THROWS_WITH(
      restore_checkpoint(contents, "ckpt.h5", *resumed.model, *resumed.optimizer, other, {}, {}),
      Catch::Contains("model was 'test' and is now 'other'"));
}

TEST_CASE("a resume compares the fields of both fingerprints, a missing one at its default",
          "[engine][trainer][checkpoint]") {
  using Config = std::map<std::string, std::string>;
  const Config defaults{{"dropout", "0"}};
  auto saved_with = [](const Config& config) {
    Run run(false, false, {}, 1);
    const TrainingState s{0, 0, 0, run.scaler.state(), 9, 1, 16, config};
    return capture_checkpoint(*run.model, *run.optimizer, s, {});
  };
  auto resume = [&](const CheckpointContents& c, const Config& config) {
    Run run(false, false, {}, 1);
    restore_checkpoint(c, "ckpt-3.h5", *run.model, *run.optimizer, config, defaults, {});
  };
  // A run that leaves dropout out (at its default) is compared with a
  // checkpoint that recorded it, and the other way round.
  const CheckpointContents with_dropout = saved_with({{"model", "gpt"}, {"dropout", "0.1"}});
  CHECK_THROWS_WITH(resume(with_dropout, {{"model", "gpt"}}),
                    Catch::Contains("dropout was '0.1' and is now '0' (the default)"));
  CHECK_THROWS_WITH(resume(with_dropout, {{"model", "gpt"}, {"dropout", "0"}}),
                    Catch::Contains("dropout was '0.1' and is now '0'"));
  CHECK_NOTHROW(resume(with_dropout, {{"model", "gpt"}, {"dropout", "0.1"}}));
  // A checkpoint made before dropout was always recorded: its dropout is the default.
  const CheckpointContents older = saved_with({{"model", "gpt"}});
  CHECK_THROWS_WITH(resume(older, {{"model", "gpt"}, {"dropout", "0.1"}}),
                    Catch::Contains("dropout was '0' (the default: the checkpoint does not record "
                                    "it) and is now '0.1'"));
  CHECK_NOTHROW(resume(older, {{"model", "gpt"}, {"dropout", "0"}}));
  // A field this program neither sets nor knows a default for.
  CHECK_THROWS_WITH(resume(saved_with({{"model", "gpt"}, {"loss", "mse"}}), {{"model", "gpt"}}),
                    Catch::Contains("made with loss 'mse', which this program does not set"));
  // A field the run has and the checkpoint lacks, without a default.
  CHECK_THROWS_WITH(resume(older, {{"model", "gpt"}, {"precision", "fp16"}}),
                    Catch::Contains("lacks attribute 'config.precision'"));
}

TEST_CASE("a non-finite gradient skips the step in fp32, bf16 and f16, on every parameter",
          "[engine][trainer][nonfinite]") {
  const double inf = std::numeric_limits<double>::infinity();
  for (std::optional<DType> autocast :
       {std::optional<DType>{}, std::optional{DType::bf16}, std::optional{DType::f16}}) {
    for (double poison : {inf, -inf, std::numeric_limits<double>::quiet_NaN()}) {
      INFO("autocast " << (autocast ? dtype_name(*autocast) : "off") << ", poison " << poison);
      Run run(false, false, autocast, 1, true);
      run.probe->poisoned = {2};
      run.probe->poison = poison;
      io::TensorDataset loader = source(32);
      loader.start_epoch(0);
      for (int i = 0; i < 4; ++i) {
        const auto before = run.store->values().to_vector<float>();
        const auto state_before = run.optimizer->state_tensors()[0].value.to_vector<float>();
        const float scale_before = run.scaler.scale();
        const std::optional<StepResult> r = run.trainer->step(loader);
        REQUIRE(r);
        CHECK(r->step == i + 1);
        CHECK(std::isfinite(r->loss));
        CHECK(r->skipped == (i == 2));
        CHECK(r->skipped_steps == (i >= 2 ? 1 : 0));
        if (r->skipped) {
          // No trace: parameters and optimizer state are the same bits.
          CHECK(run.store->values().to_vector<float>() == before);
          CHECK(run.optimizer->state_tensors()[0].value.to_vector<float>() == state_before);
          CHECK_FALSE(std::isfinite(r->grad_norm));
          // f16's scaler backs off; the others have no scale.
          CHECK(run.scaler.scale() == (autocast == DType::f16 ? scale_before / 2 : 1.0f));
        } else {
          CHECK(run.store->values().to_vector<float>() != before);
          CHECK(std::isfinite(r->grad_norm));
        }
      }
      CHECK(run.optimizer->steps() == 3);  // the skipped step made no update
      CHECK(run.trainer->steps() == 4);    // but counts for the schedule and dropout
    }
  }
}

// Note [huge finite gradients]: inputs of ~1e20 make fc's weight gradient,
// (softmax - one-hot)^T x / B, ~1e20 per element: every gradient is finite,
// the logits and the loss are too (~1e20 < FLT_MAX), but the squares sum to
// ~1e40 > FLT_MAX. The step must take the update, and clipping must use the
// f64 norm: the clipped gradients are g x fl32(max / (norm + 1e-6)), one f32
// rounding of the coefficient and one of the product from the float64
// reference, so 2.5e-7 relative holds them. The reported norm is the f64
// square root of an f64 sum in another order: 1e-12 relative.
TEST_CASE("finite gradients whose squares sum past FLT_MAX take the step; an inf still skips",
          "[engine][trainer][nonfinite]") {
  constexpr std::int64_t rows = 32;
  std::vector<float> x(task().x.begin(), task().x.begin() + rows * 8);
  for (float& v : x) v *= 1e20f;
  const MicroBatch batch{core::Tensor::from_vector(x, {rows, 8}, DType::f32),
                         core::Tensor::from_vector(
                             std::vector<std::int64_t>(task().y.begin(), task().y.begin() + rows),
                             {rows}, DType::i64)};
  struct Stepped {
    StepResult result;
    std::vector<float> grads;  // after the step: clipped when clipping
  };
  auto one_step = [&](double max_grad_norm, std::optional<double> poison) {
    Probe* probe = nullptr;
    auto model = std::make_unique<Sequential>();
    model->emplace<Linear>("fc", 8, 4);
    probe = &model->emplace<Probe>("probe");
    model->set_input_grad(false);
    initialize(*model, 11);
    if (poison) probe->poisoned = {0}, probe->poison = *poison;
    ParameterStore store(*model, core::Device::cpu());
    SGD sgd(store, single_group(store, 0.1, 0.0));
    LossScaler scaler(LossScaler::for_autocast(std::nullopt));
    StepOptions o;
    o.max_grad_norm = max_grad_norm;
    DataParallelStep step(*model, store, sgd, make_scheduler("constant", {}), scaler, &world(), o,
                          core::Stream());
    const std::vector<float> before = store.values().to_vector<float>();
    Stepped s{step.run({&batch, 1}), store.grads().to_vector<float>()};
    CHECK((store.values().to_vector<float>() == before) == s.result.skipped);
    return s;
  };
  const Stepped plain = one_step(0.0, std::nullopt);
  double squares = 0.0;
  for (float g : plain.grads) {
    REQUIRE(std::isfinite(g));
    squares += static_cast<double>(g) * g;
  }
  REQUIRE(squares > std::numeric_limits<float>::max());
  REQUIRE(std::isfinite(squares));
  const double norm = std::sqrt(squares);
  CHECK_FALSE(plain.result.skipped);
  CHECK(std::isfinite(plain.result.loss));
  CHECK(plain.result.grad_norm == Approx(norm).epsilon(1e-12));

  const double max_norm = 1.0;
  const Stepped clipped = one_step(max_norm, std::nullopt);
  CHECK_FALSE(clipped.result.skipped);
  CHECK(clipped.result.grad_norm == Approx(norm).epsilon(1e-12));
  const double coef = max_norm / (norm + 1e-6);
  for (std::size_t i = 0; i < plain.grads.size(); ++i)
    REQUIRE(clipped.grads[i] ==
            Approx(static_cast<double>(plain.grads[i]) * coef).epsilon(2.5e-7).margin(1e-30));

  for (double poison :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    const Stepped poisoned = one_step(max_norm, poison);
    CHECK(poisoned.result.skipped);
    CHECK_FALSE(std::isfinite(poisoned.result.grad_norm));
  }
}

TEST_CASE("too many skipped steps in a row stop the run, naming the step and the parameter",
          "[engine][trainer][nonfinite]") {
  for (std::optional<DType> autocast : {std::optional<DType>{}, std::optional{DType::bf16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    io::TensorDataset loader = source(16);
    loader.start_epoch(0);
    // Skips that are not all in a row never stop a run.
    Run gaps(false, false, autocast, 1, true, 3);
    gaps.probe->poisoned = {1, 2, 4, 5, 7, 8};
    std::int64_t skipped = 0;
    for (int i = 0; i < 10; ++i) skipped = gaps.trainer->step(loader)->skipped_steps;
    CHECK(skipped == 6);

    Run run(false, false, autocast, 1, true, 3);
    run.probe->poisoned = {1, 2, 3, 4};
    loader.start_epoch(1);
    REQUIRE_FALSE(run.trainer->step(loader)->skipped);
    REQUIRE(run.trainer->step(loader)->skipped);
    REQUIRE(run.trainer->step(loader)->skipped);
    try {
      run.trainer->step(loader);
      FAIL("the third skip in a row did not stop the run");
    } catch (const NumericalError& e) {
      const std::string m = e.what();
      CHECK_THAT(m, Catch::StartsWith("step 4: 3 steps in a row were skipped"));
      CHECK_THAT(m, Catch::Contains("(max_consecutive_skips 3)"));
      // fc2's gradients come first in backward order and are finite.
      CHECK_THAT(m, Catch::Contains("whose gradient is not finite is 'probe.gain' (element 2 is "
                                    "nan)"));
    }
  }
  CHECK_THROWS_WITH(Run(false, false, std::nullopt, 1, false, 0),
                    Catch::Contains("max_consecutive_skips must be at least 1, got 0"));
}

TEST_CASE("an inf or NaN at the loss scale's floor is an error naming the floor and the step",
          "[engine][trainer][nonfinite]") {
  Run run(false, false, DType::f16, 1, true, 100);
  LossScalerOptions options;
  options.init_scale = 4.0f;
  options.min_scale = 1.0f;
  run.scaler = LossScaler(options);
  run.probe->poisoned = {0, 1, 2};
  run.probe->poison = std::numeric_limits<double>::infinity();
  io::TensorDataset loader = source(16);
  loader.start_epoch(0);
  CHECK(run.trainer->step(loader)->skipped);  // scale 4 -> 2
  CHECK(run.trainer->step(loader)->skipped);  // 2 -> 1, the floor
  CHECK(run.scaler.scale() == 1.0f);
  CHECK_THROWS_AS(run.trainer->step(loader), NumericalError);
  Run again(false, false, DType::f16, 1, true, 100);
  again.scaler = LossScaler(options);
  again.scaler.set_state({1.0f, 0});
  again.probe->poisoned = {0};
  CHECK_THROWS_WITH(again.trainer->step(loader),
                    Catch::StartsWith("step 1: the loss scale is at its floor (min_scale 1)"));
}

TEST_CASE("a checkpoint with non-finite weights is never made", "[engine][trainer][nonfinite]") {
  Run run(true, false, std::nullopt, 1);
  TrainingState state{7, 0, 0, run.scaler.state(), 9, 1, 16, {{"model", "test"}}};
  CHECK_NOTHROW(capture_checkpoint(*run.model, *run.optimizer, state, {}));
  for (Parameter* p : run.model->parameters())
    if (p->name == "fc2.weight")
      p->value.view(5, {1}).fill_(std::numeric_limits<double>::quiet_NaN());
  CHECK_THROWS_WITH(capture_checkpoint(*run.model, *run.optimizer, state, {}),
                    Catch::StartsWith("refusing to save the checkpoint of step 7: "
                                      "/model/fc2.weight element 5 is nan"));
  // The optimizer state is checked too.
  for (Parameter* p : run.model->parameters())
    if (p->name == "fc2.weight") p->value.view(5, {1}).fill_(0.0);
  run.optimizer->state_tensors()[0].value.view(0, {1}).fill_(
      std::numeric_limits<double>::infinity());
  CHECK_THROWS_WITH(capture_checkpoint(*run.model, *run.optimizer, state, {}),
                    Catch::Contains("/optimizer/") && Catch::Contains(" is inf"));
}

TEST_CASE("the in-memory source and the HDF5 loader over the same rows train bit for bit alike",
          "[engine][trainer][sources]") {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep-trainer-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    io::DatasetWriter writer(dir, {DType::f32, {8}, DType::i64}, 512, 3);
    writer.append(task().x.data(), task().y.data(), 512);
    writer.close();
  }
  io::LoaderOptions o;
  o.sampler = sampler(16);
  o.threads = 2;
  o.held_batches = 2;
  o.num_classes = 4;
  io::DataLoader from_file(io::Dataset::open(dir), o);
  io::TensorDataset in_memory = source(16);
  // Dropout, f16 autocast with loss scaling, accumulation and AdamW: every
  // path that depends on the rows and their order. Two epochs, so that the
  // second epoch's order is compared too.
  Run a(true, true, DType::f16, 2), b(true, true, DType::f16, 2);
  std::vector<double> losses_a, losses_b;
  for (int epoch = 0; epoch < 2; ++epoch) {
    from_file.start_epoch(epoch);
    in_memory.start_epoch(epoch);
    while (auto r = a.trainer->step(from_file)) losses_a.push_back(r->loss);
    while (auto r = b.trainer->step(in_memory)) losses_b.push_back(r->loss);
    CHECK(from_file.position().position == in_memory.position().position);
  }
  CHECK(losses_a.size() == 2 * 512 / 32);
  // The same rows in the same order through the same arithmetic: exact.
  CHECK(losses_a == losses_b);
  CHECK(a.store->values().to_vector<float>() == b.store->values().to_vector<float>());
  fs::remove_all(dir);
}

TEST_CASE("a data-parallel step refuses the wrong number of micro-batches, naming the option",
          "[engine][trainer]") {
  Run run(false, false, std::nullopt, 1);
  StepOptions two_micro_batches;
  two_micro_batches.accumulation = 2;
  DataParallelStep alone(*run.model, *run.store, *run.optimizer, make_scheduler("constant", {}),
                         run.scaler, nullptr, two_micro_batches, core::Stream());
  io::TensorDataset data = source(16);
  data.start_epoch(0);
  const io::Batch b = *data.next();
  const MicroBatch one{b.inputs, b.labels};
  CHECK_THROWS_WITH(alone.run({&one, 1}),
                    Catch::Contains("1 micro-batches given, StepOptions::accumulation is 2"));
  CHECK_THROWS_WITH(alone.synchronizer(), Catch::Contains("this step has no world"));
  const MicroBatch two[] = {one, one};
  CHECK(alone.run(two).step == 1);
}

TEST_CASE("a step's peak is split into the store's buffers, the optimizer's state and activations",
          "[engine][trainer][memory]") {
  // Note [memory kinds]: a second step's peak (after the first has made
  // what the model keeps) holds the store's parameters and gradients and
  // AdamW's two state buffers, each at least the store's size in f32 (at
  // least: whatever else this process keeps alive counts too), the
  // parameters unchanged by the step, and new activations. The peaks start
  // here: earlier tests in this process may have held more.
  core::reset_peak_memory(core::Device::cpu());
  Run run(true, false, std::nullopt, 1);
  io::TensorDataset data = source(16);
  data.start_epoch(0);
  const io::Batch b = *data.next();
  const MicroBatch one{b.inputs, b.labels};
  const auto at = [](core::MemoryKind k) { return static_cast<std::size_t>(k); };
  const auto store_bytes = static_cast<std::size_t>(4 * run.store->size());
  DataParallelStep alone(*run.model, *run.store, *run.optimizer, make_scheduler("constant", {}),
                         run.scaler, nullptr, StepOptions{}, core::Stream());
  alone.run({&one, 1});  // the first step makes what the model keeps
  const core::MemoryStats live = core::memory_stats(core::Device::cpu());
  const std::size_t live_parameters = live.peak_by_kind[at(core::MemoryKind::parameters)];
  core::reset_peak_memory(core::Device::cpu());
  const core::MemoryStats before = core::memory_stats(core::Device::cpu());
  alone.run({&one, 1});
  const core::MemoryStats after = core::memory_stats(core::Device::cpu());
  CHECK(after.peak_by_kind[at(core::MemoryKind::parameters)] == live_parameters);
  CHECK(after.peak_by_kind[at(core::MemoryKind::parameters)] >= store_bytes);
  CHECK(after.peak_by_kind[at(core::MemoryKind::gradients)] >= store_bytes);
  CHECK(after.peak_by_kind[at(core::MemoryKind::optimizer_state)] >= 2 * store_bytes);
  CHECK(after.peak_by_kind[at(core::MemoryKind::activations)] >
        before.peak_by_kind[at(core::MemoryKind::activations)]);
}
