// The flight recorder: a fixed ring of the last collectives this rank issued
// (sequence number, kind, size, step, bucket, times, state) and the
// watchdog's last liveness check (which ranks answered it), kept by the
// watchdog and written as flight-rank-<r>.json on a watchdog failure, an abort
// or SIGUSR2, so that tools/flight.py can say which rank stopped where and
// which ranks desynced.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace lockstep::comm {

struct OperationInfo;

inline constexpr std::size_t kDefaultFlightRecords = 2048;

enum class FlightState : std::uint8_t { enqueued, started, completed, failed };
const char* flight_state_name(FlightState state);

// One collective. Times are nanoseconds since the recorder was made; -1 for
// a time not (yet) known. Names are truncated copies, so a record owns no heap memory.
struct FlightRecord {
  std::uint64_t ticket = 0;  // the recorder's count of records before this one
  std::uint64_t sequence = 0;
  char kind[16] = {};
  char communicator[24] = {};
  std::int64_t count = 0;
  DType dtype = DType::f32;
  std::int64_t step = -1;
  std::int64_t bucket = -1;
  std::int64_t enqueue_ns = -1, start_ns = -1, end_ns = -1;
  FlightState state = FlightState::enqueued;
};

// The watchdog's question to the other ranks after a timeout or an error
// (Note [liveness check], comm/watchdog.cpp): when it asked, when it stopped
// waiting, who answered and when each answer arrived, and who did not. Times
// as in FlightRecord.
struct LivenessCheck {
  std::int64_t asked_ns = -1, ended_ns = -1;
  double grace_s = 0;
  std::vector<int> answered, silent;      // other ranks, ascending
  std::vector<std::int64_t> answered_ns;  // answered[i]'s answer arrived at answered_ns[i]
};

// Not thread-safe: the watchdog's mutex guards its recorder (comm/watchdog.h).
class FlightRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  using Ticket = std::uint64_t;

  explicit FlightRecorder(std::size_t capacity = kDefaultFlightRecords);

  // A new record of `info`, enqueued now; started now as well when `started`.
  Ticket record(const OperationInfo& info, bool started);
  // The ticket of the newest record of `info`'s collective among the last few, if any.
  bool find(const OperationInfo& info, Ticket& ticket) const;
  // State changes; a ticket whose record the ring has overwritten is ignored.
  void complete(Ticket ticket);
  void fail(Ticket ticket);

  // Keeps `check`, replacing the last one.
  void record_liveness(LivenessCheck check) { liveness_ = std::move(check); }
  const std::optional<LivenessCheck>& liveness() const { return liveness_; }
  // `time` as nanoseconds since the recorder was made.
  std::int64_t ns_of(Clock::time_point time) const;

  std::size_t capacity() const { return ring_.size(); }
  std::uint64_t recorded() const { return next_; }
  // The records still in the ring, oldest first.
  std::vector<FlightRecord> records() const;
  // The dump: {"rank", "size", "reason", "step", ..., "now_ns" (when it was
  // written), "liveness" (the last check, or null), "collectives": [...]}.
  std::string json(int rank, int size, std::int64_t step, std::string_view reason) const;

 private:
  FlightRecord* live(Ticket ticket);
  std::int64_t now_ns() const;

  std::vector<FlightRecord> ring_;
  std::uint64_t next_ = 0;
  std::optional<LivenessCheck> liveness_;
  Clock::time_point epoch_;
  std::int64_t epoch_unix_ns_;
};

// Where dumps go: LOCKSTEP_FLIGHT_DIR when set, else the directory a program
// gave set_flight_directory (its checkpoint directory), else the working directory.
std::filesystem::path flight_directory();
void set_flight_directory(std::filesystem::path directory);
// "flight-rank-<rank>.json"
std::string flight_file_name(int rank);

// Makes SIGUSR2 ask every watchdog of this process for a dump (Note [flight
// signal], flight_recorder.cpp). Leaves a handler the program installed alone.
void install_flight_signal();
// How many SIGUSR2 have arrived since the process started.
std::uint64_t flight_signal_count();

}  // namespace lockstep::comm
