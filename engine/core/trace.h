// The timeline trace: spans (name, category, start, duration, rank, thread)
// recorded into a per-thread buffer with no lock, and written at finish() as
// Chrome trace-event JSON, DIR/rank-<r>.json, for Perfetto, chrome://tracing
// and tools/trace.py. Compiled in and off by default: a span then costs one
// relaxed atomic load. In CUDA builds each span is also an NVTX range.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

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
extern std::atomic<bool> recording;
}

// A span's or instant's name buffer, its NUL included.
inline constexpr std::size_t kNameBytes = 48;

// Whether spans are being recorded now (enabled and the step is in the window).
inline bool active() { return detail::recording.load(std::memory_order_relaxed); }

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
// Writes DIR/rank-<r>.json and stops tracing; returns the file. Call it when
// no other thread emits spans (after the last step). A no-op when not enabled.
std::filesystem::path finish();

// A moment, on this thread ("bucket 2 ready").
void instant(std::string_view name, const char* category);

// A span from construction (or open()) to destruction. Names are read only
// when active; a name of two parts is joined by a space ("forward", "fc1").
// Names longer than kNameBytes - 1 (47) bytes are cut.
class Span {
 public:
  Span() = default;
  Span(std::string_view name, const char* category) {
    if (active()) begin(name, {}, category);
  }
  Span(std::string_view name, std::string_view detail, const char* category) {
    if (active()) begin(name, detail, category);
  }
  // Starts a default-constructed span now, when active.
  void open(std::string_view name, std::string_view detail, const char* category) {
    if (active() && !open_) begin(name, detail, category);
  }
  ~Span() {
    if (open_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  void begin(std::string_view name, std::string_view detail, const char* category);
  void end();

  bool open_ = false;
  const char* category_ = nullptr;
  Clock::time_point start_;
  char name_[kNameBytes];
};

}  // namespace lockstep::core::trace
