// ZeRO-1, ZeRO-2 and ZeRO-3 end to end (StepOptions::sync.zero_stage = 1, 2,
// 3): each rank keeps the optimizer state (ZeRO-2: and the gradients; ZeRO-3:
// and the parameters) of its shard only, and training gives the parameters
// of plain data parallelism: bit for
// bit on 1 and 2 ranks (a sum of two gradients is the same whichever rank
// adds it), within a stated tolerance on 3 ranks and for ZeRO-2 with
// accumulation; with clipping, f16 loss scaling, activation checkpointing,
// and through checkpoints taken in one stage and resumed in another, and by
// one process alone (another world size).
#include <fmt/core.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

#include "comm/flight_recorder.h"
#include "comm/step_agreement.h"
#include "engine/checkpoint.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/activation.h"
#include "engine/nn/checkpointed.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/optim/sgd.h"
#include "engine/trainer.h"
#include "engine/zero.h"
#include "engine/zero3.h"
#include "io/tensor_dataset.h"
#include "mpi/mpi_world.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr std::int64_t kSamples = 480;  // 20 steps of 3 ranks x 2 micro-batches x 4 rows
constexpr std::int64_t kMicroBatch = 4;

// This rank's share (or, with world_size 1, all) of the rows, micro_batch at a time.
io::TensorDataset rows(std::int64_t micro_batch, int world_size, int rank) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(kSamples * 6);
  std::vector<std::int64_t> y(kSamples);
  for (float& v : x) v = normal(rng);
  for (std::int64_t i = 0; i < kSamples; ++i)
    y[i] = (x[i * 6] > 0) + 2 * (x[i * 6 + 3] + x[i * 6 + 4] > 0);
  io::TensorDatasetOptions o;
  o.sampler = {.micro_batch = micro_batch,
               .world_size = world_size,
               .rank = rank,
               .shuffle = true,
               .seed = 4};
  return io::TensorDataset(core::Tensor::from_vector(x, {kSamples, 6}, DType::f32),
                           core::Tensor::from_vector(y, {kSamples}, DType::i64), o);
}

// 17 blocks of 64 f32 (1088 elements): on 2 and 3 ranks the shard layout has
// a tail past the buffer, and buckets of 512 bytes cut fc2.weight apart.
// `checkpointed`: fc2 and relu inside a Checkpointed (the same names and
// layout, Note [activation checkpointing]).
std::unique_ptr<Module> net(bool checkpointed = false) {
  auto n = std::make_unique<Sequential>();
  n->emplace<Linear>("fc1", 6, 40);
  n->emplace<GELU>("act");
  if (checkpointed) {
    auto middle = std::make_unique<Sequential>();
    middle->emplace<Linear>("fc2", 40, 13);
    middle->emplace<ReLU>("relu");
    n->add("", std::make_unique<Checkpointed>(std::move(middle)));
  } else {
    n->emplace<Linear>("fc2", 40, 13);
    n->emplace<ReLU>("relu");
  }
  n->emplace<Linear>("fc3", 13, 4);
  n->set_input_grad(false);
  initialize(*n, 5);
  return n;
}
constexpr std::int64_t kFlatElements = 1088;

struct Config {
  static Config of(const std::string& optimizer) {
    Config c;
    c.optimizer = optimizer;
    return c;
  }
  Config with_zero(int stage) const {
    Config c = *this;
    c.zero = stage;
    return c;
  }

  std::string optimizer = "sgd";  // with momentum 0.9, or "adamw"
  int zero = 0;
  int accumulation = 1;
  double clip = 0.0;
  std::optional<DType> autocast;
  float init_scale = 1.0f;  // f16 only
  int steps = 20;
  bool checkpointed = false;
  // ZeRO-2: a store built with its flat gradient buffer, which the step drops
  // (otherwise one that never makes it).
  bool flat_store = false;
};

std::unique_ptr<Optimizer> make_optimizer(const Config& c, ParameterStore& store) {
  if (c.optimizer == "adamw") return std::make_unique<AdamW>(store, decay_groups(store, 1e-2, 0.1));
  return std::make_unique<SGD>(store, decay_groups(store, 0.1, 1e-3), SgdOptions{.momentum = 0.9});
}

struct Result {
  std::vector<float> parameters;
  std::int64_t state_bytes = 0;
  std::optional<CheckpointContents> saved;  // at save_at
  std::int64_t skipped = 0;
  float loss_scale = 1.0f;
  double max_grad_norm_seen = 0.0;
  // Between steps: whether any parameter holds a gradient (ZeRO-2 keeps only the shard).
  bool gradients_held = false;
  std::int64_t shard_gradient_numel = 0;  // ZeRO-2
  std::size_t gradient_groups = 0;        // ZeRO-2
  // ZeRO-3: between steps, whether any parameter holds a value, and the store's values.
  bool values_held = false;
  std::int64_t stored_value_numel = 0;
};

// Every trainable parameter's values, one after another in ready order: the
// same list whatever the store's layout (ZeRO-3 pads its units).
std::vector<float> parameter_values(const ParameterStore& store) {
  std::vector<float> out;
  for (const ParameterStore::Slot& s : store.slots()) {
    const std::vector<float> v = s.parameter->value.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Trains c.steps steps from the start, or from `resume` to c.steps;
// captures a checkpoint after step `save_at` (every rank: a collective under ZeRO).
Result train(const Config& c, int save_at = -1, const CheckpointContents* resume = nullptr) {
  comm::World& world = test::mpi_world();
  auto model = net(c.checkpointed);
  ParameterStore store(
      *model, core::Device::cpu(), {},
      c.zero >= 2 && !c.flat_store ? ParameterStore::Gradients::groups
                                   : ParameterStore::Gradients::flat,
      c.zero == 3 ? ParameterUnits{default_units(*model), world.size()} : ParameterUnits{});
  auto optimizer = make_optimizer(c, store);
  LossScalerOptions scaling{.enabled = c.autocast == DType::f16, .init_scale = c.init_scale};
  LossScaler scaler(scaling);
  StepOptions o;
  o.accumulation = c.accumulation;
  o.autocast = c.autocast;
  o.max_grad_norm = c.clip;
  o.seed = 9;
  o.sync.bucket_cap_bytes = o.sync.first_bucket_cap_bytes = 512;
  o.sync.zero_stage = c.zero;
  ScheduleOptions s;
  s.total_steps = c.steps;
  Trainer trainer(*model, store, *optimizer, make_scheduler("constant", s), scaler, world, o,
                  core::Stream());
  io::TensorDataset source = rows(kMicroBatch, world.size(), world.rank());
  std::int64_t position = 0;
  if (resume) {
    const auto full = trainer.data_parallel_step().full_parameters(true);
    const TrainingState state =
        restore_checkpoint(*resume, "(in memory)", *model, *optimizer, {}, {}, core::Stream());
    trainer.set_steps(state.step);
    scaler.set_state(state.scaler);
    position = state.position;
  }
  source.start_epoch(0, position);
  Result r;
  while (trainer.steps() < c.steps) {
    const std::optional<StepResult> step = trainer.step(source);
    REQUIRE(step);
    r.skipped += step->skipped ? 1 : 0;
    if (std::isfinite(step->grad_norm))
      r.max_grad_norm_seen = std::max(r.max_grad_norm_seen, step->grad_norm);
    if (trainer.steps() == save_at) {
      const std::int64_t global_batch = c.accumulation * world.size() * kMicroBatch;
      const TrainingState state{trainer.steps(), 0, save_at * global_batch,
                                scaler.state(),  9, world.size(),
                                global_batch,    {}};
      const auto full = trainer.data_parallel_step().full_parameters();
      r.saved = capture_checkpoint(*model, *optimizer, state, core::Stream());
    }
  }
  for (const ParameterStore::Slot& s : store.slots())
    r.values_held = r.values_held || s.parameter->value.defined();
  r.stored_value_numel = store.values().numel();
  {
    const auto full = trainer.data_parallel_step().full_parameters();
    r.parameters = parameter_values(store);
  }
  r.state_bytes = optimizer->state_bytes();
  r.loss_scale = scaler.scale();
  for (const ParameterStore::Slot& s : store.slots())
    r.gradients_held = r.gradients_held || s.parameter->grad.defined();
  if (c.zero >= 2) {
    comm::GradientSynchronizer& sync = trainer.data_parallel_step().synchronizer();
    r.shard_gradient_numel = sync.shard_gradients().numel();
    r.gradient_groups = sync.gradient_groups().size();
  }
  return r;
}

// Another world size: one process continues the checkpoint alone with the
// whole global batch, through a DataParallelStep without a world (no
// communication), as the rank-equivalence tests' reference does.
std::vector<float> continue_alone(const Config& c, const CheckpointContents& saved) {
  const int n = test::mpi_world().size();
  auto model = net();
  ParameterStore store(*model, core::Device::cpu());
  auto optimizer = make_optimizer(c, store);
  LossScaler scaler(LossScalerOptions{.enabled = false});
  ScheduleOptions s;
  s.total_steps = c.steps;
  DataParallelStep alone(*model, store, *optimizer, make_scheduler("constant", s), scaler, nullptr,
                         StepOptions{}, core::Stream());
  const TrainingState state =
      restore_checkpoint(saved, "(in memory)", *model, *optimizer, {}, {}, core::Stream());
  alone.set_steps(state.step);
  io::TensorDataset source = rows(n * kMicroBatch, 1, 0);
  source.start_epoch(0, state.position);
  while (alone.steps() < c.steps) {
    const io::Batch b = *source.next();
    const MicroBatch batch{b.inputs, b.labels};
    alone.run({&batch, 1});
  }
  return parameter_values(store);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// Note [3-rank tolerance]: on 3 ranks MPI_Allreduce and
// MPI_Reduce_scatter_block may add the three partial gradients in different
// orders: one f32 rounding of the sum, 2^-24 relative, on gradients of
// magnitude <= 1 here. SGD (lr 0.1, momentum 0.9) carries a gradient's error
// into at most 1 / (1 - 0.9) = 10 updates' worth, so 20 steps move a
// parameter by at most 20 x 0.1 x 10 x 2^-24 ~ 1.2e-6 before feedback
// through the changed parameters; AdamW's update is lr (1e-2) times a ratio
// the rounding moves relatively by ~2^-24. 1e-5 allows 8x that, and a wrong
// shard (a missed or doubled gradient) moves parameters by >= 1e-3.
constexpr double kThreeRankTolerance = 1e-5;

void require_same(const std::vector<float>& zero, const std::vector<float>& plain, int ranks) {
  if (ranks <= 2)
    REQUIRE(same_bits(zero, plain));
  else
    REQUIRE(max_difference(zero, plain) <= kThreeRankTolerance);
}

}  // namespace

TEST_CASE("ZeRO-1 trains to the parameters of plain data parallelism, with SGD and AdamW",
          "[mpi][zero]") {
  const int n = test::mpi_world().size();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer << " on " << n << " ranks");
    const Result plain = train(Config::of(optimizer));
    const Result zero = train(Config::of(optimizer).with_zero(1));
    require_same(zero.parameters, plain.parameters, n);
    // Note [sharded state]: per state buffer, the padded flat size / ranks.
    const std::int64_t buffers = optimizer == "adamw" ? 2 : 1;
    const std::int64_t blocks = (kFlatElements + 64 * n - 1) / (64 * n);
    CHECK(plain.state_bytes == buffers * kFlatElements * 4);
    CHECK(zero.state_bytes == buffers * blocks * 64 * 4);
  }
}

TEST_CASE("ZeRO-1 with accumulation and clipping by the global norm of the shards", "[mpi][zero]") {
  Config plain_config;
  plain_config.accumulation = 2;
  plain_config.clip = 0.2;
  const Result plain = train(plain_config);
  const Result zero = train(plain_config.with_zero(1));
  REQUIRE(plain.max_grad_norm_seen > 0.2);  // clipping happened
  // The global norm is the root of an f32 sum of per-rank f32 partial sums
  // where plain data parallelism rounds one sum over the whole buffer: the
  // clipping factor differs by a few f32 roundings (~1e-7 relative), which
  // moves the clipped updates (<= lr x 0.2 x momentum's 10) by ~1e-8 a step:
  // within Note [3-rank tolerance]'s 1e-5 on any number of ranks.
  CHECK(max_difference(zero.parameters, plain.parameters) <= kThreeRankTolerance);
}

TEST_CASE("ZeRO-1 and ZeRO-2 in f16 take plain data parallelism's loss scaler skips",
          "[mpi][zero]") {
  const int n = test::mpi_world().size();
  // 2^24 overflows f16's backward at first: the scaler backs off step after
  // step until the gradients fit, then trains (CPU autocast emulates f16).
  Config plain_config;
  plain_config.autocast = DType::f16;
  plain_config.init_scale = 16777216.0f;
  const Result plain = train(plain_config);
  REQUIRE(plain.skipped > 0);
  for (int stage : {1, 2}) {
    INFO("ZeRO-" << stage);
    const Result zero = train(plain_config.with_zero(stage));
    CHECK(zero.skipped == plain.skipped);
    CHECK(zero.loss_scale == plain.loss_scale);
    require_same(zero.parameters, plain.parameters, n);
  }
}

namespace {

// measure_gradients into a readback of its own, read at once: the payload a
// step's agreement carries (Note [sharded step checks]).
GradientPayload measured_payload(core::Tensor& grads, const std::vector<comm::FlatRange>& owned,
                                 LossScaler& scaler) {
  StepReadback readback(static_cast<std::int64_t>(owned.size()), 0, grads.device(), {});
  readback.clear({});
  measure_gradients(grads, owned, scaler, readback, {});
  return gradient_payload(readback.read({}));
}

}  // namespace

TEST_CASE("one rank's inf in its shard makes every rank skip and back off", "[mpi][zero]") {
  comm::World& world = test::mpi_world();
  const int n = world.size();
  std::vector<comm::GradientSegment> segments = {{"a", 0, 300, {300}}, {"b", 320, 200, {200}}};
  const comm::ShardLayout layout = comm::plan_shards(segments, 576, n, world.rank(), 256, 256);
  // Every rank writes the same finite values; rank n-1 turns one element of
  // its own shard into an inf (the others never see it).
  auto value = [](std::int64_t i) { return 0.001f * static_cast<float>(i % 97) - 0.04f; };
  core::Tensor grads = core::Tensor::empty({576}, DType::f32);
  for (bool with_inf : {false, true}) {
    for (std::int64_t i = 0; i < 576; ++i) grads.data_as<float>()[i] = value(i);
    const std::vector<comm::FlatRange> owned = layout.owned();
    if (with_inf && world.rank() == n - 1) {
      const auto mine = std::find_if(owned.begin(), owned.end(),
                                     [](const comm::FlatRange& r) { return r.numel > 0; });
      REQUIRE(mine != owned.end());
      grads.data_as<float>()[mine->offset] = INFINITY;
    }
    LossScaler scaler(LossScalerOptions{.init_scale = 1024.0f});
    GradientPayload payload = measured_payload(grads, owned, scaler);
    comm::StepAgreement(world.host(), payload.size()).agree(0.0, 0, payload);
    const GradientCheck check =
        decide_gradients(grads, owned, scaler, 0.0, payload, core::Stream());
    INFO("with inf: " << with_inf);
    CHECK(check.clean == !with_inf);
    CHECK(scaler.scale() == (with_inf ? 512.0f : 1024.0f));
    if (!with_inf) {
      // The chunks of all ranks tile [0, 576): the f64 norm of every value / 1024.
      double squares = 0.0;
      for (std::int64_t i = 0; i < 576; ++i) squares += std::pow(value(i) / 1024.0, 2);
      // f64 sums in other orders, never rounded to f32: 1e-12 relative.
      CHECK(check.grad_norm == Approx(std::sqrt(squares)).epsilon(1e-12));
    }
  }
}

// Note [huge finite gradients] (tests/engine/test_trainer.cpp) under ZeRO-1:
// gradients of ~1e20 whose squares sum past FLT_MAX over the shards; the
// norm is the f64 reference (1e-12 relative: f64 sums in other orders) and
// each rank's clipped shard is g x fl32(coef) (2.5e-7 relative).
TEST_CASE("ZeRO-1's shard norms of finite gradients past FLT_MAX clip like float64",
          "[mpi][zero]") {
  comm::World& world = test::mpi_world();
  std::vector<comm::GradientSegment> segments = {{"a", 0, 300, {300}}, {"b", 320, 200, {200}}};
  const comm::ShardLayout layout =
      comm::plan_shards(segments, 576, world.size(), world.rank(), 256, 256);
  auto value = [](std::int64_t i) {
    return i < 520 && (i < 300 || i >= 320) ? 1e20f * (0.01f * static_cast<float>(i % 97) - 0.4f)
                                            : 0.0f;
  };
  core::Tensor grads = core::Tensor::empty({576}, DType::f32);
  double squares = 0.0;
  for (std::int64_t i = 0; i < 576; ++i) {
    grads.data_as<float>()[i] = value(i);
    squares += std::pow(static_cast<double>(value(i)), 2);
  }
  REQUIRE(squares > std::numeric_limits<float>::max());
  const std::vector<comm::FlatRange> owned = layout.owned();
  LossScaler scaler(LossScalerOptions{.enabled = false});
  GradientPayload payload = measured_payload(grads, owned, scaler);
  comm::StepAgreement(world.host(), payload.size()).agree(0.0, 0, payload);
  const double norm = std::sqrt(squares), max_norm = 1.0;
  const GradientCheck check =
      decide_gradients(grads, owned, scaler, max_norm, payload, core::Stream());
  CHECK(check.clean);
  CHECK(check.grad_norm == Approx(norm).epsilon(1e-12));
  const double coef = max_norm / (norm + 1e-6);
  for (const comm::FlatRange& r : owned)
    for (std::int64_t i = r.offset; i < r.offset + r.numel; ++i)
      REQUIRE(grads.data_as<float>()[i] ==
              Approx(static_cast<double>(value(i)) * coef).epsilon(2.5e-7).margin(1e-30));
}

// Note [collectives of a ZeRO-1 step]: a step of the net (no buffers, so
// begin_step broadcasts nothing) issues, in this order: one reduce-scatter
// per bucket (the gradients), one allgather of the step agreement's records
// (loss, rows, stop, and the shards' inf finding and sum of squares: 5
// eight-byte slots), and one allgather per bucket (the updated parameters).
// Nothing else: the shards' checks ride in the agreement. ZeRO-2 issues the
// same, with the reduce-scatters once per micro-batch (docs/memory.md:
// accumulation's cost).
TEST_CASE("a ZeRO step issues the buckets' collectives and one agreement, nothing else",
          "[mpi][zero]") {
  comm::World& world = test::mpi_world();
  auto model = net();
  ParameterStore store(*model, core::Device::cpu());
  const comm::ShardLayout layout =
      comm::plan_shards(synchronized_model(*model, store).segments, kFlatElements, world.size(),
                        world.rank(), 512, 512);
  struct Call {
    std::string kind;
    std::int64_t count;
    DType dtype;
    std::int64_t bucket;
    bool operator==(const Call&) const = default;
  };
  auto show = [](const std::vector<Call>& calls) {
    std::string text;
    for (const Call& call : calls)
      text += fmt::format("{} {} {} bucket {}; ", call.kind, call.count, dtype_name(call.dtype),
                          call.bucket);
    return text;
  };
  for (const auto& [stage, accumulation] : {std::pair{1, 1}, {2, 1}, {2, 2}}) {
    INFO("ZeRO-" << stage << ", accumulation " << accumulation);
    Config c = Config::of("sgd").with_zero(stage);
    c.clip = 0.2;
    c.steps = 3;
    c.accumulation = accumulation;
    // Only this run's collectives, and none of its set-up numbered as a step.
    const std::vector<comm::FlightRecord> earlier = world.watchdog().flight_records();
    const std::uint64_t first_ticket = earlier.empty() ? 0 : earlier.back().ticket + 1;
    world.watchdog().set_step(-1);
    train(c);
    std::vector<Call> expected;
    const int passes = stage == 2 ? accumulation : 1;
    for (int k = 0; k < passes; ++k)
      for (std::size_t b = 0; b < layout.buckets.size(); ++b)
        expected.push_back(
            {"reduce_scatter", layout.chunk_numel(b), DType::f32, static_cast<std::int64_t>(b)});
    expected.push_back({"allgather", 5, DType::i64, -1});
    for (std::size_t b = 0; b < layout.buckets.size(); ++b)
      expected.push_back(
          {"allgather", layout.chunk_numel(b), DType::f32, static_cast<std::int64_t>(b)});

    std::vector<Call> last_step;  // the watchdog numbers steps from 0
    for (const comm::FlightRecord& f : world.watchdog().flight_records())
      if (f.ticket >= first_ticket && f.step == c.steps - 1)
        last_step.push_back({f.kind, f.count, f.dtype, f.bucket});
    INFO("issued: " << show(last_step));
    INFO("expected: " << show(expected));
    CHECK(last_step == expected);
  }
}

TEST_CASE("a ZeRO-1 checkpoint resumes exactly, with or without ZeRO, and on one process",
          "[mpi][zero]") {
  const int n = test::mpi_world().size();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer << " on " << n << " ranks");
    const Config plain_config = Config::of(optimizer);
    const Config zero_config = plain_config.with_zero(1);
    const Result straight = train(zero_config, 10);
    const Result plain = train(plain_config, 10);
    REQUIRE(straight.saved);
    REQUIRE(plain.saved);

    // The file is the one plain data parallelism writes: the same datasets,
    // shapes and (on up to 2 ranks) bits.
    const auto& zero_tensors = straight.saved->tensors;
    const auto& plain_tensors = plain.saved->tensors;
    REQUIRE(zero_tensors.size() == plain_tensors.size());
    for (const auto& [name, tensor] : zero_tensors) {
      INFO(name);
      const auto it = plain_tensors.find(name);
      REQUIRE(it != plain_tensors.end());
      REQUIRE(tensor.shape() == it->second.shape());
      if (tensor.dtype() == DType::f32)
        require_same(tensor.to_vector<float>(), it->second.to_vector<float>(), n);
    }

    // Resumed with ZeRO: exactly the uninterrupted run.
    CHECK(same_bits(train(zero_config, -1, &*straight.saved).parameters, straight.parameters));
    // Resumed without ZeRO: the uninterrupted ZeRO run, as the two agree.
    require_same(train(plain_config, -1, &*straight.saved).parameters, straight.parameters, n);
    // On one process with the whole global batch: the N-rank sums in another
    // order (one GEMM over the batch against a sum of per-rank GEMMs), as in
    // test_equivalence.cpp, whose 2e-5 holds here too (measured: 1e-7 after
    // 10 steps; a lost shard of state moves parameters by >= 1e-3).
    CHECK(max_difference(continue_alone(zero_config, *straight.saved), straight.parameters) <=
          2e-5);
  }
}

TEST_CASE("a zero stage other than 0 to 3 is refused, naming the option", "[mpi][zero]") {
  comm::World& world = test::mpi_world();
  auto model = net();
  ParameterStore store(*model, core::Device::cpu());
  SGD sgd(store, single_group(store, 0.1, 0.0));
  LossScaler scaler(LossScalerOptions{.enabled = false});
  StepOptions o;
  o.sync.zero_stage = 4;
  CHECK_THROWS_WITH(
      Trainer(*model, store, sgd, make_scheduler("constant", {}), scaler, world, o, core::Stream()),
      Catch::Contains("StepOptions::sync.zero_stage is 4; use 0") &&
          Catch::Contains("or 3 (ZeRO-3"));
  // ZeRO-3 on a store laid out without units.
  o.sync.zero_stage = 3;
  CHECK_THROWS_WITH(
      Trainer(*model, store, sgd, make_scheduler("constant", {}), scaler, world, o, core::Stream()),
      Catch::Contains("zero_stage 3 needs the ParameterStore laid out in units") &&
          Catch::Contains("without units"));
  o.sync.zero_stage = 2;
  o.rank_invariant = true;
  CHECK_THROWS_WITH(
      Trainer(*model, store, sgd, make_scheduler("constant", {}), scaler, world, o, core::Stream()),
      Catch::Contains("use zero_stage 1 with it"));
  o.rank_invariant = false;
  o.sync.zero_stage = 1;
  CHECK_THROWS_WITH(DataParallelStep(*model, store, sgd, make_scheduler("constant", {}), scaler,
                                     nullptr, o, core::Stream()),
                    Catch::Contains("a step without a world has none"));
  comm::SynchronizedModel m = synchronized_model(*model, store);
  CHECK_THROWS_WITH(comm::GradientSynchronizer(world.host(), m, {.zero_stage = -1}),
                    Catch::Contains("zero_stage -1 is not supported"));
  // Unsharded, there is nothing to gather.
  comm::GradientSynchronizer plain(world.host(), m);
  CHECK_THROWS_WITH(plain.gather(store.values()), Catch::Contains("needs zero_stage 1 or 2"));
}

// Note [accumulation tolerance]: ZeRO-2 with K micro-batches adds each
// micro-batch's sum over the ranks into the shard, (a1 + b1) + (a2 + b2),
// where plain data parallelism sums each rank's micro-batches first, (a1 +
// a2) + (b1 + b2) (the second in the weight GEMM's beta = 1, Note [lazy
// zero_grad]). Both are sums of the same K x N terms, each within (K N - 1)
// f32 roundings of the exact sum, relative to the sum of the terms'
// magnitudes, which is at most the largest per-row gradient here (each term
// is a mean over its rows divided by K N; gradients <= 1): two orders differ
// by at most 2 (K N - 1) 2^-24 ~ 6e-7 a step for K = 2, N = 3. SGD (lr 0.1,
// momentum's 10x) carries 20 steps of it to 20 x 0.1 x 10 x 6e-7 = 1.2e-5,
// AdamW's update (lr 1e-2 times a ratio moved relatively by that much)
// less. 4e-5 allows 3x that; a lost or doubled micro-batch moves parameters
// by >= 1e-3. Without accumulation ZeRO-2 issues ZeRO-1's reduce-scatters on
// the same values: the same bits on any number of ranks.
constexpr double kAccumulationTolerance = 4e-5;

TEST_CASE("ZeRO-2 trains to the parameters of plain data parallelism, keeping only its shard",
          "[mpi][zero]") {
  const int n = test::mpi_world().size();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer << " on " << n << " ranks");
    const Result plain = train(Config::of(optimizer));
    const Result one = train(Config::of(optimizer).with_zero(1));
    const Result two = train(Config::of(optimizer).with_zero(2));
    require_same(two.parameters, plain.parameters, n);
    CHECK(same_bits(two.parameters, one.parameters));
    CHECK(two.state_bytes == one.state_bytes);
    // Note [shard layout]: the padded flat size / ranks; no full gradient between steps.
    CHECK(plain.gradients_held);
    CHECK_FALSE(two.gradients_held);
    CHECK(two.shard_gradient_numel == (kFlatElements + 64 * n - 1) / (64 * n) * 64);
    // 512-byte buckets: several groups, each made and dropped every step.
    CHECK(two.gradient_groups > 1);
  }
}

TEST_CASE("ZeRO-2 clips by the global norm as ZeRO-1 does, with and without accumulation",
          "[mpi][zero]") {
  const int n = test::mpi_world().size();
  Config c;
  c.clip = 0.2;
  const Result plain = train(c);
  REQUIRE(plain.max_grad_norm_seen > 0.2);  // clipping happened
  CHECK(same_bits(train(c.with_zero(2)).parameters, train(c.with_zero(1)).parameters));
  // The shards' partial sums of squares: ZeRO-1's clipping test's 1e-5.
  CHECK(max_difference(train(c.with_zero(2)).parameters, plain.parameters) <= kThreeRankTolerance);
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer << " with accumulation on " << n << " ranks");
    Config accumulated = Config::of(optimizer);
    accumulated.accumulation = 2;
    accumulated.clip = optimizer == "sgd" ? 0.2 : 0.0;
    const Result reference = train(accumulated);
    const Result two = train(accumulated.with_zero(2));
    // Note [accumulation tolerance]; clipping adds ZeRO-1's ~1e-8 a step.
    CHECK(max_difference(two.parameters, reference.parameters) <= kAccumulationTolerance);
  }
}

TEST_CASE("activation checkpointing composes with ZeRO-2", "[mpi][zero]") {
  const int n = test::mpi_world().size();
  Config c = Config::of("adamw");
  c.steps = 10;
  const Result plain = train(c);
  c.checkpointed = true;
  require_same(train(c.with_zero(2)).parameters, plain.parameters, n);
  c.flat_store = true;
  require_same(train(c.with_zero(2)).parameters, plain.parameters, n);
}

TEST_CASE("a run that switches between ZeRO stages at a resume ends where the unswitched run ends",
          "[mpi][zero]") {
  const int n = test::mpi_world().size();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer << " on " << n << " ranks");
    const Config plain_config = Config::of(optimizer);
    const Result plain = train(plain_config, 10);
    const Result two = train(plain_config.with_zero(2), 10);
    REQUIRE(plain.saved);
    REQUIRE(two.saved);
    // Resumed in its own stage: exactly the uninterrupted run.
    CHECK(same_bits(train(plain_config.with_zero(2), -1, &*two.saved).parameters, two.parameters));
    // 0 -> 2 and 2 -> 1: the checkpoints keep the plain layout.
    require_same(train(plain_config.with_zero(2), -1, &*plain.saved).parameters, plain.parameters,
                 n);
    CHECK(same_bits(train(plain_config.with_zero(1), -1, &*two.saved).parameters, two.parameters));
    // With accumulation the resumed ZeRO-2 run is the straight one exactly.
    Config accumulated = plain_config.with_zero(2);
    accumulated.accumulation = 2;
    const Result straight = train(accumulated, 10);
    REQUIRE(straight.saved);
    CHECK(same_bits(train(accumulated, -1, &*straight.saved).parameters, straight.parameters));
  }
}

// ZeRO-3 (Note [parameter units]): the units are fc1, fc2 and fc3 (the
// Sequential's children with parameters), each gathered around its passes.
// Its reduce-scatters add the same two gradients per element as ZeRO-2's,
// and its update is the same elementwise arithmetic on the packed shard, so
// on 1 and 2 ranks it gives plain data parallelism's bits.
TEST_CASE("ZeRO-3 trains to the parameters of plain data parallelism, keeping only its shard",
          "[mpi][zero]") {
  const int n = test::mpi_world().size();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer << " on " << n << " ranks");
    const Result plain = train(Config::of(optimizer));
    const Result two = train(Config::of(optimizer).with_zero(2));
    const Result three = train(Config::of(optimizer).with_zero(3));
    require_same(three.parameters, plain.parameters, n);
    CHECK(same_bits(three.parameters, two.parameters));
    // Between steps: no value and no gradient, only the shards; each unit
    // starts at a multiple of 64 n, so the shard is at most 3 blocks of 64
    // larger than ZeRO-2's.
    CHECK(plain.values_held);
    CHECK_FALSE(three.values_held);
    CHECK_FALSE(three.gradients_held);
    CHECK(three.stored_value_numel == three.shard_gradient_numel);
    CHECK(three.stored_value_numel >= two.shard_gradient_numel);
    CHECK(three.stored_value_numel <= two.shard_gradient_numel + 3 * 64);
    CHECK(three.state_bytes == 2 * 4 * three.stored_value_numel / (optimizer == "sgd" ? 2 : 1));
  }
}

TEST_CASE("ZeRO-3 with accumulation, clipping, f16 skips and activation checkpointing",
          "[mpi][zero]") {
  const int n = test::mpi_world().size();
  Config c;
  c.clip = 0.2;
  // The shards' partial sums of squares (other shards than ZeRO-2's): ZeRO-1's 1e-5.
  CHECK(max_difference(train(c.with_zero(3)).parameters, train(c).parameters) <=
        kThreeRankTolerance);
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer << " with accumulation on " << n << " ranks");
    Config accumulated = Config::of(optimizer);
    accumulated.accumulation = 2;
    // Note [accumulation tolerance]: the gathers repeat for each micro-batch.
    CHECK(max_difference(train(accumulated.with_zero(3)).parameters,
                         train(accumulated).parameters) <= kAccumulationTolerance);
  }
  Config f16;
  f16.autocast = DType::f16;
  f16.init_scale = 16777216.0f;
  const Result plain = train(f16);
  REQUIRE(plain.skipped > 0);
  const Result three = train(f16.with_zero(3));
  CHECK(three.skipped == plain.skipped);
  CHECK(three.loss_scale == plain.loss_scale);
  require_same(three.parameters, plain.parameters, n);
  // A Checkpointed unit recomputes its forward after its backward gather.
  Config checkpointed = Config::of("adamw");
  checkpointed.steps = 10;
  const Result reference = train(checkpointed);
  checkpointed.checkpointed = true;
  require_same(train(checkpointed.with_zero(3)).parameters, reference.parameters, n);
}

TEST_CASE("a ZeRO-3 checkpoint keeps the plain layout and resumes in any stage", "[mpi][zero]") {
  const int n = test::mpi_world().size();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer << " on " << n << " ranks");
    const Config plain_config = Config::of(optimizer);
    const Result plain = train(plain_config, 10);
    const Result three = train(plain_config.with_zero(3), 10);
    REQUIRE(plain.saved);
    REQUIRE(three.saved);
    const auto& plain_tensors = plain.saved->tensors;
    REQUIRE(three.saved->tensors.size() == plain_tensors.size());
    for (const auto& [name, tensor] : three.saved->tensors) {
      INFO(name);
      const auto it = plain_tensors.find(name);
      REQUIRE(it != plain_tensors.end());
      REQUIRE(tensor.shape() == it->second.shape());
      if (tensor.dtype() == DType::f32)
        require_same(tensor.to_vector<float>(), it->second.to_vector<float>(), n);
    }
    // Resumed in its own stage: exactly the uninterrupted run.
    CHECK(same_bits(train(plain_config.with_zero(3), -1, &*three.saved).parameters,
                    three.parameters));
    // 0 -> 3 and 3 -> 0, 3 -> 1: the checkpoints are by name.
    require_same(train(plain_config.with_zero(3), -1, &*plain.saved).parameters, plain.parameters,
                 n);
    require_same(train(plain_config, -1, &*three.saved).parameters, three.parameters, n);
    CHECK(same_bits(train(plain_config.with_zero(1), -1, &*three.saved).parameters,
                    three.parameters));
    // On one process with the whole global batch (the ZeRO-1 resume test's 2e-5).
    CHECK(max_difference(continue_alone(plain_config, *three.saved), three.parameters) <= 2e-5);
  }
}
