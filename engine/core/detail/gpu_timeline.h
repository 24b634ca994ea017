// The GPU side of the timeline trace, free of CUDA: spans of stream work timed
// by events from a pool made once, and resolved to the host clock by anchoring
// (Note [gpu anchor], gpu_timeline.cpp). engine/core/trace_gpu.cpp drives it
// with CUDA events; tests/core/test_trace_gpu.cpp with a fake clock.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/core/trace.h"
#include "kernels/stream.h"

namespace lockstep::core::trace::detail {

// The host clock (ns) just before an anchor event was recorded and just after
// it was seen to have happened.
struct HostBracket {
  std::int64_t before_ns = 0, after_ns = 0;
};

// A device's events, named by slot in a pool of fixed size made once.
class EventClock {
 public:
  virtual ~EventClock() = default;
  virtual int slots() const = 0;
  // Enqueues event `slot` on `stream`.
  virtual void record(int slot, kernels::CudaStream stream) = 0;
  // Whether event `slot` has happened; never blocks.
  virtual bool done(int slot) = 0;
  // Blocks until event `slot` has happened.
  virtual void wait(int slot) = 0;
  // Milliseconds from event `from` to event `to`, both happened.
  virtual float elapsed_ms(int from, int to) = 0;
  // Records `slot` where nothing else is queued (a stream of its own) and
  // waits for it; returns the host clock around that.
  virtual HostBracket anchor(int slot) = 0;
};

// A GPU span on the host clock, ready for the trace file.
struct GpuSpanEvent {
  char name[kNameBytes];
  const char* category;
  std::int64_t start_ns, duration_ns, step;
  int lane;
};

// The anchor arithmetic: an event `elapsed_ms` after the anchor, whose host
// time is `anchor_ns`, happened at the returned host time (ns, rounded).
std::int64_t host_ns_after(std::int64_t anchor_ns, float elapsed_ms);

// One device's GPU spans: open, closed but not yet known to have happened,
// and resolved. Thread-safe (one lock; only traced spans reach it).
class GpuTimeline {
 public:
  // Re-anchors at a resolve() once the anchor is `reanchor_after_ns` old.
  GpuTimeline(std::unique_ptr<EventClock> clock, std::int64_t reanchor_after_ns);

  // Opens a span on `stream`: records its begin event, anchoring first if
  // there is no anchor yet. Returns its id, or -1 when no two events can be
  // had (Note [gpu event pool]): the span is then dropped and counted.
  int begin(kernels::CudaStream stream, int lane, const char (&name)[kNameBytes],
            const char* category, std::int64_t step);
  // Closes span `id` (from begin(), not -1) on the stream it began on. Never
  // throws: a span whose end cannot be recorded is dropped (Note [gpu span end]).
  void end(int id, kernels::CudaStream stream) noexcept;
  // Appends to `out` every closed span whose end has happened (with `wait`,
  // every closed span, waiting for each), in the order they began; then
  // re-anchors if the anchor is older than the limit at `now_ns`.
  void resolve(bool wait, std::int64_t now_ns, std::vector<GpuSpanEvent>& out);

  // The spans dropped since the last call.
  std::uint64_t take_dropped();
  // The largest half-width of an anchor's bracket: how far off a resolved
  // time may be, on top of the events' own resolution.
  std::int64_t anchor_uncertainty_ns() const;
  // Events in use now (anchors and spans), for the tests of the pool.
  int events_in_use() const;

 private:
  struct Anchor {
    std::int64_t id;
    int slot;
    std::int64_t host_ns;
    int users;  // spans not yet resolved that measure from it
  };
  struct Pending {
    int begin_slot, end_slot;
    std::int64_t anchor;  // Anchor::id
    bool closed;
    GpuSpanEvent event;
  };

  int take_slot();
  bool take_anchor();
  Anchor& anchor_of(const Pending& p);
  GpuSpanEvent settle(Pending& p);
  void retire_anchors();

  mutable std::mutex mutex_;
  std::unique_ptr<EventClock> clock_;
  std::int64_t reanchor_after_ns_;
  std::vector<int> free_;         // event slots
  std::vector<Pending> pending_;  // by begin slot
  std::deque<int> order_;         // begin slots of pending spans, oldest first
  std::deque<Anchor> anchors_;    // oldest first; the last is the current one
  std::int64_t next_anchor_id_ = 0;
  std::vector<GpuSpanEvent> early_;  // resolved while making room, not yet handed out
  std::uint64_t dropped_ = 0;
  std::int64_t uncertainty_ns_ = 0;
};

}  // namespace lockstep::core::trace::detail
