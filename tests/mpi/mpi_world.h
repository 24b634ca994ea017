// The World every multi-rank test case shares: tests/mpi/main.cpp starts it
// under mpiexec before Catch runs the cases (in the same order on every rank,
// so that their collectives match) and shuts it down afterwards.
#pragma once

#include "comm/world.h"

namespace lockstep::test {

comm::World& mpi_world();

}  // namespace lockstep::test
