// Non-finite values across ranks (Note [non-finite steps], engine/data_parallel_step.h):
// a NaN in one rank's share of a global batch makes every rank skip that
// step, so the replicas stay identical, and a stop after too many skips
// happens on every rank at the same step with the same message.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <limits>

#include "comm/agreement.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/sgd.h"
#include "engine/trainer.h"
#include "io/loader.h"
#include "io/shard_writer.h"
#include "mpi/mpi_world.h"

using namespace lockstep;
using namespace lockstep::engine;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kBatch = 4;  // rows per rank per step

// Rows in order (no shuffling); one row of step 2's global batch, in one
// rank's share only, has a NaN input. Each rank writes its own copy.
fs::path write_task(int world_size) {
  comm::Communicator& comm = test::mpi_world().host();
  const fs::path dir =
      fs::temp_directory_path() /
      ("lockstep-nonfinite-" + comm::broadcast_text(comm, std::to_string(::getpid()), 0) + "-" +
       std::to_string(comm.rank()));
  fs::remove_all(dir);
  const std::int64_t rows = 4 * kBatch * world_size;
  io::DatasetWriter writer(dir, {DType::f32, {3}, DType::i64}, rows, 1);
  std::vector<float> x(rows * 3);
  std::vector<std::int64_t> y(rows);
  for (std::int64_t i = 0; i < rows; ++i) {
    for (int j = 0; j < 3; ++j) x[i * 3 + j] = std::sin(static_cast<float>(i * 3 + j));
    y[i] = i % 2;
  }
  x[(kBatch * world_size + kBatch * (world_size - 1)) * 3 + 1] =
      std::numeric_limits<float>::quiet_NaN();
  writer.append(x.data(), y.data(), rows);
  writer.close();
  return dir;
}

struct Replica {
  std::unique_ptr<Sequential> model = std::make_unique<Sequential>();
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<SGD> sgd;
  LossScaler scaler;
  std::unique_ptr<Trainer> trainer;

  Replica(std::optional<DType> autocast, int max_consecutive_skips, int zero_stage = 0)
      : scaler(LossScaler::for_autocast(autocast)) {
    model->emplace<Linear>("fc1", 3, 8);
    model->emplace<ReLU>("relu");
    model->emplace<Linear>("fc2", 8, 2);
    model->set_input_grad(false);
    initialize(*model, 5);
    store = std::make_unique<ParameterStore>(*model, core::Device::cpu());
    sgd = std::make_unique<SGD>(*store, single_group(*store, 0.1, 0.0));
    StepOptions o;
    o.autocast = autocast;
    o.max_consecutive_skips = max_consecutive_skips;
    o.sync.zero_stage = zero_stage;
    ScheduleOptions s;
    s.total_steps = 4;
    trainer = std::make_unique<Trainer>(*model, *store, *sgd, make_scheduler("constant", s), scaler,
                                        test::mpi_world(), o, core::Stream());
  }
};

io::LoaderOptions in_order() {
  const comm::World& world = test::mpi_world();
  io::LoaderOptions o;
  o.sampler = {.micro_batch = kBatch,
               .world_size = world.size(),
               .rank = world.rank(),
               .shuffle = false,
               .seed = 0};
  o.threads = 1;
  return o;
}

}  // namespace

TEST_CASE("a NaN on one rank skips the step on every rank, in fp32, bf16 and f16",
          "[mpi][nonfinite]") {
  comm::Communicator& comm = test::mpi_world().host();
  const fs::path data = write_task(comm.size());
  for (std::optional<DType> autocast :
       {std::optional<DType>{}, std::optional{DType::bf16}, std::optional{DType::f16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    Replica replica(autocast, 20);
    io::DataLoader loader(io::Dataset::open(data), in_order());
    loader.start_epoch(0);
    for (int step = 1; step <= 4; ++step) {
      const std::optional<StepResult> r = replica.trainer->step(loader);
      REQUIRE(r);
      CHECK(r->skipped == (step == 2));
      // fc1's weight gradient is NaN on every rank after the allreduce (the
      // ReLU after fc1 sends the NaN activation to 0, so the loss stays finite).
      CHECK(std::isfinite(r->grad_norm) == (step != 2));
      CHECK(std::isfinite(r->loss));
    }
    CHECK(replica.sgd->steps() == 3);
    // Every replica holds rank 0's parameters, bit for bit.
    const std::vector<float> mine = replica.store->values().to_vector<float>();
    core::Tensor theirs =
        core::Tensor::from_vector(mine, {static_cast<std::int64_t>(mine.size())}, DType::f32);
    comm.broadcast(theirs, 0);
    CHECK(theirs.to_vector<float>() == mine);
  }
  comm.barrier();
  fs::remove_all(data);
}

TEST_CASE("too many skips stop every rank at the same step with the same message",
          "[mpi][nonfinite]") {
  comm::Communicator& comm = test::mpi_world().host();
  const fs::path data = write_task(comm.size());
  // Under ZeRO-1 and ZeRO-2 every rank's shard is gathered to name the parameter.
  for (int zero_stage : {0, 1, 2}) {
    INFO("zero stage " << zero_stage);
    Replica replica(std::nullopt, 1, zero_stage);
    io::DataLoader loader(io::Dataset::open(data), in_order());
    loader.start_epoch(0);
    REQUIRE(replica.trainer->step(loader));
    std::string message;
    try {
      replica.trainer->step(loader);
    } catch (const NumericalError& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::StartsWith("step 2: 1 steps in a row were skipped"));
    // The NaN input row reaches fc1's weight gradient only (Note above).
    CHECK_THAT(message, Catch::Contains("gradient is not finite is 'fc1.weight'"));
    CHECK(comm::broadcast_text(comm, message, 0) == message);
  }
  comm.barrier();
  fs::remove_all(data);
}
