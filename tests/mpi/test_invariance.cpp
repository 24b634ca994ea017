// The rank-invariant step (Note [rank-invariant step], engine/data_parallel_step.h)
// and its reduction (comm/ordered_reduce.h) on N ranks: the ordered allreduce
// gives the bits of the tree over the ranks computed in one process, and N
// ranks of K = 4 chunks train to the very bits of one process taking all 4N
// chunks (a DataParallelStep without a world), for an MLP with dropout and
// gpt-tiny, in fp32 and under bf16 autocast, with clipping, ZeRO-1 on and off.
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
#include "engine/nn/linear.h"
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

std::unique_ptr<Module> gpt() {
  auto m = make_model("gpt-tiny", 0.1f);
  initialize(*m, 21);
  return m;
}

// Chunk j of step s's global batch: the same rows whoever takes it.
MicroBatch chunk(bool tokens, int step, std::int64_t j) {
  std::mt19937 rng(static_cast<unsigned>(step * 1000 + j));
  if (tokens) {
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
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * 6);
  std::vector<std::int64_t> y(rows);
  for (float& v : x) v = normal(rng);
  for (std::int64_t r = 0; r < rows; ++r) y[r] = (x[r * 6] > 0) + 2 * (x[r * 6 + 1] > 0);
  return {core::Tensor::from_vector(x, {rows, 6}, DType::f32),
          core::Tensor::from_vector(y, {rows}, DType::i64)};
}

struct Config {
  bool tokens;
  std::optional<DType> autocast;
  double max_grad_norm;
  int zero_stage;
};

struct Run {
  std::vector<float> parameters;
  std::vector<double> losses;
};

// `world` null: one process taking every chunk of the 4N.
Run train(const Config& c, comm::World* world, int steps) {
  const int n = test::mpi_world().size();
  const int size = world ? world->size() : 1, rank = world ? world->rank() : 0;
  auto model = c.tokens ? gpt() : mlp();
  ParameterStore store(*model, core::Device::cpu());
  AdamW adamw(store, single_group(store, 1e-2, 0.1));
  LossScaler scaler(LossScalerOptions{.enabled = false});
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
      mine.push_back(chunk(c.tokens, s, std::int64_t{rank} * o.accumulation + k));
    run.losses.push_back(step.run(mine).loss);
  }
  run.parameters = store.values().to_vector<float>();
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
      {false, std::nullopt, 0.0, 0}, {false, std::nullopt, 0.05, 1}, {false, DType::bf16, 0.05, 0},
      {false, DType::bf16, 0.0, 1},  {true, std::nullopt, 0.5, 1},   {true, DType::bf16, 0.5, 0},
  };
  for (const Config& c : configs) {
    INFO("ranks " << world.size() << (c.tokens ? ", gpt-tiny" : ", mlp") << ", autocast "
                  << (c.autocast ? dtype_name(*c.autocast) : "off") << ", max_grad_norm "
                  << c.max_grad_norm << ", zero_stage " << c.zero_stage);
    const int steps = c.tokens ? 2 : 3;
    const Run ours = train(c, &world, steps);
    const Run alone = train({c.tokens, c.autocast, c.max_grad_norm, 0}, nullptr, steps);
    CHECK(ours.losses == alone.losses);
    REQUIRE(same_bits(ours.parameters, alone.parameters));
  }
}

TEST_CASE("the rank-invariant step refuses world sizes and models it cannot serve",
          "[mpi][invariant]") {
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
  Sequential with_norm;
  with_norm.emplace<BatchNorm2d>("bn", 3);
  ParameterStore norm_store(with_norm, core::Device::cpu());
  AdamW norm_adamw(norm_store, single_group(norm_store, 1e-2, 0.1));
  o.accumulation = 1;
  CHECK_THROWS_WITH(
      DataParallelStep(with_norm, norm_store, norm_adamw, make_scheduler("constant", {}), scaler,
                       &world, o, core::Stream()),
      Catch::Contains("does not cover models with buffers; this one has 'bn."));
}
