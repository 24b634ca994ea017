// GpuTimeline (engine/core/detail/gpu_timeline.h): the event pool, the
// anchors, and the resolution of GPU spans to the host clock.
#include "engine/core/detail/gpu_timeline.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace lockstep::core::trace::detail {

// Note [gpu anchor]: a GPU event carries a device timestamp, and CUDA only
// says how far apart two events are (cudaEventElapsedTime, in float ms). An
// anchor ties the device clock to the host's: one event recorded on a stream
// of its own, where nothing is queued before it, and waited for; it happened
// between the host times just before the record and just after the wait, and
// is taken to have happened halfway (the half-width is written to the trace
// as gpu_anchor_uncertainty_us). A span's begin and end are then the anchor's
// host time plus their elapsed time from it. An anchor always precedes the
// spans measured from it (they are enqueued after it was seen done), so every
// elapsed time is positive. A float holds about 7 digits, so elapsed times are
// kept short: at a resolve() an anchor older than reanchor_after_ns (1 s in
// the trace: 1000 ms in a float is good to 0.1 us) is replaced, or, when no
// span is pending, dropped, so that a trace idle outside its window of steps
// takes no anchors; an old anchor stays until the last span measured from it
// is resolved. The host clock and
// the device's drift apart by parts per million, so re-anchoring every second
// also bounds the drift to microseconds.
std::int64_t host_ns_after(std::int64_t anchor_ns, float elapsed_ms) {
  return anchor_ns + std::llround(static_cast<double>(elapsed_ms) * 1e6);
}

GpuTimeline::GpuTimeline(std::unique_ptr<EventClock> clock, std::int64_t reanchor_after_ns)
    : clock_(std::move(clock)), reanchor_after_ns_(reanchor_after_ns) {
  const int n = clock_->slots();
  pending_.resize(static_cast<std::size_t>(n));
  for (int slot = n - 1; slot >= 0; --slot) free_.push_back(slot);
}

// Note [gpu event pool]: the events are made once (EventClock), and a span
// holds two of them from begin() until it is resolved. resolve() runs at every
// step's start (trace::set_step, without waiting: only spans whose end has
// happened) and at trace::finish (waiting for all). When the pool runs dry
// inside a step, the oldest closed span is waited for and resolved to free its
// events (kept for the next resolve()); when every span is still open, the new
// one is dropped and counted in the trace's dropped_gpu_spans.
int GpuTimeline::take_slot() {
  if (free_.empty()) {
    const auto oldest =
        std::find_if(order_.begin(), order_.end(), [&](int b) { return pending_[b].closed; });
    if (oldest == order_.end()) return -1;
    Pending& p = pending_[*oldest];
    clock_->wait(p.end_slot);
    early_.push_back(settle(p));
    order_.erase(oldest);
    retire_anchors();
  }
  const int slot = free_.back();
  free_.pop_back();
  return slot;
}

bool GpuTimeline::take_anchor() {
  const int slot = take_slot();
  if (slot < 0) return false;
  const HostBracket b = clock_->anchor(slot);
  uncertainty_ns_ = std::max(uncertainty_ns_, (b.after_ns - b.before_ns + 1) / 2);
  anchors_.push_back({next_anchor_id_++, slot, b.before_ns + (b.after_ns - b.before_ns) / 2, 0});
  retire_anchors();
  return true;
}

GpuTimeline::Anchor& GpuTimeline::anchor_of(const Pending& p) {
  return anchors_[static_cast<std::size_t>(p.anchor - anchors_.front().id)];
}

// The anchors before the current one go once no span measures from them.
void GpuTimeline::retire_anchors() {
  while (anchors_.size() > 1 && anchors_.front().users == 0) {
    free_.push_back(anchors_.front().slot);
    anchors_.pop_front();
  }
}

GpuSpanEvent GpuTimeline::settle(Pending& p) {
  Anchor& a = anchor_of(p);
  GpuSpanEvent e = p.event;
  e.start_ns = host_ns_after(a.host_ns, clock_->elapsed_ms(a.slot, p.begin_slot));
  const std::int64_t end_ns = host_ns_after(a.host_ns, clock_->elapsed_ms(a.slot, p.end_slot));
  // Both are rounded from floats; a span of (almost) nothing may come out a
  // nanosecond negative.
  e.duration_ns = std::max<std::int64_t>(0, end_ns - e.start_ns);
  --a.users;
  free_.push_back(p.begin_slot);
  free_.push_back(p.end_slot);
  return e;
}

int GpuTimeline::begin(kernels::CudaStream stream, int lane, const char (&name)[kNameBytes],
                       const char* category, std::int64_t step) {
  std::lock_guard lock(mutex_);
  if (anchors_.empty() && !take_anchor()) {
    ++dropped_;
    return -1;
  }
  const int begin_slot = take_slot();
  const int end_slot = begin_slot < 0 ? -1 : take_slot();
  if (end_slot < 0) {
    if (begin_slot >= 0) free_.push_back(begin_slot);
    ++dropped_;
    return -1;
  }
  Pending& p = pending_[begin_slot];
  p.begin_slot = begin_slot;
  p.end_slot = end_slot;
  p.anchor = anchors_.back().id;
  p.closed = false;
  std::copy(std::begin(name), std::end(name), p.event.name);
  p.event.category = category;
  p.event.step = step;
  p.event.lane = lane;
  try {
    clock_->record(begin_slot, stream);
  } catch (...) {  // the span was never open: its events go back
    free_.push_back(end_slot);
    free_.push_back(begin_slot);
    throw;
  }
  ++anchors_.back().users;
  order_.push_back(begin_slot);
  return begin_slot;
}

// Note [gpu span end]: end() runs in the destructors of trace::Span and
// trace::GpuSpan, often while an exception from the same device unwinds, and
// a CUDA error there (a sticky one: an illegal address) would make
// cudaEventRecord fail too. It must not throw: the span is dropped and
// counted, and its events go back to the pool.
void GpuTimeline::end(int id, kernels::CudaStream stream) noexcept {
  std::lock_guard lock(mutex_);
  Pending& p = pending_[id];
  try {
    clock_->record(p.end_slot, stream);
  } catch (...) {
    --anchor_of(p).users;
    free_.push_back(p.begin_slot);
    free_.push_back(p.end_slot);
    order_.erase(std::find(order_.begin(), order_.end(), id));
    retire_anchors();
    ++dropped_;
    return;
  }
  p.closed = true;
}

void GpuTimeline::resolve(bool wait, std::int64_t now_ns, std::vector<GpuSpanEvent>& out) {
  std::lock_guard lock(mutex_);
  out.insert(out.end(), early_.begin(), early_.end());
  early_.clear();
  for (auto it = order_.begin(); it != order_.end();) {
    Pending& p = pending_[*it];
    if (p.closed && wait) clock_->wait(p.end_slot);
    if (!p.closed || !(wait || clock_->done(p.end_slot))) {
      ++it;
      continue;
    }
    out.push_back(settle(p));
    it = order_.erase(it);
  }
  retire_anchors();
  if (anchors_.empty() || now_ns - anchors_.back().host_ns <= reanchor_after_ns_) return;
  if (order_.empty()) {  // nothing measures from it: the next begin() anchors afresh
    free_.push_back(anchors_.back().slot);
    anchors_.pop_back();
  } else {
    take_anchor();
  }
}

std::uint64_t GpuTimeline::take_dropped() {
  std::lock_guard lock(mutex_);
  return std::exchange(dropped_, 0);
}

std::int64_t GpuTimeline::anchor_uncertainty_ns() const {
  std::lock_guard lock(mutex_);
  return uncertainty_ns_;
}

int GpuTimeline::events_in_use() const {
  std::lock_guard lock(mutex_);
  return clock_->slots() - static_cast<int>(free_.size());
}

}  // namespace lockstep::core::trace::detail
