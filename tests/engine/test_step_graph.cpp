// The CUDA graph step's host side (Note [step graph], Note [capture arena]):
// the arena's block placement, and StepOptions::cuda_graph refused with its
// reason where it cannot hold (a CPU model). The replay itself is checked
// against the eager step on a GPU (tests/engine/gpu/test_step_graph_gpu.cpp).
#include <catch2/catch.hpp>

#include "engine/core/capture_arena.h"
#include "engine/data_parallel_step.h"
#include "engine/models.h"
#include "engine/optim/sgd.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;
using core::detail::BlockList;

TEST_CASE("the arena's blocks are placed first-fit, 256-aligned, and merged when freed") {
  BlockList blocks(4096);
  const auto a = blocks.take(100), b = blocks.take(256), c = blocks.take(1000);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(*a == 0);
  CHECK(*b == 256);
  CHECK(*c == 512);
  CHECK(blocks.free_bytes() == 4096 - 256 - 256 - 1024);
  CHECK_FALSE(blocks.take(4096));  // no run is long enough
  blocks.give_back(*b, 256);
  CHECK(blocks.take(200) == std::optional<std::size_t>(256));  // first fit: the hole
  blocks.give_back(256, 200);
  blocks.give_back(*a, 100);
  blocks.give_back(*c, 1000);
  CHECK(blocks.free_bytes() == 4096);
  CHECK(blocks.take(4096) == std::optional<std::size_t>(0));  // merged into one run again
  blocks.give_back(0, 4096);
  CHECK_THROWS_WITH(blocks.give_back(0, 256), Catch::Contains("given back twice"));
  CHECK_THROWS_WITH(blocks.give_back(4000, 256), Catch::Contains("outside the region"));
}

TEST_CASE("StepOptions::cuda_graph on a CPU model is refused with its reason") {
  std::unique_ptr<Module> model = make_model("mlp");
  initialize(*model, 1);
  const core::Stream stream;
  ParameterStore store(*model, core::Device::cpu(), stream);
  SGD sgd(store, single_group(store, 0.1, 0.0), SgdOptions{}, stream);
  LossScaler scaler = LossScaler::for_autocast(std::nullopt);
  StepOptions o;
  o.cuda_graph = true;
  CHECK_THROWS_WITH(DataParallelStep(*model, store, sgd, make_scheduler("constant", {}), scaler,
                                     &test::world_of_one(), o, stream),
                    Catch::Contains("StepOptions::cuda_graph") &&
                        Catch::Contains("the model is on cpu") &&
                        Catch::Contains("CUDA graphs need a GPU"));
}
