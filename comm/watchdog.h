// The communication watchdog: every collective runs under it, so that a rank
// that dies or stalls ends the job with a message instead of a silent hang.
// Its thread checks the collectives in flight against a timeout
// (LOCKSTEP_COMM_TIMEOUT, default 10 minutes), polls asynchronous errors
// (NCCL), and on a failure asks the other ranks what they are doing, so that
// the message names the operation, the step and the ranks that did not arrive.
// A rank that is busy on purpose outside the collectives (rank 0 saving a
// checkpoint) says so, and the others wait for it (Note [busy ranks]).
// It also keeps the flight recorder (comm/flight_recorder.h) of what it watched.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/flight_recorder.h"
#include "engine/core/trace.h"
#include "kernels/dtype.h"

namespace lockstep::comm {

using Seconds = std::chrono::duration<double>;

inline constexpr Seconds kDefaultCommTimeout{600.0};

// A timeout in seconds ("600", "2.5"); throws InvalidArgument unless positive.
Seconds parse_timeout_seconds(std::string_view text);
// LOCKSTEP_COMM_TIMEOUT when set, else kDefaultCommTimeout.
Seconds comm_timeout_from_env();

// What a watched collective is, enough to name it in a message.
struct OperationInfo {
  const char* name = "";       // "allreduce"
  std::string communicator;    // the communicator's label, "world"
  std::uint64_t sequence = 0;  // how many collectives that communicator ran before this one
  std::int64_t count = 0;      // elements
  DType dtype = DType::f32;
  std::string context;       // what it is for (OperationContext); may be empty
  std::int64_t step = -1;    // the training step (Watchdog::set_step); -1 before the first
  std::int64_t bucket = -1;  // the gradient bucket (OperationContext); -1 for other collectives

  // "world#57": equal on every rank that is in this collective.
  std::string key() const;
  // "allreduce #57 on 'world' (262144 f32; gradient bucket 2 of 3) at step 12"
  std::string describe() const;
};

// Names what the collectives issued by this thread are for while it lives,
// e.g. "gradient bucket 2 of 5 (fc2.weight .. fc1.bias)", and which gradient
// bucket (0-based) when it is one. The innermost wins.
class OperationContext {
 public:
  explicit OperationContext(std::string what, std::int64_t bucket = -1);
  ~OperationContext();
  OperationContext(const OperationContext&) = delete;
  OperationContext& operator=(const OperationContext&) = delete;

  // This thread's innermost context, or an empty string.
  static const std::string& current();
  // This thread's innermost context's bucket, or -1.
  static std::int64_t current_bucket();
  // "bucket 2" for a trace span's name, or empty outside a bucket.
  static std::string current_bucket_label();

 private:
  std::string what_;
  std::int64_t bucket_;
  const OperationContext* outer_;
};

// One rank's answer to the watchdog's question: its Watchdog::status(), and
// when it arrived (Note [liveness check], watchdog.cpp).
struct PeerAnswer {
  std::string status;
  std::chrono::steady_clock::time_point arrived;
};

// How a watchdog learns what the other ranks are doing. Every rank's watchdog
// serves questions all the time; the MPI implementation is
// comm/detail/mpi_peer_channel.h.
class PeerChannel {
 public:
  virtual ~PeerChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Answers the questions that other ranks have sent with `status()`.
  virtual void serve(const std::function<std::string()>& status) = 0;
  // Asks every other rank and waits up to `grace` for the answers, serving
  // questions meanwhile. Entry r is rank r's answer; nullopt for this rank
  // and for ranks that did not answer in time.
  virtual std::vector<std::optional<PeerAnswer>> ask_all(
      Seconds grace, const std::function<std::string()>& status) = 0;
};

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // Receives the message of each failure, on the watchdog thread. The World's
  // handler ends the process (Note [watchdog ends the process], world.cpp).
  using Handler = std::function<void(const std::string& message)>;
  // Polled on the watchdog thread: an error text once the source has failed.
  using ErrorSource = std::function<std::optional<std::string>()>;

 private:
  struct Item {
    OperationInfo info;
    Clock::time_point start;
    std::function<bool()> done;  // asynchronous collectives only
    bool reported = false;
    std::uint64_t id = 0;
    FlightRecorder::Ticket flight = 0;
    bool enqueue_only = false;
  };

 public:
  Watchdog(Seconds timeout, Handler handler, std::unique_ptr<PeerChannel> peers = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  Seconds timeout() const { return timeout_; }
  void set_step(std::int64_t step) { step_ = step; }
  std::int64_t step() const { return step_; }

  // Watches a blocking collective from construction to destruction; fills in
  // the step and the thread's OperationContext, and records it in the flight
  // recorder: started now, completed at the end (failed when an exception
  // ends it). With `enqueue_only` it watches the enqueueing of an
  // asynchronous collective, which stays enqueued in the recorder until its
  // watch_async completes it. A null watchdog watches nothing.
  class Scope {
   public:
    Scope(Watchdog* watchdog, OperationInfo info, bool enqueue_only = false);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Watchdog* watchdog_;
    std::list<Item>::iterator item_;
    int uncaught_;
    core::trace::Span span_;  // "allreduce bucket 2" in the timeline trace
  };

  // Says, while it lives, that this rank is outside every collective on
  // purpose, doing what `what` names ("saving checkpoint ckpt-12.h5"): the
  // other ranks' watchdogs then wait for it past their timeout instead of
  // ending the job (Note [busy ranks], watchdog.cpp). Wrap work that one rank
  // does while the others wait for it in the next collective. Scopes nest;
  // the innermost is shown. A null watchdog does nothing.
  class Busy {
   public:
    Busy(Watchdog* watchdog, std::string what);
    ~Busy();
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    Watchdog* watchdog_;
    std::optional<std::pair<std::string, Clock::time_point>> outer_;
  };

  // Watches an asynchronous collective (NCCL) until `done()` returns true.
  // `done` runs on the watchdog thread; an exception from it is a failure.
  void watch_async(OperationInfo info, std::function<bool()> done);

  int add_error_source(ErrorSource source);
  void remove_error_source(int id);

  // This rank's state as peers receive it: the keys of its collectives in
  // flight on the first line (maybe empty), what it is busy with on the
  // second (Busy; maybe empty), then one sentence.
  std::string status() const;

  // Writes the flight recorder to flight_directory() / flight_file_name(rank)
  // with `reason`, and returns that path; logs and returns an empty path when
  // it cannot. Called on a failure, when a peer asks after one, on SIGUSR2
  // (install_flight_signal) and by World::abort.
  std::filesystem::path dump_flight(std::string_view reason);
  // A copy of the flight recorder's records, oldest first.
  std::vector<FlightRecord> flight_records() const;

  // Ends the thread and releases the peer channel; later collectives go
  // unwatched. Called before MPI_Finalize; idempotent.
  void stop();

 private:
  struct Failure {
    std::string head;
    std::string key;            // of the collective that timed out; empty for errors
    std::uint64_t item_id = 0;  // of that collective
  };
  using Answers = std::vector<std::optional<PeerAnswer>>;

  std::list<Item>::iterator add(OperationInfo info, std::function<bool()> done, bool enqueue_only);
  void finish(std::list<Item>::iterator item, bool failed);
  std::string answer_peer();
  void dump_on_signal();  // watchdog thread
  void run();
  std::optional<Failure> find_failure();
  void handle(const Failure& failure);
  bool wait_for_busy_ranks(const Failure& failure, const Answers& answers);
  void report(const Failure& failure, const Answers& answers, const std::string& ask_error);
  std::string in_flight_text() const;  // mutex_ held

  const Seconds timeout_;
  const Handler handler_;
  std::unique_ptr<PeerChannel> peers_;
  const int rank_;
  const int size_;
  std::atomic<std::int64_t> step_{-1};
  std::uint64_t seen_flight_signals_;                // watchdog thread only
  std::optional<Clock::time_point> last_peer_dump_;  // watchdog thread only

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::list<Item> in_flight_;
  std::optional<std::pair<OperationInfo, Clock::time_point>> last_finished_;
  std::optional<std::pair<std::string, Clock::time_point>> busy_;  // Busy's what, since
  std::uint64_t next_item_id_ = 0;
  FlightRecorder flight_;
  std::mutex dump_mutex_;  // one dump_flight writes at a time
  std::vector<std::pair<int, ErrorSource>> sources_;
  int next_source_id_ = 0;
  std::thread thread_;
};

}  // namespace lockstep::comm
