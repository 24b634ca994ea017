// The per-step agreement across ranks: loss sums, sample counts and the
// caller's f64 sums add up,
// and a stop request raised by a signal on one rank reaches every rank at
// the same step.
#include <catch2/catch.hpp>

#include <csignal>

#include "comm/step_agreement.h"
#include "mpi/mpi_world.h"

using namespace lockstep;

TEST_CASE("every rank agrees on the step's loss, sample count, stop flag and sums", "[mpi][step]") {
  comm::Communicator& comm = test::mpi_world().host();
  const int size = comm.size();
  comm::clear_stop_request();
  comm::install_stop_handlers({SIGUSR2});
  double expected_loss = 0;
  std::int64_t expected_samples = 0;
  for (int r = 0; r < size; ++r) {
    expected_loss += 0.5 + r;
    expected_samples += 3 + r;
  }
  comm::StepAgreement agreement(comm, 2);
  for (int step = 0; step < 4; ++step) {
    // The last rank is signalled during step 2; nobody else is.
    if (step == 2 && comm.rank() == size - 1) std::raise(SIGUSR2);
    // f64 sums past FLT_MAX, added in rank order: exact for these values.
    double sums[] = {1e40 * (comm.rank() + 1), 0.25 * comm.rank()};
    const comm::StepTotals totals = agreement.agree(0.5 + comm.rank(), 3 + comm.rank(), sums);
    CHECK(sums[0] == 1e40 * size * (size + 1) / 2);
    CHECK(sums[1] == 0.25 * size * (size - 1) / 2);
    CHECK(totals.loss_sum == expected_loss);
    CHECK(totals.samples == expected_samples);
    CHECK(totals.stop == (step >= 2));
  }
  comm::clear_stop_request();
  std::signal(SIGUSR2, SIG_DFL);
}
