// The Trainer fed by an in-memory TensorDataset on N ranks (micro-batch B, K
// accumulation micro-batches) against one process taking the whole global
// batch of K*N*B rows through a DataParallelStep of its own (no world, no
// communication): the same losses and parameters after several steps, with
// dropout, under mpiexec with 1, 2 and 3 ranks, for cross-entropy on class
// indices, for the elementwise losses on float targets, and for a two-head
// model (tests/support/two_heads.h) on cross-entropy plus MSE over a named
// second target (Note [loss of several terms]), also with ZeRO-1.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "comm/world.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/sgd.h"
#include "engine/trainer.h"
#include "io/tensor_dataset.h"
#include "kernels/gemm.h"
#include "mpi/mpi_world.h"
#include "support/two_heads.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr std::int64_t kSamples = 144;  // a multiple of K*N*B for K = 1, 2, N = 1, 2, 3, B = 4

// Cross-entropy's targets are 4 classes; the elementwise losses' are 4 floats
// per row ({0, 1} for binary cross-entropy), functions of the inputs.
io::TensorDataset task(const std::string& loss, std::int64_t micro_batch, int world_size,
                       int rank) {
  // "two-heads": class targets and a named "value" target of one float a row.
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  std::vector<float> x(kSamples * 5), t(kSamples * 4);
  std::vector<std::int64_t> y(kSamples);
  for (float& v : x) v = normal(rng);
  for (std::int64_t i = 0; i < kSamples; ++i) {
    y[i] = (x[i * 5] > 0) + 2 * (x[i * 5 + 3] > 0);
    for (std::int64_t j = 0; j < 4; ++j) {
      const float v = x[i * 5 + j] * x[i * 5 + j + 1];
      t[i * 4 + j] = loss == "bce" ? (v > 0 ? 1.0f : 0.0f) : v;
    }
  }
  io::TensorDatasetOptions o;
  o.sampler = {.micro_batch = micro_batch,
               .world_size = world_size,
               .rank = rank,
               .shuffle = true,
               .seed = 12};
  std::vector<float> value(kSamples);
  for (std::int64_t i = 0; i < kSamples; ++i) value[i] = t[i * 4 + 1];
  core::NamedTensors named;
  if (loss == "two-heads")
    named.set("value", core::Tensor::from_vector(value, {kSamples, 1}, DType::f32));
  return io::TensorDataset(core::Tensor::from_vector(x, {kSamples, 5}, DType::f32),
                           loss == "cross-entropy" || loss == "two-heads"
                               ? core::Tensor::from_vector(y, {kSamples}, DType::i64)
                               : core::Tensor::from_vector(t, {kSamples, 4}, DType::f32),
                           std::move(named), o);
}

// A model, its store and optimizer, built alike on every call: a chain with
// dropout, or for "two-heads" the two-head model.
struct Replica {
  std::unique_ptr<Module> model;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<SGD> sgd;
  LossScaler scaler{LossScalerOptions{.enabled = false}};

  explicit Replica(const std::string& loss) {
    if (loss == "two-heads") {
      model = std::make_unique<test::TwoHeads>(5, 12, 4);
    } else {
      auto chain = std::make_unique<Sequential>();
      chain->emplace<Linear>("fc1", 5, 12);
      chain->emplace<GELU>("act");
      chain->emplace<Dropout>("drop", 0.2f);
      chain->emplace<Linear>("fc2", 12, 4);
      model = std::move(chain);
    }
    model->set_input_grad(false);
    initialize(*model, 31);
    store = std::make_unique<ParameterStore>(*model, core::Device::cpu());
    sgd =
        std::make_unique<SGD>(*store, single_group(*store, 0.2, 0.0), SgdOptions{.momentum = 0.9});
  }
};

StepOptions options(const std::string& loss, int accumulation) {
  StepOptions o;
  if (loss == "two-heads")
    o.loss = std::make_shared<WeightedLosses>(std::vector<WeightedLosses::Term>{
        {std::make_shared<CrossEntropyLoss>(), "logits", "targets", 1.0f},
        {std::make_shared<MSELoss>(), "value", "value", 0.5f}});
  else
    o.loss = make_loss(loss);
  o.accumulation = accumulation;
  o.seed = 3;
  o.max_grad_norm = 1.0;  // clipping uses the global norm: it must match too
  return o;
}

}  // namespace

TEST_CASE("the Trainer on an in-memory source at N ranks equals one process with the global batch",
          "[mpi][equivalence][sources]") {
  comm::World& world = test::mpi_world();
  const std::int64_t b = 4;
  constexpr int kSteps = 5;
  // "two-heads zero-1": the two-head model with ZeRO-1 on the ranks' side.
  for (const std::string run :
       {"cross-entropy", "mse", "l1", "huber", "bce", "two-heads", "two-heads zero-1"})
    for (int k : {1, 2}) {
      INFO(world.size() << " ranks, K " << k << ", " << run);
      const bool zero1 = run.ends_with(" zero-1");
      const std::string loss = zero1 ? run.substr(0, run.size() - 7) : run;
      Replica ranks(loss);
      StepOptions sharded = options(loss, k);
      sharded.sync.zero_stage = zero1 ? 1 : 0;
      Trainer trainer(*ranks.model, *ranks.store, *ranks.sgd, make_scheduler("constant", {}),
                      ranks.scaler, world, sharded, core::Stream());
      io::TensorDataset shard = task(loss, b, world.size(), world.rank());
      shard.start_epoch(0);

      Replica one(loss);
      DataParallelStep alone(*one.model, *one.store, *one.sgd, make_scheduler("constant", {}),
                             one.scaler, nullptr, options(loss, 1), core::Stream());
      io::TensorDataset whole = task(loss, k * world.size() * b, 1, 0);
      whole.start_epoch(0);

      for (int step = 0; step < kSteps; ++step) {
        const std::optional<StepResult> ours = trainer.step(shard);
        const std::optional<io::Batch> batch = whole.next();
        REQUIRE(ours);
        REQUIRE(batch);
        const MicroBatch rows{batch->inputs, batch->labels, batch->named};
        const StepResult reference = alone.run({&rows, 1});
        CHECK(ours->samples == reference.samples);
        // The same sums in another order (per-rank partial sums, then the
        // allreduce, against one pass over all rows): a few f32 roundings of
        // terms of O(1), so 1e-5 relative in the loss and the norm.
        CHECK(ours->loss == Approx(reference.loss).epsilon(1e-5));
        CHECK(ours->grad_norm == Approx(reference.grad_norm).epsilon(1e-5));
      }
      const auto p = ranks.store->values().to_vector<float>();
      const auto q = one.store->values().to_vector<float>();
      REQUIRE(p.size() == q.size());
      // As in test_equivalence.cpp: f32 rounding of sums in another order,
      // amplified a little by five steps of momentum: 2e-5 on weights of O(0.1..1).
      for (std::size_t i = 0; i < p.size(); ++i) REQUIRE(std::fabs(p[i] - q[i]) <= 2e-5);
    }
}

TEST_CASE(
    "the step decides host overlap as comm::host_overlap_pays says unless told, and asks no "
    "input gradient",
    "[mpi][step]") {
  comm::World& world = test::mpi_world();
  auto build = [&](std::optional<bool> overlap) {
    auto net = std::make_unique<Sequential>();
    net->emplace<Linear>("fc", 4, 2);
    initialize(*net, 3);
    auto store = std::make_unique<ParameterStore>(*net, core::Device::cpu());
    auto sgd = std::make_unique<SGD>(*store, single_group(*store, 0.1, 0.0));
    LossScaler scaler(LossScalerOptions{.enabled = false});
    StepOptions o;
    o.sync.host_overlap = overlap;
    DataParallelStep step(*net, *store, *sgd, make_scheduler("constant", {}), scaler, &world, o,
                          core::Stream());
    CHECK_FALSE(net->input_grad());  // the step's inputs are data
    return step.options().sync.host_overlap;
  };
  // Unset: the library's decision, the same for every program (a world of
  // one has nothing to overlap).
  const bool expected =
      world.size() > 1 && comm::host_overlap_pays(world, kernels::cpu::gemm_threads());
  CHECK(build(std::nullopt) == std::optional<bool>(expected));
  if (world.size() > 1) {
    CHECK(build(true) == std::optional<bool>(true));  // the caller's choice stands
    CHECK(build(false) == std::optional<bool>(false));
  }
}
