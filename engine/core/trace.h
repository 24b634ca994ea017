// The timeline trace: spans (name, category, start, duration, rank, thread)
// recorded into a per-thread buffer with no lock, and written at finish() as
// Chrome trace-event JSON, DIR/rank-<r>.json, for Perfetto, chrome://tracing
// and tools/trace.py. Compiled in and off by default: a span then costs one
// relaxed atomic load. In CUDA builds each span is also an NVTX range, and a
// span given a GPU stream also times the stream's work with CUDA events, on a
// track of its own (Note [gpu anchor], detail/gpu_timeline.cpp). Two readings
// of the same host spans: the step breakdown (always on) and the profile.
//
// Note [step breakdown]: a span made with a Part (data, compute, comm,
// optimizer) times itself whether or not anything records, and adds its
// duration to its thread's breakdown, a plain thread-local array: no lock, no
// allocation, two clock reads a span. Trainer::step marks the main thread's
// spans that make up a step (the comm part holds only the waits the main
// thread sees, i.e. exposed communication), resets the breakdown when a step
// starts and reads it when it ends. Traced, the same span with the same two
// clock reads becomes the trace's event, so the breakdown users see is the
// sum of the spans the trace shows (tools/trace.py summary adds the same).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/stream.h"

namespace lockstep::core {
class Stream;
}

namespace lockstep::core::trace {

// The steps a trace covers, first..last inclusive; {1, max} is every step.
struct StepWindow {
  std::int64_t first = 1;
  std::int64_t last = INT64_MAX;
};
// "A:B" (either side may be empty: "5:", ":20"); throws InvalidArgument
// naming `what` unless 1 <= A <= B.
StepWindow parse_step_window(std::string_view text, std::string_view what);

namespace detail {
// What a span begun now goes to: kTraced, kProfiled, both or neither.
inline constexpr unsigned kTraced = 1, kProfiled = 2;
extern std::atomic<unsigned> recording;
// A GPU span in flight: its device's timeline, its id there, its stream.
class GpuTimeline;
struct GpuSlot {
  GpuTimeline* timeline;
  int id;
  kernels::CudaStream stream;
};
}  // namespace detail

// A span's or instant's name buffer, its NUL included.
inline constexpr std::size_t kNameBytes = 48;

// Whether spans are being recorded now: traced (enabled and the step in the
// window) or profiled (enable_profile() and a step begun).
inline bool active() { return detail::recording.load(std::memory_order_relaxed) != 0; }
// Whether spans begun now are traced (the profile alone does not count): what
// a GPU span needs, as the profile holds host spans only.
inline bool traced() {
  return (detail::recording.load(std::memory_order_relaxed) & detail::kTraced) != 0;
}

// The parts of a step (Note [step breakdown]); each is also the span's category.
enum class Part { data, compute, comm, optimizer };
const char* category_of(Part part);

// One thread's step breakdown in milliseconds (Note [step breakdown]).
struct Breakdown {
  double data_wait_ms = 0;     // Part::data
  double compute_ms = 0;       // Part::compute
  double exposed_comm_ms = 0;  // Part::comm
  double optimizer_ms = 0;     // Part::optimizer
};
// Starts this thread's breakdown afresh (when a step starts).
void reset_breakdown();
// What this thread's Part spans added up since reset_breakdown().
Breakdown breakdown();

// The clock of every span: the flight recorder's (comm/flight_recorder.h), steady_clock.
using Clock = std::chrono::steady_clock;

// Starts tracing this process as `rank` into `directory` (created if needed).
// Call it right after a barrier across the ranks: the moment of the call is
// written as the clock_sync event, by which tools/trace.py merge aligns ranks.
// Names the calling thread "main". Throws InvalidArgument for a second call.
void enable(const std::filesystem::path& directory, int rank, StepWindow window = {});
bool enabled();
// The step now running (1-based); spans are recorded while it is in the window.
void set_step(std::int64_t step);
// Names this thread in the trace ("comm", "loader 0"); cheap when tracing is off.
void set_thread_name(std::string_view name);
// Names a GPU stream's track in the trace ("cuda compute stream"); streams
// not named are "cuda stream <n>". A no-op for the cpu stream. Call it where
// the stream is made: names are kept by the stream's handle, which CUDA may
// hand out again once the stream is destroyed.
void set_stream_name(const Stream& stream, std::string_view name);
// Writes DIR/rank-<r>.json and stops tracing; returns the file. Call it when
// no other thread emits spans (after the last step). A no-op when not enabled.
// A file that cannot be written is reported (Note [write failures] in
// engine/core/log.h) and an empty path returned: the run goes on.
std::filesystem::path finish();

// A moment, on this thread ("bucket 2 ready").
void instant(std::string_view name, const char* category);

// The profile (lockstep-train --profile): every span of every thread added up
// by name from the first step (set_step(1) or later) on, the same spans a
// trace of window 1: holds, traced or not. Cheap enough for a whole run: one
// uncontended lock and a hash lookup per span, nothing per step kept.
void enable_profile();
struct ProfileRow {
  std::string name;
  std::int64_t count = 0;
  double total_ms = 0, max_ms = 0;
};
struct Profile {
  double wall_ms = 0;            // from the first step's start to finish_profile()
  std::vector<ProfileRow> rows;  // by total, largest first (name breaks ties)
};
// Stops profiling and returns what it added up; empty when not enabled.
Profile finish_profile();
// The table: name, count, total, mean and max ms, % of the wall time.
std::string format_profile(const Profile& profile);

// A span from construction (or open()) to destruction. Names are read only
// when active; a name of two parts is joined by a space ("forward", "fc1").
// Names longer than kNameBytes - 1 (47) bytes are cut.
class Span {
 public:
  Span() = default;
  Span(std::string_view name, const char* category) {
    if (const unsigned mode = mode_now()) begin(mode, name, {}, category);
  }
  Span(std::string_view name, std::string_view detail, const char* category) {
    if (const unsigned mode = mode_now()) begin(mode, name, detail, category);
  }
  // A part of a step: timed always, added to this thread's breakdown at its
  // end (Note [step breakdown]); recorded as the others are, category_of(part).
  Span(std::string_view name, Part part) : part_(static_cast<int>(part)) {
    if (const unsigned mode = mode_now()) {
      begin(mode, name, {}, category_of(part));
    } else {
      start_ = Clock::now();
    }
  }
  // The same, and, traced, the work queued on the GPU `stream` meanwhile is a
  // span of the same name on the stream's track (Note [gpu anchor]).
  Span(std::string_view name, Part part, const Stream& stream) : part_(static_cast<int>(part)) {
    if (const unsigned mode = mode_now()) {
      begin(mode, name, {}, category_of(part), &stream);
    } else {
      start_ = Clock::now();
    }
  }
  // Starts a default-constructed span now, when active; with a GPU `stream`,
  // as the constructor above does.
  void open(std::string_view name, std::string_view detail, const char* category,
            const Stream* stream = nullptr) {
    const unsigned mode = mode_now();
    if (mode && !mode_) begin(mode, name, detail, category, stream);
  }
  ~Span() {
    if (mode_ || part_ >= 0) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  static unsigned mode_now() { return detail::recording.load(std::memory_order_relaxed); }
  void begin(unsigned mode, std::string_view name, std::string_view detail, const char* category,
             const Stream* stream = nullptr);
  void end();

  static constexpr unsigned kGpu = 4;  // in mode_: gpu_ holds a GPU span
  unsigned mode_ = 0;      // detail::kTraced | kProfiled, as it was at the start, | kGpu
  int part_ = -1;          // a Part, or -1
  std::int64_t step_ = 0;  // the step it began in (Note [span step], trace.cpp)
  const char* category_ = nullptr;
  Clock::time_point start_;
  char name_[kNameBytes];
  detail::GpuSlot gpu_;  // read only with kGpu
};

// Only the GPU half of a span: the work queued on `stream` from construction
// to destruction, when traced (the host side has a Span of its own, named
// otherwise: "enqueue allreduce bucket 2" over "allreduce bucket 2").
class GpuSpan {
 public:
  GpuSpan(const Stream& stream, std::string_view name, std::string_view detail,
          const char* category) {
    if (traced()) open_ = begin(stream, name, detail, category);
  }
  ~GpuSpan() {
    if (open_) close();
  }
  GpuSpan(const GpuSpan&) = delete;
  GpuSpan& operator=(const GpuSpan&) = delete;

 private:
  bool begin(const Stream& stream, std::string_view name, std::string_view detail,
             const char* category);
  void close();
  bool open_ = false;
  detail::GpuSlot gpu_;  // read only when open_
};

}  // namespace lockstep::core::trace
