// The rank-invariant step (Note [rank-invariant step], engine/data_parallel_step.h)
// on a GPU over a one-rank NCCL world: it refuses to run without the
// deterministic kernels; with them, a CNN with BatchNorm over 4 chunks (the
// device ChunkTree, ChunkBuffers on the device, Note [chunk buffers]) trains
// to the same bits twice (cuDNN's deterministic algorithms, cuBLASLt without
// split-K reduction passes: Note [deterministic gemm]), and to the CPU's
// parameters and running statistics within tolerance. Several ranks' CUDA
// paths (NCCL alltoall and the ordered allreduce) are tests/comm/test_comm_gpu.cpp's.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "comm/world.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/linear.h"
#include "engine/nn/pooling.h"
#include "engine/optim/sgd.h"
#include "kernels/conv.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr int kChunks = 4;

std::unique_ptr<Sequential> cnn() {
  auto n = std::make_unique<Sequential>();
  n->emplace<Conv2d>("conv", 2, 8, 3, 1, 1, 1, 1, false);
  n->emplace<BatchNorm2d>("bn", 8);
  n->emplace<ReLU>("relu");
  n->emplace<Dropout>("drop", 0.25f);
  n->emplace<MaxPool2d>("pool", 2);
  n->emplace<Flatten>("flatten");
  n->emplace<Linear>("fc", 128, 4);
  n->set_input_grad(false);
  initialize(*n, 21);
  return n;
}

struct Run {
  std::vector<float> parameters, running;
  std::vector<std::int64_t> counts;
};

// Three steps of 4 chunks of 8 rows; `world` null: the CPU, no world.
Run train(comm::World* world, std::optional<DType> autocast) {
  const core::Device device = world ? world->device() : core::Device::cpu();
  core::Stream stream = world ? core::Stream::create(device) : core::Stream();
  auto model = cnn();
  ParameterStore store(*model, device, stream);
  SGD sgd(store, single_group(store, 0.1, 0.0), SgdOptions{.momentum = 0.9}, stream);
  LossScaler scaler(LossScalerOptions{.enabled = false});
  StepOptions o;
  o.rank_invariant = true;
  o.accumulation = kChunks;
  o.autocast = autocast;
  o.max_grad_norm = 0.5;
  o.seed = 9;
  DataParallelStep step(*model, store, sgd, make_scheduler("constant", {}), scaler, world, o,
                        stream);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int s = 0; s < 3; ++s) {
    std::vector<MicroBatch> chunks;
    for (int j = 0; j < kChunks; ++j) {
      std::vector<float> x(8 * 2 * 8 * 8);
      std::vector<std::int64_t> y(8);
      for (float& v : x) v = 0.5f * static_cast<float>(j) + normal(rng);
      for (auto& label : y) label = static_cast<std::int64_t>(rng() % 4);
      chunks.push_back({core::Tensor::from_vector(x, {8, 2, 8, 8}, DType::f32, device, stream),
                        core::Tensor::from_vector(y, {8}, DType::i64, device, stream)});
    }
    REQUIRE_FALSE(step.run(chunks).skipped);
  }
  Run r;
  r.parameters = store.values().to_vector<float>(stream);
  for (Buffer* b : model->buffers()) {
    if (b->value.dtype() == DType::f32) {
      const std::vector<float> v = b->value.to_vector<float>(stream);
      r.running.insert(r.running.end(), v.begin(), v.end());
    } else {
      r.counts.push_back(b->value.to_vector<std::int64_t>(stream).front());
    }
  }
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the rank-invariant step on a GPU refuses to run without the deterministic kernels",
          "[gpu][step][invariant]") {
  comm::World& world = test::gpu_world_of_one();
  REQUIRE(world.device().is_cuda());
  kernels::set_deterministic(false);
  CHECK_THROWS_WITH(train(&world, std::nullopt),
                    Catch::Contains("needs the deterministic kernels") &&
                        Catch::Contains("kernels::set_deterministic(true)"));
}

TEST_CASE("the rank-invariant step on a GPU repeats its bits and follows the CPU, BatchNorm too",
          "[gpu][step][invariant]") {
  comm::World& world = test::gpu_world_of_one();
  REQUIRE(world.device().is_cuda());
  kernels::set_deterministic(true);
  for (const std::optional<DType> autocast : {std::optional<DType>{}, std::optional(DType::bf16)}) {
    INFO((autocast ? "bf16" : "fp32"));
    const Run first = train(&world, autocast), second = train(&world, autocast);
    CHECK(same_bits(first.parameters, second.parameters));
    CHECK(same_bits(first.running, second.running));
    // One update of the running statistics a step (Note [chunk buffers]).
    CHECK(first.counts == std::vector<std::int64_t>{3});
    const Run cpu = train(nullptr, autocast);
    // Other kernels (cuDNN against im2col + OpenBLAS, bf16 rounding of other
    // sums) after 3 SGD steps of lr 0.1 with clipping to 0.5: the parameters
    // move by at most 0.15 in all, and differ by rounding of the gradients
    // (1e-3, 3e-3 in bf16); the running statistics (means over 512 values
    // of O(1) inputs) within 1e-3.
    REQUIRE(cpu.parameters.size() == first.parameters.size());
    for (std::size_t i = 0; i < cpu.parameters.size(); ++i)
      CHECK(first.parameters[i] == Approx(cpu.parameters[i]).margin(autocast ? 3e-3 : 1e-3));
    REQUIRE(cpu.running.size() == first.running.size());
    for (std::size_t i = 0; i < cpu.running.size(); ++i)
      CHECK(first.running[i] == Approx(cpu.running[i]).margin(1e-3));
  }
  kernels::set_deterministic(false);
}
