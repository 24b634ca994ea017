// What the trace's writer (engine/core/trace.cpp) asks of its GPU side
// (engine/core/trace_gpu.cpp): GPU spans opened and closed on streams, resolved
// at each step's start and at finish, and handed out per stream track.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/detail/gpu_timeline.h"
#include "engine/core/device.h"

namespace lockstep::core::trace::detail {

// The step now when spans begun now are traced (in the window), else -1
// (Note [span step], trace.cpp).
std::int64_t traced_step();
// A span's name: `name`, a space and `detail`, cut to fit.
void copy_name(char (&out)[kNameBytes], std::string_view name, std::string_view detail);

// Opens a GPU span of `name` on `stream` when it is a GPU stream; returns a
// slot with a null timeline otherwise, or when the span was dropped.
GpuSlot gpu_begin(const Stream& stream, const char (&name)[kNameBytes], const char* category,
                  std::int64_t step);
void gpu_end(const GpuSlot& slot) noexcept;  // Note [gpu span end], gpu_timeline.cpp

// Resolves the GPU spans whose end has happened (all of them, waiting, with
// `wait`). Cheap when no GPU span was ever opened.
void gpu_resolve(bool wait);

// A stream's track in the trace: its tid, its name, its resolved spans.
struct GpuTrack {
  int tid;
  std::string name;
  std::vector<GpuSpanEvent> spans;
};
struct GpuTracks {
  std::vector<GpuTrack> tracks;  // the streams with spans, by tid
  std::uint64_t dropped = 0;     // spans lost to a full pool or a full store
  std::int64_t anchor_uncertainty_ns = 0;
};
// Hands out the resolved spans (call gpu_resolve(true) first) and forgets them.
GpuTracks take_gpu_tracks();

// The first tid of the stream tracks; threads count up from 0.
inline constexpr int kFirstStreamTid = 1000;

// Where a device's events come from: CUDA events on CUDA builds (nothing on
// others). Tests put a fake in (nullptr: back to the default); that also
// forgets every timeline and track.
using EventClockFactory = std::function<std::unique_ptr<EventClock>(Device)>;
void set_event_clock_factory(EventClockFactory factory);

}  // namespace lockstep::core::trace::detail
