// The worlds of one that in-process tests train in: comm::init without
// mpiexec, on the CPU, or on cuda:0 with a one-rank NCCL communicator for the
// [gpu] tests; each made once per test binary and kept until it exits.
#pragma once

#include <cstdlib>
#include <memory>

#include "comm/world.h"

namespace lockstep::test {

inline comm::World& world_of_one() {
  static std::unique_ptr<comm::World> w = [] {
    int argc = 1;
    char name[] = "test";
    char* args[] = {name, nullptr};
    char** argv = args;
    return comm::init(argc, argv, {.use_gpu = false});
  }();
  return *w;
}

// Launched directly even under a test runner that was started by a launcher:
// the launcher's variables are cleared, so comm::init makes no MPI call.
inline comm::World& gpu_world_of_one() {
  static std::unique_ptr<comm::World> w = [] {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
      unsetenv(name);
    int argc = 0;
    char** argv = nullptr;
    return comm::init(argc, argv);
  }();
  return *w;
}

}  // namespace lockstep::test
