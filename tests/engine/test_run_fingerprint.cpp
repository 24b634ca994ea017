// RunCheckpoints' own resume check (Note [run fingerprint]), in a world of
// one on the CPU: a checkpoint of global batch 128 resumed with 64 rows per
// step, or with the rank-invariant mode switched on, is refused naming the
// field; resumed as 2 accumulated micro-batches of 64 it continues from the
// saved weights. A checkpoint made before the record (no fingerprint_version)
// is compared only on the fields lockstep-train wrote then.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/checkpoint_file.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/sgd.h"
#include "engine/run_checkpoints.h"
#include "engine/trainer.h"
#include "io/tensor_dataset.h"
#include "support/world_of_one.h"
#include "temp_dir.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr std::int64_t kSamples = 512;

// 512 rows of 8 features and labels in [0, 4): only the shapes matter here.
io::TensorDataset rows(std::int64_t micro_batch) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(kSamples * 8);
  std::vector<std::int64_t> y(kSamples);
  for (float& v : x) v = normal(rng);
  for (std::int64_t i = 0; i < kSamples; ++i) y[i] = i % 4;
  io::TensorDatasetOptions o;
  o.sampler = {.micro_batch = micro_batch, .world_size = 1, .rank = 0, .shuffle = true, .seed = 5};
  o.num_classes = 4;
  return io::TensorDataset(core::Tensor::from_vector(x, {kSamples, 8}, DType::f32),
                           core::Tensor::from_vector(y, {kSamples}, DType::i64), o);
}

// One run: a linear model trained by SGD through the Trainer, fed
// `micro_batch` rows at a time, `accumulation` of them per step (one batch of
// K x B rows with rank_invariant: Note [rank-invariant batches]).
struct Run {
  Sequential model;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<SGD> optimizer;
  LossScaler scaler = LossScaler::for_autocast(std::nullopt);
  std::unique_ptr<Trainer> trainer;
  io::TensorDataset data;

  Run(std::int64_t micro_batch, int accumulation, bool rank_invariant) : data(rows(micro_batch)) {
    model.emplace<Linear>("fc", 8, 4);
    model.set_input_grad(false);
    initialize(model, 11);
    store = std::make_unique<ParameterStore>(model, core::Device::cpu());
    optimizer = std::make_unique<SGD>(*store, single_group(*store, 0.1, 0.0), SgdOptions{});
    StepOptions o;
    o.accumulation = accumulation;
    o.rank_invariant = rank_invariant;
    trainer = std::make_unique<Trainer>(model, *store, *optimizer, make_scheduler("constant", {}),
                                        scaler, test::world_of_one(), o, core::Stream());
  }
  RunPosition restore(RunCheckpoints& checkpoints) {
    return checkpoints.restore(model, *optimizer, trainer->data_parallel_step(), scaler, data, {});
  }
};

// Options of a run into `dir` (assigned: a designated initializer that
// leaves members out is a -Wmissing-field-initializers warning).
RunCheckpointOptions into(const std::filesystem::path& dir, RunCheckpointOptions::Start start) {
  RunCheckpointOptions options;
  options.directory = dir;
  options.start = start;
  return options;
}
RunCheckpointOptions resume_from(const std::filesystem::path& dir) {
  return into(dir, RunCheckpointOptions::Start::latest);
}

// Saves step 1 of a run of 1 rank x 128 rows into `dir`; returns its weights.
std::vector<float> save_one_step(const std::filesystem::path& dir) {
  Run run(128, 1, false);
  RunCheckpoints checkpoints(test::world_of_one(), into(dir, RunCheckpointOptions::Start::fresh));
  run.data.start_epoch(0);
  REQUIRE(run.trainer->step(run.data));
  REQUIRE(!checkpoints
               .save(run.model, *run.optimizer, run.trainer->data_parallel_step(), run.scaler,
                     run.data, {})
               .empty());
  return run.store->values().to_vector<float>();
}

}  // namespace

TEST_CASE("a resume that changes the global batch or the rank-invariant mode is refused by name",
          "[engine][checkpoint]") {
  test::TempDir dir;
  const std::vector<float> saved = save_one_step(dir.path());
  {
    Run half(64, 1, false);  // 1 rank x 64 rows: global batch 64
    RunCheckpoints checkpoints(test::world_of_one(), resume_from(dir.path()));
    CHECK_THROWS_WITH(half.restore(checkpoints),
                      Catch::Contains("global_batch was '128' and is now '64'") &&
                          Catch::Contains("SamplerOptions::micro_batch x ranks x "
                                          "StepOptions::accumulation"));
  }
  {
    Run invariant(128, 2, true);  // 2 chunks of 64 in one batch of 128: global batch 128
    RunCheckpoints checkpoints(test::world_of_one(), resume_from(dir.path()));
    CHECK_THROWS_WITH(invariant.restore(checkpoints),
                      Catch::Contains("rank_invariant was 'off' and is now 'on'") &&
                          Catch::Contains("StepOptions::rank_invariant"));
  }
  {
    // A program's own words for what sets a field replace the option's.
    Run half(64, 1, false);
    RunCheckpointOptions options = resume_from(dir.path());
    options.set_by = {{"global_batch", "--batch-size x ranks x --accum"}};
    RunCheckpoints checkpoints(test::world_of_one(), options);
    CHECK_THROWS_WITH(half.restore(checkpoints), Catch::Contains("(set by --batch-size x ranks"));
  }
  // 1 rank x accumulation 2 x 64 rows: the same global batch resumes, with
  // the weights the first run saved and the data where it stopped.
  Run accumulated(64, 2, false);
  RunCheckpoints checkpoints(test::world_of_one(), resume_from(dir.path()));
  const RunPosition at = accumulated.restore(checkpoints);
  CHECK(at.step == 1);
  CHECK(at.data.position == 128);
  CHECK(accumulated.store->values().to_vector<float>() == saved);
  accumulated.data.start_epoch(at.data.epoch, at.data.position);
  CHECK(accumulated.trainer->step(accumulated.data));
}

TEST_CASE("a program's config may not hold a field that RunCheckpoints records itself",
          "[engine][checkpoint]") {
  RunCheckpointOptions options;
  options.config = {{"run", "mine"}, {"global_batch", "128"}};
  CHECK_THROWS_WITH(
      RunCheckpoints(test::world_of_one(), options),
      Catch::Contains("config has a field 'global_batch' ('128'), which RunCheckpoints records"));
}

TEST_CASE("a checkpoint without the run record is compared on the fields lockstep-train wrote",
          "[engine][checkpoint]") {
  test::TempDir dir;
  {
    // As lockstep-train 0.1 wrote it: its own words for global_batch and the
    // loss, and no fingerprint_version.
    Run run(128, 1, false);
    TrainingState state;
    state.step = 1;
    state.global_batch = 128;
    state.config = {{"global_batch", "128"}, {"loss", "cross-entropy label_smoothing=0"}};
    const CheckpointContents contents = capture_checkpoint(run.model, *run.optimizer, state, {});
    CheckpointDirectory(dir.path(), 3, CheckpointStart::fresh, CheckpointLock::hold)
        .save(1, contents);
  }
  {
    Run half(64, 1, false);
    RunCheckpoints checkpoints(test::world_of_one(), resume_from(dir.path()));
    CHECK_THROWS_WITH(half.restore(checkpoints),
                      Catch::Contains("global_batch was '128' and is now '64'"));
  }
  // The loss in 0.1's words is not compared; nothing else is recorded.
  Run same(128, 2, true);
  RunCheckpoints checkpoints(test::world_of_one(), resume_from(dir.path()));
  CHECK(same.restore(checkpoints).step == 1);
}
