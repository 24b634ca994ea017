// The flight recorder (comm/flight_recorder.h): the ring, its JSON dump, the
// dump directory and the SIGUSR2 flag.
//
// Note [flight signal]: a signal handler may only touch lock-free atomics, so
// SIGUSR2's handler only counts the signal. Each watchdog thread compares the
// count with the one it last saw at every poll (at most 100 ms apart) and
// dumps on its own thread, where file I/O and locks are allowed.
#include "comm/flight_recorder.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "comm/watchdog.h"
#include "engine/core/json.h"
#include "engine/core/log.h"

namespace lockstep::comm {
namespace {

// How far back find() looks: a collective's watch_async follows its enqueue at once.
constexpr std::uint64_t kFindWindow = 4;

std::atomic<std::uint64_t> g_flight_signals{0};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

void on_flight_signal(int) { g_flight_signals.fetch_add(1, std::memory_order_relaxed); }

std::mutex g_directory_mutex;
std::filesystem::path g_directory;  // set_flight_directory's; empty when unset

template <std::size_t N>
void copy_name(char (&to)[N], std::string_view from) {
  const std::size_t n = std::min(from.size(), N - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

}  // namespace

const char* flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::enqueued:
      return "enqueued";
    case FlightState::started:
      return "started";
    case FlightState::completed:
      return "completed";
    case FlightState::failed:
      return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(std::size_t capacity)
    : ring_(std::max<std::size_t>(capacity, 1)),
      epoch_(Clock::now()),
      epoch_unix_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count()) {}

std::int64_t FlightRecorder::ns_of(Clock::time_point time) const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(time - epoch_).count();
}

std::int64_t FlightRecorder::now_ns() const { return ns_of(Clock::now()); }

FlightRecorder::Ticket FlightRecorder::record(const OperationInfo& info, bool started) {
  FlightRecord& r = ring_[next_ % ring_.size()];
  r.ticket = next_;
  r.sequence = info.sequence;
  copy_name(r.kind, info.name);
  copy_name(r.communicator, info.communicator);
  r.count = info.count;
  r.dtype = info.dtype;
  r.step = info.step;
  r.bucket = info.bucket;
  r.enqueue_ns = now_ns();
  r.start_ns = started ? r.enqueue_ns : -1;
  r.end_ns = -1;
  r.state = started ? FlightState::started : FlightState::enqueued;
  return next_++;
}

bool FlightRecorder::find(const OperationInfo& info, Ticket& ticket) const {
  const std::uint64_t window = std::min<std::uint64_t>({next_, kFindWindow, ring_.size()});
  for (std::uint64_t back = 1; back <= window; ++back) {
    const FlightRecord& r = ring_[(next_ - back) % ring_.size()];
    if (r.sequence == info.sequence && info.communicator == r.communicator &&
        std::strcmp(r.kind, info.name) == 0) {
      ticket = r.ticket;
      return true;
    }
  }
  return false;
}

FlightRecord* FlightRecorder::live(Ticket ticket) {
  FlightRecord& r = ring_[ticket % ring_.size()];
  return ticket < next_ && r.ticket == ticket ? &r : nullptr;
}

void FlightRecorder::complete(Ticket ticket) {
  if (FlightRecord* r = live(ticket)) {
    r->end_ns = now_ns();
    r->state = FlightState::completed;
  }
}

void FlightRecorder::fail(Ticket ticket) {
  if (FlightRecord* r = live(ticket)) {
    r->end_ns = now_ns();
    r->state = FlightState::failed;
  }
}

std::vector<FlightRecord> FlightRecorder::records() const {
  std::vector<FlightRecord> out;
  const std::uint64_t first = next_ > ring_.size() ? next_ - ring_.size() : 0;
  for (std::uint64_t t = first; t < next_; ++t) out.push_back(ring_[t % ring_.size()]);
  return out;
}

std::string FlightRecorder::json(int rank, int size, std::int64_t step,
                                 std::string_view reason) const {
  auto numbers = [](const auto& values) {
    core::Json list = core::Json::array();
    for (const auto& v : values) list.push(v);
    return list;
  };
  core::Json liveness;
  if (liveness_)
    liveness = core::Json::object()
                   .set("asked_ns", liveness_->asked_ns)
                   .set("ended_ns", liveness_->ended_ns)
                   .set("grace_s", liveness_->grace_s)
                   .set("answered", numbers(liveness_->answered))
                   .set("answered_ns", numbers(liveness_->answered_ns))
                   .set("silent", numbers(liveness_->silent));
  core::Json collectives = core::Json::array();
  for (const FlightRecord& r : records())
    collectives.push(core::Json::object()
                         .set("sequence", r.sequence)
                         .set("communicator", r.communicator)
                         .set("kind", r.kind)
                         .set("count", r.count)
                         .set("bytes", r.count * static_cast<std::int64_t>(dtype_size(r.dtype)))
                         .set("dtype", dtype_name(r.dtype))
                         .set("step", r.step)
                         .set("bucket", r.bucket)
                         .set("enqueue_ns", r.enqueue_ns)
                         .set("start_ns", r.start_ns)
                         .set("end_ns", r.end_ns)
                         .set("state", flight_state_name(r.state)));
  return core::Json::object()
             .set("rank", rank)
             .set("size", size)
             .set("reason", reason)
             .set("step", step)
             .set("capacity", ring_.size())
             .set("recorded", next_)
             .set("epoch_unix_ns", epoch_unix_ns_)
             .set("now_ns", now_ns())
             .set("liveness", std::move(liveness))
             .set("collectives", std::move(collectives))
             .dump() +
         "\n";
}

std::filesystem::path flight_directory() {
  if (const char* env = std::getenv("LOCKSTEP_FLIGHT_DIR"); env && *env) return env;
  std::lock_guard lock(g_directory_mutex);
  return g_directory.empty() ? std::filesystem::path(".") : g_directory;
}

void set_flight_directory(std::filesystem::path directory) {
  std::lock_guard lock(g_directory_mutex);
  g_directory = std::move(directory);
}

std::string flight_file_name(int rank) { return fmt::format("flight-rank-{}.json", rank); }

void install_flight_signal() {
  struct sigaction old {};
  if (sigaction(SIGUSR2, nullptr, &old) != 0) return;
  if (old.sa_handler != SIG_DFL && old.sa_handler != on_flight_signal) {
    core::log_info("flight recorder: SIGUSR2 already has a handler; not installing the dump on it");
    return;
  }
  struct sigaction action {};
  action.sa_handler = on_flight_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &action, nullptr);
}

std::uint64_t flight_signal_count() { return g_flight_signals.load(std::memory_order_relaxed); }

}  // namespace lockstep::comm
