// StepReadback and Note [one read per step]: the slots come back in one copy,
// and a data-parallel step, in every mode that reads the device (f16's
// scaler, clipping, ZeRO-1 and ZeRO-2, accumulation, the rank-invariant
// tree), copies to the host exactly once. On the CPU the copy is a memcpy; the count is the
// same code path a GPU step takes, where each copy would wait for the stream.
#include <catch2/catch.hpp>
#include <optional>
#include <vector>

#include "engine/data_parallel_step.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/step_readback.h"
#include "support/gradcheck.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

TEST_CASE("the step readback's slots come back in one copy, each as written",
          "[engine][readback]") {
  StepReadback readback(3, 2, core::Device::cpu(), {});
  readback.clear({});
  readback.loss_total().fill_(2.5);
  readback.rows_total().fill_(7.0);
  readback.nonfinite().fill_(1.0);
  auto* sums = reinterpret_cast<double*>(readback.sum_squares().data_as<std::int64_t>());
  sums[0] = 0.25, sums[1] = 1e300, sums[2] = 3.0;  // f64s the f32 slots could not hold
  readback.chunk_losses().fill_(-4.0);
  const std::int64_t before = core::host_copies();
  const StepReadback::Values& v = readback.read({});
  CHECK(core::host_copies() == before + 1);
  CHECK(v.loss_total == 2.5);
  CHECK(v.rows_total == 7);
  CHECK(v.nonfinite);
  CHECK(v.sum_squares == std::vector<double>{0.25, 1e300, 3.0});
  CHECK(v.chunk_losses == std::vector<float>{-4.0f, -4.0f});
  readback.clear({});
  const StepReadback::Values& cleared = readback.read({});
  CHECK(cleared.loss_total == 0.0);
  CHECK(cleared.rows_total == 0);
  CHECK_FALSE(cleared.nonfinite);
  CHECK(cleared.sum_squares == std::vector<double>{0.0, 0.0, 0.0});
  CHECK(cleared.chunk_losses == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE("a byte view refuses a misaligned or overlong view", "[engine][readback]") {
  const core::Tensor bytes = core::Tensor::zeros({16}, DType::u8);
  CHECK(bytes.view_bytes(8, {1}, DType::i64).numel() == 1);
  CHECK_THROWS_WITH(bytes.view_bytes(4, {1}, DType::i64),
                    Catch::Contains("view of i64 [1] at byte 4 does not fit, aligned"));
  CHECK_THROWS_WITH(bytes.view_bytes(8, {3}, DType::f32), Catch::Contains("tensor of 16 bytes"));
}

namespace {

struct Mode {
  const char* name;
  std::optional<DType> autocast = std::nullopt;
  double max_grad_norm = 0.0;
  int zero_stage = 0;
  int accumulation = 1;
  bool rank_invariant = false;
};

}  // namespace

TEST_CASE("a data-parallel step reads the device's values once, in every mode",
          "[engine][readback]") {
  const std::int64_t rows = 8;
  const core::Tensor x = test::random_f32({rows, 6}, 3);
  std::vector<std::int64_t> labels(rows);
  for (std::int64_t i = 0; i < rows; ++i) labels[static_cast<std::size_t>(i)] = i % 4;
  const MicroBatch batch{x, core::Tensor::from_vector(labels, {rows}, DType::i64)};
  const Mode modes[] = {
      {.name = "fp32"},
      {.name = "fp32, clipping", .max_grad_norm = 0.5},
      {.name = "f16 autocast, clipping", .autocast = DType::f16, .max_grad_norm = 0.5},
      {.name = "bf16 autocast, ZeRO-1, clipping",
       .autocast = DType::bf16,
       .max_grad_norm = 0.5,
       .zero_stage = 1},
      {.name = "f16 autocast, ZeRO-1", .autocast = DType::f16, .zero_stage = 1},
      {.name = "f16 autocast, ZeRO-2, clipping",
       .autocast = DType::f16,
       .max_grad_norm = 0.5,
       .zero_stage = 2},
      {.name = "ZeRO-2, accumulation 2", .max_grad_norm = 0.5, .zero_stage = 2, .accumulation = 2},
      {.name = "accumulation 3", .max_grad_norm = 0.5, .accumulation = 3},
      {.name = "rank-invariant, accumulation 2",
       .max_grad_norm = 0.5,
       .accumulation = 2,
       .rank_invariant = true}};
  for (const Mode& mode : modes) {
    INFO(mode.name);
    Sequential model;
    model.emplace<Linear>("fc1", 6, 16);
    model.emplace<ReLU>("relu");
    model.emplace<Linear>("fc2", 16, 4);
    model.set_input_grad(false);
    initialize(model, 5);
    ParameterStore store(model, core::Device::cpu());
    AdamW adamw(store, single_group(store, 0.01, 0.01));
    LossScaler scaler = LossScaler::for_autocast(mode.autocast);
    StepOptions o;
    o.autocast = mode.autocast;
    o.max_grad_norm = mode.max_grad_norm;
    o.sync.zero_stage = mode.zero_stage;
    o.accumulation = mode.accumulation;
    o.rank_invariant = mode.rank_invariant;
    DataParallelStep step(model, store, adamw, make_scheduler("constant", {}), scaler,
                          &test::world_of_one(), o, {});
    const std::vector<MicroBatch> batches(static_cast<std::size_t>(mode.accumulation), batch);
    for (int s = 0; s < 3; ++s) {
      const std::int64_t before = core::host_copies();
      const StepResult r = step.run(batches);
      CHECK(core::host_copies() == before + 1);
      CHECK_FALSE(r.skipped);
      CHECK(r.samples == rows * mode.accumulation);
    }
  }
}
