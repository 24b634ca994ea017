// The rank-invariant step (Note [rank-invariant step], engine/data_parallel_step.h)
// and its reduction (comm/ordered_reduce.h) on N ranks: the ordered allreduce
// gives the bits of the tree over the ranks computed in one process, and N
// ranks of K = 4 chunks train to the very bits of one process taking all 4N
// chunks (a DataParallelStep without a world), for an MLP with dropout,
// gpt-tiny and a CNN with BatchNorm, in fp32 and under bf16 and f16 autocast
// (the loss scaler's skips and growth alike), with clipping, ZeRO-1 on and
// off; BatchNorm's running statistics follow Note [chunk buffers]'s formula.
// Run at 1, 2 and 3 ranks (a 3-rank tree folds blocks of 2 and 1) and 4.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "comm/ordered_reduce.h"
#include "engine/data_parallel_step.h"
#include "engine/models.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/linear.h"
#include "engine/nn/pooling.h"
#include "engine/optim/adamw.h"
#include "mpi/mpi_world.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr std::int64_t kPerRank = 4;  // K: a power of two, so any N is supported

// Values over many binades, so that another association rounds differently.
float value(int rank, std::int64_t i) {
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + i));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  return std::ldexp(mantissa(rng), static_cast<int>(rng() % 40) - 20);
}

std::unique_ptr<Module> mlp() {
  auto n = std::make_unique<Sequential>();
  n->emplace<Linear>("fc1", 6, 24);
  n->emplace<GELU>("act");
  n->emplace<Dropout>("drop", 0.25f);
  n->emplace<Linear>("fc2", 24, 4);
  n->set_input_grad(false);
  initialize(*n, 21);
  return n;
}

// conv, BatchNorm (running statistics), dropout, pooling: the cnn and resnet
// presets' layers at a size a test trains in a second.
std::unique_ptr<Module> cnn() {
  auto n = std::make_unique<Sequential>();
  n->emplace<Conv2d>("conv", 2, 4, 3, 1, 1, 1, 1, false);
  n->emplace<BatchNorm2d>("bn", 4);
  n->emplace<ReLU>("relu");
  n->emplace<Dropout>("drop", 0.25f);
  n->emplace<MaxPool2d>("pool", 2);
  n->emplace<Flatten>("flatten");
  n->emplace<Linear>("fc", 64, 4);
  n->set_input_grad(false);
  initialize(*n, 21);
  return n;
}

std::unique_ptr<Module> gpt() {
  auto m = make_model("gpt-tiny", ModelOptions{.dropout = 0.1f});
  initialize(*m, 21);
  return m;
}

enum class Net { mlp, gpt, cnn };

const char* net_name(Net net) {
  return net == Net::mlp ? "mlp" : net == Net::gpt ? "gpt-tiny" : "cnn";
}

// Chunk j of step s's global batch: the same rows whoever takes it.
MicroBatch chunk(Net net, int step, std::int64_t j) {
  std::mt19937 rng(static_cast<unsigned>(step * 1000 + j));
  if (net == Net::gpt) {
    constexpr std::int64_t rows = 2, t = 16;
    std::vector<std::int32_t> window(rows * (t + 1));
    for (auto& w : window) w = static_cast<std::int32_t>(rng() % 256);
    std::vector<std::int32_t> in(rows * t);
    std::vector<std::int64_t> out(rows * t);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < t; ++i) {
        in[r * t + i] = window[r * (t + 1) + i];
        out[r * t + i] = window[r * (t + 1) + i + 1];
      }
    return {core::Tensor::from_vector(in, {rows, t}, DType::i32),
            core::Tensor::from_vector(out, {rows, t}, DType::i64)};
  }
  constexpr std::int64_t rows = 8;
  const std::int64_t features = net == Net::cnn ? 2 * 8 * 8 : 6;
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * features);
  std::vector<std::int64_t> y(rows);
  // Each chunk's own offset and spread: chunks' batch statistics differ.
  const float shift = 0.5f * static_cast<float>(j % 3), spread = 1.0f + 0.25f * (j % 2);
  for (float& v : x) v = shift + spread * normal(rng);
  for (std::int64_t r = 0; r < rows; ++r)
    y[r] = (x[r * features] > shift) + 2 * (x[r * features + 1] > shift);
  const core::Shape shape = net == Net::cnn ? core::Shape{rows, 2, 8, 8} : core::Shape{rows, 6};
  return {core::Tensor::from_vector(x, shape, DType::f32),
          core::Tensor::from_vector(y, {rows}, DType::i64)};
}

struct Config {
  Net net;
  std::optional<DType> autocast;
  double max_grad_norm;
  int zero_stage;
};

struct Run {
  std::vector<float> parameters;
  std::vector<float> running;        // every f32 buffer, in the model's order
  std::vector<std::int64_t> counts;  // every i64 buffer (num_batches_tracked)
  std::vector<double> losses;
  std::vector<float> scales;  // the loss scale each step ran at
  std::vector<bool> skipped;
};

// f16: a first scale that overflows f16 in backward (a skip, a backoff to
// 2^16), then growth after every clean step: both of the scaler's decisions.
LossScalerOptions scaler_options(const Config& c) {
  if (c.autocast != DType::f16) return {.enabled = false};
  return {.init_scale = 0x1p30f, .backoff_factor = 0x1p-14f, .growth_interval = 1};
}

// `world` null: one process taking every chunk of the 4N.
Run train(const Config& c, comm::World* world, int steps) {
  const int n = test::mpi_world().size();
  const int size = world ? world->size() : 1, rank = world ? world->rank() : 0;
  auto model = c.net == Net::gpt ? gpt() : c.net == Net::cnn ? cnn() : mlp();
  ParameterStore store(*model, core::Device::cpu());
  AdamW adamw(store, single_group(store, 1e-2, 0.1));
  LossScaler scaler(scaler_options(c));
  StepOptions o;
  o.rank_invariant = true;
  o.accumulation = static_cast<int>(kPerRank * n / size);
  o.autocast = c.autocast;
  o.max_grad_norm = c.max_grad_norm;
  o.seed = 9;
  o.sync.zero_stage = c.zero_stage;
  DataParallelStep step(*model, store, adamw, make_scheduler("constant", {}), scaler, world, o,
                        core::Stream());
  Run run;
  for (int s = 0; s < steps; ++s) {
    std::vector<MicroBatch> mine;
    for (int k = 0; k < o.accumulation; ++k)
      mine.push_back(chunk(c.net, s, std::int64_t{rank} * o.accumulation + k));
    const StepResult r = step.run(mine);
    run.losses.push_back(r.loss);
    run.scales.push_back(r.loss_scale);
    run.skipped.push_back(r.skipped);
  }
  run.parameters = store.values().to_vector<float>();
  for (Buffer* b : model->buffers()) {
    if (b->value.dtype() == DType::f32) {
      const std::vector<float> v = b->value.to_vector<float>();
      run.running.insert(run.running.end(), v.begin(), v.end());
    } else {
      const std::vector<std::int64_t> v = b->value.to_vector<std::int64_t>();
      run.counts.insert(run.counts.end(), v.begin(), v.end());
    }
  }
  return run;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the ordered allreduce adds the ranks' buffers in the tree over the rank index",
          "[mpi][invariant]") {
  comm::World& world = test::mpi_world();
  const int n = world.size();
  // Not a multiple of N (the tail path) beside a multiple.
  for (const std::int64_t numel : {std::int64_t{1000}, std::int64_t{n} * 64 + n - 1}) {
    std::vector<float> mine(static_cast<std::size_t>(numel));
    for (std::int64_t i = 0; i < numel; ++i) mine[i] = value(world.rank(), i);
    core::Tensor data = core::Tensor::from_vector(mine, {numel}, DType::f32);
    comm::OrderedAllreduce reduce(world.host(), numel, core::Stream());
    reduce.run(data, core::Stream());
    const std::vector<float> got = data.to_vector<float>();
    std::vector<float> want(got.size());
    for (std::int64_t i = 0; i < numel; ++i)
      want[i] = comm::tree_sum<float>(
          n, [&](std::int64_t r) { return value(static_cast<int>(r), i); },
          [](float a, float b) { return a + b; });
    INFO("ranks " << n << ", " << numel << " elements");
    REQUIRE(same_bits(got, want));
  }
}

TEST_CASE("N ranks of the rank-invariant step train to the bits of one process",
          "[mpi][invariant]") {
  comm::World& world = test::mpi_world();
  const Config configs[] = {
      {Net::mlp, std::nullopt, 0.0, 0}, {Net::mlp, std::nullopt, 0.05, 1},
      {Net::mlp, DType::bf16, 0.05, 0}, {Net::mlp, DType::bf16, 0.0, 1},
      {Net::mlp, DType::f16, 0.05, 1},  {Net::gpt, std::nullopt, 0.5, 1},
      {Net::gpt, DType::bf16, 0.5, 0},  {Net::gpt, DType::f16, 0.0, 0},
      {Net::cnn, std::nullopt, 0.0, 0}, {Net::cnn, std::nullopt, 0.05, 1},
      {Net::cnn, DType::bf16, 0.0, 1},  {Net::cnn, DType::f16, 0.05, 0},
  };
  for (const Config& c : configs) {
    INFO("ranks " << world.size() << ", " << net_name(c.net) << ", autocast "
                  << (c.autocast ? dtype_name(*c.autocast) : "off") << ", max_grad_norm "
                  << c.max_grad_norm << ", zero_stage " << c.zero_stage);
    const int steps = c.net == Net::gpt && c.autocast != DType::f16 ? 2 : 3;
    const Run ours = train(c, &world, steps);
    const Run alone = train({c.net, c.autocast, c.max_grad_norm, 0}, nullptr, steps);
    CHECK(ours.losses == alone.losses);
    CHECK(ours.scales == alone.scales);
    CHECK(ours.skipped == alone.skipped);
    CHECK(same_bits(ours.running, alone.running));
    CHECK(ours.counts == alone.counts);
    REQUIRE(same_bits(ours.parameters, alone.parameters));
    if (c.autocast == DType::f16) {  // the scaler skipped, then stepped, then grew
      CHECK(alone.skipped.front());
      CHECK(!alone.skipped.back());
      CHECK(alone.scales.back() > alone.scales[1]);
    }
  }
}

// Note [chunk buffers] against a float64 loop: BatchNorm straight on the
// chunks' rows, whose batch statistics the loop takes itself.
TEST_CASE(
    "the rank-invariant step moves BatchNorm's running statistics once a step to the "
    "chunks' mean statistics",
    "[mpi][invariant]") {
  comm::World& world = test::mpi_world();
  const int n = world.size();
  constexpr std::int64_t channels = 2, plane = 8 * 8, rows = 8;
  constexpr double momentum = 0.1;
  auto net = std::make_unique<Sequential>();
  BatchNorm2d& bn = net->emplace<BatchNorm2d>("bn", channels);
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc", channels * plane, 4);
  net->set_input_grad(false);
  initialize(*net, 21);
  ParameterStore store(*net, core::Device::cpu());
  AdamW adamw(store, single_group(store, 1e-2, 0.1));
  LossScaler scaler(LossScalerOptions{.enabled = false});
  StepOptions o;
  o.rank_invariant = true;
  o.accumulation = static_cast<int>(kPerRank);
  DataParallelStep step(*net, store, adamw, make_scheduler("constant", {}), scaler, &world, o,
                        core::Stream());
  const std::int64_t chunks = kPerRank * n;
  std::vector<double> mean(channels, 0.0), var(channels, 1.0);
  for (int s = 0; s < 2; ++s) {
    std::vector<MicroBatch> mine;
    for (std::int64_t k = 0; k < kPerRank; ++k)
      mine.push_back(chunk(Net::cnn, s, world.rank() * kPerRank + k));
    step.run(mine);
    std::vector<double> mean_of_means(channels, 0.0), mean_of_vars(channels, 0.0);
    for (std::int64_t j = 0; j < chunks; ++j) {
      const std::vector<float> x = chunk(Net::cnn, s, j).inputs.to_vector<float>();
      for (std::int64_t c = 0; c < channels; ++c) {
        double sum = 0.0, squares = 0.0;
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t i = 0; i < plane; ++i) sum += x[(r * channels + c) * plane + i];
        const double m = sum / (rows * plane);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t i = 0; i < plane; ++i) {
            const double d = x[(r * channels + c) * plane + i] - m;
            squares += d * d;
          }
        mean_of_means[c] += m / static_cast<double>(chunks);
        mean_of_vars[c] += squares / (rows * plane - 1) / static_cast<double>(chunks);
      }
    }
    for (std::int64_t c = 0; c < channels; ++c) {
      mean[c] = (1 - momentum) * mean[c] + momentum * mean_of_means[c];
      var[c] = (1 - momentum) * var[c] + momentum * mean_of_vars[c];
    }
  }
  const std::vector<float> got_mean = bn.running_mean()->value.to_vector<float>();
  const std::vector<float> got_var = bn.running_var()->value.to_vector<float>();
  for (std::int64_t c = 0; c < channels; ++c) {
    INFO("ranks " << n << ", channel " << c);
    // f32 statistics of 512 values, differences and sums of a few terms:
    // a few ulps of values near 1 (the var) or 0.1 (the mean).
    CHECK(got_mean[c] == Approx(mean[c]).margin(1e-6));
    CHECK(got_var[c] == Approx(var[c]).epsilon(1e-6));
  }
  // One update a step, not one a chunk.
  CHECK(bn.num_batches_tracked()->value.to_vector<std::int64_t>() == std::vector<std::int64_t>{2});
}

TEST_CASE("the rank-invariant step refuses world sizes it cannot serve", "[mpi][invariant]") {
  comm::World& world = test::mpi_world();
  auto model = mlp();
  ParameterStore store(*model, core::Device::cpu());
  AdamW adamw(store, single_group(store, 1e-2, 0.1));
  LossScaler scaler(LossScalerOptions{.enabled = false});
  StepOptions o;
  o.rank_invariant = true;
  if (world.size() == 2) {
    o.accumulation = 3;  // 6 chunks: 3 per rank is no subtree
    CHECK_THROWS_WITH(DataParallelStep(*model, store, adamw, make_scheduler("constant", {}), scaler,
                                       &world, o, core::Stream()),
                      Catch::Contains("accumulation 3 on 2 ranks (6 chunks)") &&
                          Catch::Contains("the same bits on 1, 3 or 6 ranks"));
  }
}
