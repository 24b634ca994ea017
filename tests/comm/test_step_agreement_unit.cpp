// The step agreement on one rank (the totals and sums are the rank's own) and
// the stop flag, set by request_stop or by a real signal through the
// installed handler. The multi-rank agreement is in tests/mpi.
#include <catch2/catch.hpp>

#include <csignal>

#include "comm/self_communicator.h"
#include "comm/step_agreement.h"
#include "kernels/error.h"

using namespace lockstep;

TEST_CASE("one rank's step totals are its own, and a stop request travels with them",
          "[comm][step]") {
  comm::SelfCommunicator self;
  comm::clear_stop_request();
  comm::StepTotals totals = comm::agree_on_step(self, 12.5, 5);
  CHECK(totals.loss_sum == 12.5);
  CHECK(totals.samples == 5);
  CHECK(totals.mean_loss() == 2.5);
  CHECK_FALSE(totals.stop);
  comm::request_stop();
  CHECK(comm::agree_on_step(self, 1.0, 1).stop);
  comm::clear_stop_request();
  CHECK_FALSE(comm::stop_requested());
  CHECK(comm::StepTotals{}.mean_loss() == 0.0);
}

TEST_CASE("an installed signal requests a stop instead of ending the process", "[comm][step]") {
  comm::clear_stop_request();
  comm::install_stop_handlers({SIGUSR2});
  std::raise(SIGUSR2);
  CHECK(comm::stop_requested());
  comm::clear_stop_request();
  std::signal(SIGUSR2, SIG_DFL);
  CHECK_THROWS_WITH(comm::install_stop_handlers({SIGKILL}), Catch::Contains("signal 9"));
}

TEST_CASE("counts are exact past 2^24, sums travel in f64, and bad counts are refused",
          "[comm][step]") {
  comm::SelfCommunicator self;
  const std::int64_t big = (std::int64_t{1} << 40) + 1;  // no f32 (nor its sum) holds it
  CHECK(comm::agree_on_step(self, 0.0, big).samples == big);
  // A sum of squares past FLT_MAX, and one just above 1 that f32 would round.
  double sums[] = {1e40, 1.0 + 1e-12};
  comm::agree_on_step(self, 0.0, 1, sums);
  CHECK(sums[0] == 1e40);
  CHECK(sums[1] == 1.0 + 1e-12);
  CHECK_THROWS_WITH(comm::agree_on_step(self, 0.0, -1),
                    Catch::Contains("agree_on_step: -1 samples on one rank"));
}
