// Main of the multi-rank test binary, run by ctest under mpiexec with 1, 2
// and 3 ranks. It starts the World (CPU only: several ranks may share one
// machine's GPU, which NCCL refuses), runs the Catch2 cases, and exits
// non-zero on every rank when a case failed on any rank.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "mpi/mpi_world.h"

namespace {
lockstep::comm::World* g_world = nullptr;
}

lockstep::comm::World& lockstep::test::mpi_world() { return *g_world; }

int main(int argc, char** argv) {
  auto world = lockstep::comm::init(argc, argv, {.use_gpu = false});
  if (!world->uses_mpi())
    std::fprintf(stderr, "note: not started by mpiexec; running as a world of one\n");
  g_world = world.get();
  const int failed = Catch::Session().run(argc, argv);
  float any_failed = failed ? 1.0f : 0.0f;
  world->host().allreduce(&any_failed, 1, lockstep::DType::f32, lockstep::comm::ReduceOp::sum);
  g_world = nullptr;
  world->shutdown();
  return any_failed > 0 ? 1 : 0;
}
