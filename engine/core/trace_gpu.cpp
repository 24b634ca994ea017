// The GPU side of the timeline trace (engine/core/detail/trace_gpu.h): the
// stream tracks and their names, one GpuTimeline per device made on its first
// GPU span, CUDA events as its clock, and GpuSpan.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/detail/trace_gpu.h"
#include "engine/core/stream.h"

#if LOCKSTEP_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/check.h"
#endif

namespace lockstep::core::trace {

namespace detail {
namespace {

// Resolved spans kept until finish(), as a thread's buffer keeps events.
constexpr std::size_t kSpansKept = std::size_t{1} << 18;
constexpr std::int64_t kReanchorAfterNs = 1'000'000'000;  // Note [gpu anchor]

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

#if LOCKSTEP_WITH_CUDA
// Events per device: two a span in flight (Note [gpu event pool]); a step of
// the largest models here has a few hundred GPU spans.
constexpr int kEventsPerDevice = 2048;

// CUDA events with timing, made once per device, and a stream of their own
// for the anchors (non-blocking: it never waits for the legacy stream).
class CudaEventClock final : public EventClock {
 public:
  explicit CudaEventClock(Device device) : device_(device) {
    set_current_device(device_);
    events_.resize(kEventsPerDevice);
    for (cudaEvent_t& e : events_) LOCKSTEP_CHECK_CUDA(cudaEventCreate(&e));
    LOCKSTEP_CHECK_CUDA(cudaStreamCreateWithFlags(&anchor_stream_, cudaStreamNonBlocking));
  }
  // Never destroyed (Note [gpu tracks]), so no destructor frees the events.
  CudaEventClock(const CudaEventClock&) = delete;
  CudaEventClock& operator=(const CudaEventClock&) = delete;

  int slots() const override { return kEventsPerDevice; }
  void record(int slot, kernels::CudaStream stream) override {
    set_current_device(device_);  // Note [default stream device], stream.cpp
    LOCKSTEP_CHECK_CUDA(cudaEventRecord(events_[slot], stream));
  }
  bool done(int slot) override {
    const cudaError_t status = cudaEventQuery(events_[slot]);
    if (status == cudaErrorNotReady) {
      cudaGetLastError();  // "not yet" is no failure (Event::ready, stream.cpp)
      return false;
    }
    LOCKSTEP_CHECK_CUDA(status);
    return true;
  }
  void wait(int slot) override { LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(events_[slot])); }
  float elapsed_ms(int from, int to) override {
    float ms = 0;
    LOCKSTEP_CHECK_CUDA(cudaEventElapsedTime(&ms, events_[from], events_[to]));
    return ms;
  }
  HostBracket anchor(int slot) override {
    set_current_device(device_);
    HostBracket b;
    b.before_ns = now_ns();
    LOCKSTEP_CHECK_CUDA(cudaEventRecord(events_[slot], anchor_stream_));
    LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(events_[slot]));
    b.after_ns = now_ns();
    return b;
  }

 private:
  Device device_;
  std::vector<cudaEvent_t> events_;
  cudaStream_t anchor_stream_ = nullptr;
};
#endif

std::unique_ptr<EventClock> default_clock([[maybe_unused]] Device device) {
#if LOCKSTEP_WITH_CUDA
  return std::make_unique<CudaEventClock>(device);
#else
  return nullptr;  // a cpu build makes no GPU streams
#endif
}

struct Lane {
  int index;
  std::string name;
};

// Note [gpu tracks]: a stream's track is keyed by its device and handle (the
// null handle: the device's legacy default stream). A device's timeline, with
// its event pool, is made on its first GPU span and kept until the process
// ends (Note [gpu event pool]), as the default streams' GEMM workspaces are:
// destroying CUDA events from a static destructor may run after CUDA itself
// has shut down.
struct GpuState {
  std::mutex mutex;
  EventClockFactory factory = default_clock;
  std::map<int, GpuTimeline*> timelines;  // by device index; never freed (above)
  // Timelines that set_event_clock_factory replaced: kept, never freed, as
  // an open span may still point at one.
  std::vector<GpuTimeline*> retired;
  std::map<std::pair<int, kernels::CudaStream>, Lane> lanes;
  std::vector<GpuSpanEvent> resolved;
  std::uint64_t dropped = 0;
  std::atomic<bool> used{false};  // a GPU span was ever opened
};

GpuState& gpu_state() {
  static auto* s = new GpuState;  // never destroyed: Note [gpu tracks]
  return *s;
}

Lane& lane_of(GpuState& g, const Stream& stream) {
  const auto key = std::make_pair(stream.device().index, stream.handle());
  auto it = g.lanes.find(key);
  if (it == g.lanes.end()) {
    const int index = static_cast<int>(g.lanes.size());
    it = g.lanes.emplace(key, Lane{index, fmt::format("cuda stream {}", index)}).first;
  }
  return it->second;
}

}  // namespace

GpuSlot gpu_begin(const Stream& stream, const char (&name)[kNameBytes], const char* category,
                  std::int64_t step) {
  if (!stream.device().is_cuda()) return {nullptr, -1, nullptr};
  // Events recorded while the stream captures a CUDA graph are the graph's:
  // their times cannot be read, so captured work has no GPU spans.
  if (stream.capturing()) return {nullptr, -1, nullptr};
  GpuState& g = gpu_state();
  GpuTimeline* timeline = nullptr;
  int lane = 0;
  {
    std::lock_guard lock(g.mutex);
    GpuTimeline*& t = g.timelines[stream.device().index];
    if (!t) {
      std::unique_ptr<EventClock> clock = g.factory(stream.device());
      if (!clock) return {nullptr, -1, nullptr};
      t = new GpuTimeline(std::move(clock), kReanchorAfterNs);
    }
    timeline = t;
    lane = lane_of(g, stream).index;
  }
  g.used.store(true, std::memory_order_relaxed);
  const int id = timeline->begin(stream.handle(), lane, name, category, step);
  if (id < 0) return {nullptr, -1, nullptr};
  return {timeline, id, stream.handle()};
}

void gpu_end(const GpuSlot& slot) noexcept { slot.timeline->end(slot.id, slot.stream); }

void gpu_resolve(bool wait) {
  GpuState& g = gpu_state();
  if (!g.used.load(std::memory_order_relaxed)) return;
  std::vector<GpuTimeline*> timelines;
  {
    std::lock_guard lock(g.mutex);
    for (const auto& [device, t] : g.timelines) timelines.push_back(t);
  }
  std::vector<GpuSpanEvent> out;
  for (GpuTimeline* t : timelines) t->resolve(wait, now_ns(), out);
  std::lock_guard lock(g.mutex);
  const std::size_t room = kSpansKept - std::min(kSpansKept, g.resolved.size());
  g.resolved.insert(g.resolved.end(), out.begin(), out.begin() + std::min(room, out.size()));
  g.dropped += out.size() - std::min(room, out.size());
}

GpuTracks take_gpu_tracks() {
  GpuState& g = gpu_state();
  std::lock_guard lock(g.mutex);
  GpuTracks out;
  std::map<int, GpuTrack> by_lane;
  for (const auto& [key, lane] : g.lanes)
    by_lane.emplace(lane.index, GpuTrack{kFirstStreamTid + lane.index, lane.name, {}});
  for (const GpuSpanEvent& e : g.resolved) by_lane.at(e.lane).spans.push_back(e);
  for (auto& [index, track] : by_lane)
    if (!track.spans.empty()) out.tracks.push_back(std::move(track));
  out.dropped = std::exchange(g.dropped, 0);
  for (const auto& [device, t] : g.timelines) {
    out.dropped += t->take_dropped();
    out.anchor_uncertainty_ns = std::max(out.anchor_uncertainty_ns, t->anchor_uncertainty_ns());
  }
  g.resolved.clear();
  return out;
}

void set_event_clock_factory(EventClockFactory factory) {
  GpuState& g = gpu_state();
  std::lock_guard lock(g.mutex);
  g.factory = factory ? std::move(factory) : default_clock;
  for (const auto& [device, t] : g.timelines) g.retired.push_back(t);
  g.timelines.clear();
  g.lanes.clear();
  g.resolved.clear();
  g.dropped = 0;
}

}  // namespace detail

void set_stream_name(const Stream& stream, std::string_view name) {
  if (!stream.device().is_cuda()) return;
  detail::GpuState& g = detail::gpu_state();
  std::lock_guard lock(g.mutex);
  detail::lane_of(g, stream).name = name;
}

bool GpuSpan::begin(const Stream& stream, std::string_view name, std::string_view detail,
                    const char* category) {
  const std::int64_t step = detail::traced_step();
  if (step < 0 || !stream.device().is_cuda()) return false;
  char text[kNameBytes];
  detail::copy_name(text, name, detail);
  gpu_ = detail::gpu_begin(stream, text, category, step);
  return gpu_.timeline != nullptr;
}

void GpuSpan::close() { detail::gpu_end(gpu_); }

}  // namespace lockstep::core::trace
