// agree_on_step and the stop flag (comm/step_agreement.h).
#include "comm/step_agreement.h"

#include <fmt/core.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <vector>

#include "kernels/error.h"

namespace lockstep::comm {
namespace {

// A signal handler may only touch lock-free atomics.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_stop_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

constexpr std::int64_t kExactSamples = std::int64_t{1} << 24;  // integers f32 holds exactly

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

StepTotals agree_on_step(Communicator& comm, double loss_sum, std::int64_t samples) {
  if (samples < 0 || samples > kExactSamples / comm.size())
    throw InvalidArgument(fmt::format(
        "agree_on_step: {} samples on one rank; the agreement counts exactly up to {} per rank "
        "at {} ranks",
        samples, kExactSamples / comm.size(), comm.size()));
  const std::vector<float> mine{static_cast<float>(loss_sum), static_cast<float>(samples),
                                stop_requested() ? 1.0f : 0.0f};
  core::Tensor totals = core::Tensor::from_vector(mine, {3}, DType::f32, comm.device());
  comm.allreduce(totals, ReduceOp::sum);
  const std::vector<float> sums = totals.to_vector<float>();
  return {sums[0], static_cast<std::int64_t>(sums[1]), sums[2] > 0.0f};
}

}  // namespace lockstep::comm
