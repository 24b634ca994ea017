// The step agreement on one rank (the totals and sums are the rank's own) and
// the stop flag, set by request_stop or by a real signal through the
// installed handler, and the agreement's allocation-free steps. The
// multi-rank agreement is in tests/mpi.
#include <catch2/catch.hpp>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <new>

#include "comm/self_communicator.h"
#include "comm/step_agreement.h"
#include "engine/core/memory.h"
#include "kernels/error.h"

using namespace lockstep;

// Every allocation of this test binary counts (operator new[] and the nothrow
// forms call this one), for Note [agreement without allocation]. Not under
// AddressSanitizer, whose own operator new must stay (CI's sanitizer stage
// checks the tensor counter only; its first stage counts the heap too).
#if defined(__SANITIZE_ADDRESS__)
#define LOCKSTEP_COUNT_HEAP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOCKSTEP_COUNT_HEAP 0
#endif
#endif
#ifndef LOCKSTEP_COUNT_HEAP
#define LOCKSTEP_COUNT_HEAP 1
#endif

namespace {
std::atomic<std::size_t> g_heap_allocations{0};
}  // namespace

#if LOCKSTEP_COUNT_HEAP
void* operator new(std::size_t bytes) {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

TEST_CASE("one rank's step totals are its own, and a stop request travels with them",
          "[comm][step]") {
  comm::SelfCommunicator self;
  comm::StepAgreement agreement(self);
  comm::clear_stop_request();
  comm::StepTotals totals = agreement.agree(12.5, 5);
  CHECK(totals.loss_sum == 12.5);
  CHECK(totals.samples == 5);
  CHECK(totals.mean_loss() == 2.5);
  CHECK_FALSE(totals.stop);
  comm::request_stop();
  CHECK(agreement.agree(1.0, 1).stop);
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

TEST_CASE("counts are exact past 2^24, sums travel in f64, and bad arguments are refused",
          "[comm][step]") {
  comm::SelfCommunicator self;
  comm::StepAgreement plain(self), with_sums(self, 2);
  const std::int64_t big = (std::int64_t{1} << 40) + 1;  // no f32 (nor its sum) holds it
  CHECK(plain.agree(0.0, big).samples == big);
  // A sum of squares past FLT_MAX, and one just above 1 that f32 would round.
  double sums[] = {1e40, 1.0 + 1e-12};
  with_sums.agree(0.0, 1, sums);
  CHECK(sums[0] == 1e40);
  CHECK(sums[1] == 1.0 + 1e-12);
  CHECK_THROWS_WITH(plain.agree(0.0, -1),
                    Catch::Contains("StepAgreement::agree: -1 samples on one rank"));
  CHECK_THROWS_WITH(plain.agree(0.0, 1, sums), Catch::Contains("2 sums given; it was made for 0"));
}

// Note [agreement without allocation]: every operator new in this binary
// counts, so a step's agreement (its records, its sums) is seen to allocate
// nothing; SelfCommunicator has no watchdog, hence no bookkeeping of its own.
TEST_CASE("the step agreement allocates nothing per step", "[comm][step]") {
  comm::SelfCommunicator self;
  comm::StepAgreement agreement(self, 2);
  double sums[] = {1.0, 2.0};
  const std::size_t tensors = core::memory_stats(core::Device::cpu()).allocations;
  const std::size_t before = g_heap_allocations.load();
  double loss = 0.0;
  for (int step = 0; step < 3; ++step) loss += agreement.agree(0.5, 2, sums).loss_sum;
  const std::size_t heap = g_heap_allocations.load() - before;
  if (LOCKSTEP_COUNT_HEAP) CHECK(heap == 0);
  CHECK(core::memory_stats(core::Device::cpu()).allocations == tensors);
  CHECK(loss == 1.5);
}
