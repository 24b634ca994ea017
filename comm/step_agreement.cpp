// StepAgreement and the stop flag (comm/step_agreement.h).
#include "comm/step_agreement.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/error.h"

namespace lockstep::comm {
namespace {

// A signal handler may only touch lock-free atomics.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_stop_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

// Note [step agreement]: the record's fixed slots, then the caller's sums.
constexpr std::size_t kLossSlot = 0, kSamplesSlot = 1, kStopSlot = 2, kFixedSlots = 3;

}  // namespace

void request_stop() { g_stop.store(true, std::memory_order_relaxed); }
bool stop_requested() { return g_stop.load(std::memory_order_relaxed); }
void clear_stop_request() { g_stop.store(false, std::memory_order_relaxed); }

void install_stop_handlers(std::initializer_list<int> signals) {
  for (int signal : signals) {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // blocking calls resume; the flag is read at the next step
    if (sigaction(signal, &action, nullptr) != 0)
      throw InvalidArgument(
          fmt::format("install_stop_handlers: signal {}: {}", signal, std::strerror(errno)));
  }
}

StepAgreement::StepAgreement(Communicator& comm, std::size_t sums)
    : comm_(comm),
      slots_(kFixedSlots + sums),
      mine_(slots_),
      records_(slots_ * static_cast<std::size_t>(comm.size())) {
  if (comm.device().is_cuda())
    throw InvalidArgument(
        fmt::format("StepAgreement: `comm` is a communicator of {}; pass the world's host one "
                    "(comm::World::host()): the records are read on the host",
                    comm.device().str()));
}

StepTotals StepAgreement::agree(double loss_sum, std::int64_t samples, std::span<double> sums) {
  const std::int64_t most = std::numeric_limits<std::int64_t>::max() / comm_.size();
  if (samples < 0 || samples > most)
    throw InvalidArgument(
        fmt::format("StepAgreement::agree: {} samples on one rank; give 0 to {} "
                    "at {} ranks",
                    samples, most, comm_.size()));
  if (kFixedSlots + sums.size() != slots_)
    throw InvalidArgument(fmt::format("StepAgreement::agree: {} sums given; it was made for {}",
                                      sums.size(), slots_ - kFixedSlots));
  mine_[kLossSlot] = std::bit_cast<std::int64_t>(loss_sum);
  mine_[kSamplesSlot] = samples;
  mine_[kStopSlot] = stop_requested() ? 1 : 0;
  for (std::size_t i = 0; i < sums.size(); ++i)
    mine_[kFixedSlots + i] = std::bit_cast<std::int64_t>(sums[i]);
  comm_.allgather(mine_.data(), records_.data(), static_cast<std::int64_t>(slots_), DType::i64);

  StepTotals totals;
  std::fill(sums.begin(), sums.end(), 0.0);
  for (int r = 0; r < comm_.size(); ++r) {
    const std::int64_t* record = records_.data() + static_cast<std::size_t>(r) * slots_;
    totals.loss_sum += std::bit_cast<double>(record[kLossSlot]);
    totals.samples += record[kSamplesSlot];
    totals.stop = totals.stop || record[kStopSlot] != 0;
    for (std::size_t i = 0; i < sums.size(); ++i)
      sums[i] += std::bit_cast<double>(record[kFixedSlots + i]);
  }
  return totals;
}

}  // namespace lockstep::comm
