// agree_on_step and the stop flag (comm/step_agreement.h).
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

StepTotals agree_on_step(Communicator& comm, double loss_sum, std::int64_t samples,
                         std::span<double> sums) {
  const std::int64_t most = std::numeric_limits<std::int64_t>::max() / comm.size();
  if (samples < 0 || samples > most)
    throw InvalidArgument(
        fmt::format("agree_on_step: {} samples on one rank; give 0 to {} at {} ranks", samples,
                    most, comm.size()));
  const std::size_t slots = kFixedSlots + sums.size();
  std::vector<std::int64_t> mine(slots);
  mine[kLossSlot] = std::bit_cast<std::int64_t>(loss_sum);
  mine[kSamplesSlot] = samples;
  mine[kStopSlot] = stop_requested() ? 1 : 0;
  for (std::size_t i = 0; i < sums.size(); ++i)
    mine[kFixedSlots + i] = std::bit_cast<std::int64_t>(sums[i]);
  const auto count = static_cast<std::int64_t>(slots);
  const core::Tensor send = core::Tensor::from_vector(mine, {count}, DType::i64, comm.device());
  core::Tensor all = core::Tensor::empty({count * comm.size()}, DType::i64, comm.device());
  comm.allgather(send, all);
  const std::vector<std::int64_t> records = all.to_vector<std::int64_t>();

  StepTotals totals;
  std::fill(sums.begin(), sums.end(), 0.0);
  for (int r = 0; r < comm.size(); ++r) {
    const std::int64_t* record = records.data() + static_cast<std::size_t>(r) * slots;
    totals.loss_sum += std::bit_cast<double>(record[kLossSlot]);
    totals.samples += record[kSamplesSlot];
    totals.stop = totals.stop || record[kStopSlot] != 0;
    for (std::size_t i = 0; i < sums.size(); ++i)
      sums[i] += std::bit_cast<double>(record[kFixedSlots + i]);
  }
  return totals;
}

}  // namespace lockstep::comm
