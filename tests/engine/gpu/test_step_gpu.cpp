// engine::DataParallelStep on a GPU over a one-rank NCCL world (launched
// directly: no MPI): the step's device path (the synchroniser's stream,
// ncclAvg, the loss totals on the device, unscaling on the device) and
// ZeRO-1's (ncclReduceScatter and ncclAllGather per bucket, the CUDA
// optimizer kernels on packed state) and ZeRO-2's (gradient groups made on
// the compute stream and dropped after the compute stream waits for their
// reduce-scatter, the packed gradient shard read through grad_shift). With
// one rank every reduction is the identity, the shard is the whole buffer cut
// into chunks, and the update is elementwise, so ZeRO-1, ZeRO-2 and plain
// data parallelism give the same bits; the grad norm differs only in its
// summation order (per chunk, then summed). Each step reads the device once
// (Note [one read per step]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comm/world.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/optim/sgd.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

struct Run {
  std::vector<float> start, parameters;
  std::int64_t skipped = 0;
  float loss_scale = 1.0f;
  std::vector<std::int64_t> host_copies;  // per step: Note [one read per step]
};

// Six steps of a small MLP on fixed device batches; buckets of 2 KiB, so the
// shard layout has several buckets, one of them cutting fc1.weight.
Run train(const std::string& optimizer_name, int zero_stage, std::optional<DType> autocast,
          int accumulation = 1) {
  comm::World& world = test::gpu_world_of_one();
  const core::Device gpu = world.device();
  core::Stream stream = core::Stream::create(gpu);
  Sequential model;
  model.emplace<Linear>("fc1", 24, 40);
  model.emplace<GELU>("act");
  model.emplace<Linear>("fc2", 40, 5);
  model.set_input_grad(false);
  initialize(model, 11);
  ParameterStore store(
      model, gpu, stream,
      zero_stage >= 2 ? ParameterStore::Gradients::groups : ParameterStore::Gradients::flat,
      zero_stage == 3 ? ParameterUnits{default_units(model), world.size()} : ParameterUnits{});
  std::unique_ptr<Optimizer> optimizer;
  if (optimizer_name == "adamw")
    optimizer =
        std::make_unique<AdamW>(store, decay_groups(store, 1e-2, 0.1), AdamwOptions{}, stream);
  else
    optimizer = std::make_unique<SGD>(store, decay_groups(store, 0.1, 1e-3),
                                      SgdOptions{.momentum = 0.9}, stream);
  LossScaler scaler(LossScalerOptions{.enabled = autocast == DType::f16, .init_scale = 65536.0f});
  StepOptions o;
  o.autocast = autocast;
  o.sync.bucket_cap_bytes = o.sync.first_bucket_cap_bytes = 2048;
  o.sync.zero_stage = zero_stage;
  o.accumulation = accumulation;
  DataParallelStep step(model, store, *optimizer, make_scheduler("constant", {}), scaler, &world, o,
                        stream);
  if (zero_stage >= 1) REQUIRE(step.synchronizer().shard_layout().buckets.size() > 2);
  if (zero_stage >= 2) REQUIRE(step.synchronizer().gradient_groups().size() > 1);
  // Every parameter's values in ready order, whatever the layout (ZeRO-3
  // pads its units): read inside a FullParameters scope.
  const auto values = [&] {
    const auto full = step.full_parameters();
    std::vector<float> out;
    for (const ParameterStore::Slot& s : store.slots()) {
      const std::vector<float> v = s.parameter->value.to_vector<float>(stream);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };

  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  Run r;
  r.start = values();
  for (int s = 0; s < 6; ++s) {
    std::vector<float> x(16 * 24);
    std::vector<std::int64_t> y(16);
    for (float& v : x) v = normal(rng);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int64_t>(rng() % 5);
    const MicroBatch batch{core::Tensor::from_vector(x, {16, 24}, DType::f32, gpu, stream),
                           core::Tensor::from_vector(y, {16}, DType::i64, gpu, stream)};
    const std::vector<MicroBatch> batches(static_cast<std::size_t>(accumulation), batch);
    const std::int64_t copies = core::host_copies();
    const StepResult result = step.run(batches);
    r.host_copies.push_back(core::host_copies() - copies);
    REQUIRE(std::isfinite(result.loss));
    r.skipped += result.skipped ? 1 : 0;
  }
  r.parameters = values();
  if (zero_stage == 3)  // Note [parameter units]: only the shards between steps
    for (const ParameterStore::Slot& s : store.slots()) REQUIRE_FALSE(s.parameter->value.defined());
  r.loss_scale = scaler.scale();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the data-parallel step on a GPU: ZeRO-1 to ZeRO-3 give plain data parallelism's bits",
          "[gpu][step][zero]") {
  REQUIRE(test::gpu_world_of_one().device().is_cuda());
  for (const std::string optimizer : {"sgd", "adamw"})
    for (const std::optional<DType> autocast :
         {std::optional<DType>{}, std::optional(DType::f16)}) {
      INFO(optimizer << (autocast ? " f16" : " fp32"));
      const Run plain = train(optimizer, 0, autocast);
      // One wait for the device per step, with or without f16's scaler.
      CHECK(plain.host_copies == std::vector<std::int64_t>(6, 1));
      for (int stage : {1, 2, 3}) {  // ZeRO-3: gathers and prefetches on the NCCL stream
        INFO("ZeRO-" << stage);
        const Run zero = train(optimizer, stage, autocast);
        CHECK(same_bits(zero.parameters, plain.parameters));
        CHECK(zero.skipped == plain.skipped);
        CHECK(zero.loss_scale == plain.loss_scale);
        CHECK(zero.host_copies == std::vector<std::int64_t>(6, 1));
      }
      // The steps updated: the parameters moved from where they started.
      CHECK(plain.skipped < 6);
      CHECK_FALSE(same_bits(plain.parameters, plain.start));
    }
}

// Note [accumulation tolerance] (tests/mpi/test_zero.cpp) on one rank: ZeRO-2
// adds the second micro-batch's gradient to the shard, plain data
// parallelism in the weight GEMM (beta = 1): sums of the same two terms, one
// f32 rounding apart (2^-24 relative to gradients <= 1), which six SGD steps
// (lr 0.1, momentum's 10x) carry to at most 6 x 0.1 x 10 x 2 x 2^-24 ~ 7e-7;
// 1e-5 allows for AdamW's ratio, and a lost micro-batch moves >= 1e-3.
TEST_CASE("the data-parallel step on a GPU: ZeRO-2 and 3 with accumulation add every micro-batch",
          "[gpu][step][zero]") {
  REQUIRE(test::gpu_world_of_one().device().is_cuda());
  for (const std::string optimizer : {"sgd", "adamw"}) {
    INFO(optimizer);
    const Run plain = train(optimizer, 0, std::nullopt, 2);
    for (int stage : {2, 3}) {
      INFO("ZeRO-" << stage);
      const Run zero = train(optimizer, stage, std::nullopt, 2);
      REQUIRE(plain.parameters.size() == zero.parameters.size());
      double difference = 0.0;
      for (std::size_t i = 0; i < plain.parameters.size(); ++i)
        difference = std::max(
            difference, std::fabs(static_cast<double>(plain.parameters[i]) - zero.parameters[i]));
      CHECK(difference <= 1e-5);
    }
    CHECK_FALSE(same_bits(plain.parameters, plain.start));
  }
}
