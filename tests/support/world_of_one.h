// The world of one that in-process tests train in: comm::init without
// mpiexec, on the CPU, made once per test binary and kept until it exits.
#pragma once

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

}  // namespace lockstep::test
