// The GPU side of the timeline trace without a GPU: GpuTimeline over a fake
// event clock whose device times the test sets (the anchor arithmetic against
// device time plus a known offset, the order and the completion rule, the
// event pool's reuse and exhaustion, re-anchoring), and the whole path from a
// trace::Span given a cuda stream to the trace file, with the fake put in
// through set_event_clock_factory. The CUDA clock itself is tested by
// tests/engine/gpu/test_trace_gpu.cpp.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/detail/gpu_timeline.h"
#include "engine/core/detail/trace_gpu.h"
#include "engine/core/stream.h"
#include "engine/core/trace.h"
#include "support/read_text.h"

using namespace lockstep;
namespace trace = lockstep::core::trace;
namespace detail = lockstep::core::trace::detail;

namespace {

// The device as the test sees it: `device_ms` is the device time an event
// recorded now will carry; events up to `completed_ms` have happened. The
// host clock is the device's plus `offset_ns`, and an anchor's bracket is
// `half_width_ns` either side of its true host time.
struct FakeDevice {
  int slots = 64;
  double device_ms = 0, completed_ms = -1;
  std::int64_t offset_ns = 5'000'000'000;
  std::int64_t half_width_ns = 2000;
  bool auto_advance = false;  // each record 1 ms later, everything done at once
  bool broken = false;        // record() fails, as on a device with a sticky CUDA error
  std::vector<double> stamp_ms = std::vector<double>(64, -1);
  int records = 0, waits = 0, anchors = 0, clocks_made = 0;
};

class FakeClock final : public detail::EventClock {
 public:
  explicit FakeClock(std::shared_ptr<FakeDevice> d) : d_(std::move(d)) {}
  int slots() const override { return d_->slots; }
  void record(int slot, kernels::CudaStream) override {
    if (d_->broken) throw std::runtime_error("fake: the device is broken");
    ++d_->records;
    if (d_->auto_advance) d_->device_ms += 1.0;
    d_->stamp_ms[slot] = d_->device_ms;
  }
  bool done(int slot) override {
    return d_->auto_advance || d_->stamp_ms[slot] <= d_->completed_ms;
  }
  void wait(int slot) override {
    ++d_->waits;
    d_->completed_ms = std::max(d_->completed_ms, d_->stamp_ms[slot]);
  }
  float elapsed_ms(int from, int to) override {
    REQUIRE(done(from));
    REQUIRE(done(to));
    return static_cast<float>(d_->stamp_ms[to] - d_->stamp_ms[from]);
  }
  detail::HostBracket anchor(int slot) override {
    ++d_->anchors;
    d_->stamp_ms[slot] = d_->device_ms;
    d_->completed_ms = std::max(d_->completed_ms, d_->device_ms);
    const std::int64_t host = host_ns(d_->device_ms);
    return {host - d_->half_width_ns, host + d_->half_width_ns};
  }
  std::int64_t host_ns(double device_ms) const {
    return d_->offset_ns + static_cast<std::int64_t>(device_ms * 1e6 + 0.5);
  }

 private:
  std::shared_ptr<FakeDevice> d_;
};

struct Fixture {
  std::shared_ptr<FakeDevice> device = std::make_shared<FakeDevice>();
  detail::GpuTimeline timeline;
  // A stream handle is only passed through to the clock.
  kernels::CudaStream stream = nullptr;
  explicit Fixture(std::int64_t reanchor_after_ns = 1'000'000'000, int slots = 64)
      : device(make(slots)), timeline(std::make_unique<FakeClock>(device), reanchor_after_ns) {}
  static std::shared_ptr<FakeDevice> make(int slots) {
    auto d = std::make_shared<FakeDevice>();
    d->slots = slots;
    d->stamp_ms.assign(static_cast<std::size_t>(slots), -1);
    return d;
  }
  std::int64_t host_ns(double device_ms) const { return FakeClock(device).host_ns(device_ms); }
  int span(const char* text, double begin_ms, double end_ms, std::int64_t step = 1, int lane = 0) {
    char name[trace::kNameBytes] = {};
    std::strncpy(name, text, sizeof name - 1);
    device->device_ms = begin_ms;
    const int id = timeline.begin(stream, lane, name, "compute", step);
    if (id >= 0) {
      device->device_ms = end_ms;
      timeline.end(id, stream);
    }
    return id;
  }
};

}  // namespace

TEST_CASE("an event's host time is the anchor's plus its elapsed time", "[core][trace]") {
  CHECK(detail::host_ns_after(1'000'000'000, 1.5f) == 1'001'500'000);
  CHECK(detail::host_ns_after(7, 0.0f) == 7);
  CHECK(detail::host_ns_after(0, 0.0004f) == 400);  // rounded to the nanosecond
  // 1000 ms, the re-anchoring limit, is held by a float to within 61 ns (its ulp there).
  CHECK(std::llabs(detail::host_ns_after(0, 999.999f) - 999'999'000) <= 61);
}

TEST_CASE("GPU spans resolve to the host clock once their end has happened, in order",
          "[core][trace]") {
  Fixture f;  // the anchor is taken on the first begin, at device time 10 ms
  const int a = f.span("forward fc1", 10.0, 12.5, 2);
  const int b = f.span("forward fc2", 12.5, 20.25, 2, 1);
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  CHECK(f.device->anchors == 1);
  CHECK(f.timeline.anchor_uncertainty_ns() == f.device->half_width_ns);
  std::vector<detail::GpuSpanEvent> out;
  f.timeline.resolve(false, f.host_ns(20.0), out);
  CHECK(out.empty());  // nothing has happened yet
  f.device->completed_ms = 15.0;
  f.timeline.resolve(false, f.host_ns(20.0), out);
  REQUIRE(out.size() == 1);  // only the first span's end has happened
  // The reference: the fake's device times plus its offset, in double. The
  // elapsed times pass through a float (a few ms: an ulp under 1 ns), and the
  // anchor sits at its bracket's middle, which is exact here: 2 ns.
  CHECK(std::string(out[0].name) == "forward fc1");
  CHECK(std::llabs(out[0].start_ns - f.host_ns(10.0)) <= 2);
  CHECK(std::llabs(out[0].duration_ns - 2'500'000) <= 2);
  CHECK(out[0].step == 2);
  CHECK(out[0].lane == 0);
  out.clear();
  f.timeline.resolve(true, f.host_ns(21.0), out);  // waits for the rest
  REQUIRE(out.size() == 1);
  CHECK(std::string(out[0].name) == "forward fc2");
  CHECK(std::llabs(out[0].start_ns - f.host_ns(12.5)) <= 2);
  CHECK(std::llabs(out[0].duration_ns - 7'750'000) <= 2);
  CHECK(out[0].lane == 1);
  CHECK(f.timeline.events_in_use() == 1);  // the anchor alone
}

TEST_CASE("an open GPU span is never resolved, even when waiting", "[core][trace]") {
  Fixture f;
  char name[trace::kNameBytes] = "optimizer";
  const int open = f.timeline.begin(f.stream, 0, name, "optimizer", 1);
  REQUIRE(open >= 0);
  f.device->completed_ms = 1e9;
  std::vector<detail::GpuSpanEvent> out;
  f.timeline.resolve(true, 0, out);
  CHECK(out.empty());
  f.timeline.end(open, f.stream);
  f.timeline.resolve(false, 0, out);
  CHECK(out.size() == 1);
}

TEST_CASE("the event pool is reused: a full pool waits for its oldest closed span",
          "[core][trace]") {
  // 7 events: the anchor and three spans of two.
  Fixture f(1'000'000'000, 7);
  for (int i = 0; i < 3; ++i) REQUIRE(f.span("backward", i, i + 0.5) >= 0);
  CHECK(f.timeline.events_in_use() == 7);
  CHECK(f.device->waits == 0);
  // A fourth span takes the first one's events, after waiting for its end.
  REQUIRE(f.span("backward fc9", 3, 3.5) >= 0);
  CHECK(f.device->waits == 1);
  CHECK(f.timeline.events_in_use() == 7);
  std::vector<detail::GpuSpanEvent> out;
  f.timeline.resolve(true, f.host_ns(4), out);
  REQUIRE(out.size() == 4);
  // The span resolved early comes first, the rest in the order they began.
  for (int i = 0; i < 4; ++i) {
    INFO(i);
    CHECK(std::llabs(out[i].start_ns - f.host_ns(i)) <= 2);
  }
  CHECK(f.timeline.events_in_use() == 1);
  CHECK(f.timeline.take_dropped() == 0);

  // When every span holding events is still open, a new one is dropped and counted.
  char name[trace::kNameBytes] = "open";
  for (int i = 0; i < 3; ++i) REQUIRE(f.timeline.begin(f.stream, 0, name, "x", 1) >= 0);
  CHECK(f.timeline.begin(f.stream, 0, name, "x", 1) == -1);
  CHECK(f.timeline.take_dropped() == 1);
  CHECK(f.timeline.take_dropped() == 0);
}

TEST_CASE("a span whose end or begin cannot be recorded gives its events back", "[core][trace]") {
  Fixture f;
  char name[trace::kNameBytes] = "broken";
  const int id = f.timeline.begin(f.stream, 0, name, "x", 1);
  REQUIRE(id >= 0);
  CHECK(f.timeline.events_in_use() == 3);  // the anchor and the span's two
  // end() runs in destructors (Note [gpu span end]): it drops the span, never throws.
  f.device->broken = true;
  f.timeline.end(id, f.stream);
  CHECK(f.timeline.take_dropped() == 1);
  CHECK(f.timeline.events_in_use() == 1);
  // begin() may throw, and then holds nothing.
  CHECK_THROWS_AS(f.timeline.begin(f.stream, 0, name, "x", 1), std::runtime_error);
  CHECK(f.timeline.events_in_use() == 1);
  std::vector<detail::GpuSpanEvent> out;
  f.timeline.resolve(true, 0, out);
  CHECK(out.empty());
  // Once the device works, spans resolve as before.
  f.device->broken = false;
  REQUIRE(f.span("after", 1, 2) >= 0);
  f.timeline.resolve(true, 0, out);
  CHECK(out.size() == 1);
}

TEST_CASE("an old anchor is replaced while spans are pending, dropped when none is",
          "[core][trace]") {
  const std::int64_t limit = 1'000'000;  // 1 ms, to keep the numbers small
  Fixture f(limit);
  REQUIRE(f.span("a", 1, 2) >= 0);
  CHECK(f.device->anchors == 1);
  std::vector<detail::GpuSpanEvent> out;
  f.device->device_ms = 5;
  f.timeline.resolve(false, f.host_ns(5), out);  // pending, and the anchor is 5 ms old
  CHECK(out.empty());
  CHECK(f.device->anchors == 2);
  CHECK(f.timeline.events_in_use() == 4);  // two anchors, one span: the old anchor is in use
  REQUIRE(f.span("b", 6, 7) >= 0);         // measured from the new anchor
  f.device->completed_ms = 7;
  f.timeline.resolve(false, f.host_ns(5.5), out);
  REQUIRE(out.size() == 2);
  CHECK(std::llabs(out[0].start_ns - f.host_ns(1)) <= 2);
  CHECK(std::llabs(out[1].start_ns - f.host_ns(6)) <= 2);
  CHECK(f.timeline.events_in_use() == 1);        // the old anchor went with its last span
  f.timeline.resolve(false, f.host_ns(9), out);  // nothing pending: the anchor is let go
  CHECK(f.timeline.events_in_use() == 0);
  CHECK(f.device->anchors == 2);
  f.device->device_ms = 20;
  REQUIRE(f.span("c", 21, 22) >= 0);  // a new anchor first
  CHECK(f.device->anchors == 3);
}

TEST_CASE("a span given a cuda stream is also a span on the stream's track of the trace file",
          "[core][trace]") {
  auto device = std::make_shared<FakeDevice>();
  device->auto_advance = true;
  detail::set_event_clock_factory([device](core::Device) {
    ++device->clocks_made;
    return std::make_unique<FakeClock>(device);
  });
  // A cuda stream's handle and device, without CUDA: nothing is called on it.
  const core::Stream gpu = core::Stream::default_for(core::Device::cuda(0));
  trace::set_stream_name(gpu, "cuda compute stream");

  // Off: not even the pool is made.
  { trace::Span optimizer("optimizer", trace::Part::optimizer, gpu); }
  { trace::GpuSpan alone(gpu, "allreduce", "bucket 0", "comm"); }
  CHECK(device->clocks_made == 0);
  CHECK(device->records == 0);

  const auto dir =
      std::filesystem::temp_directory_path() / ("lockstep-trace-gpu-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  trace::enable(dir, 3, trace::parse_step_window("2:2", "window"));
  trace::set_step(1);
  { trace::Span early("optimizer", trace::Part::optimizer, gpu); }
  trace::set_step(2);
  {
    trace::Span module;
    module.open("forward", "fc1", "module", &gpu);
  }
  { trace::Span optimizer("optimizer", trace::Part::optimizer, gpu); }
  { trace::GpuSpan alone(gpu, "allreduce", "bucket 0", "comm"); }
  trace::set_step(3);
  { trace::Span late("optimizer", trace::Part::optimizer, gpu); }
  const std::string json = test::read_text(trace::finish());
  std::filesystem::remove_all(dir);
  detail::set_event_clock_factory(nullptr);
  CHECK(device->clocks_made == 1);
  CHECK(device->anchors == 1);
  CHECK(device->records == 3 * 2);  // three spans in the window, two events each

  const std::string track = "\"tid\": " + std::to_string(detail::kFirstStreamTid);
  CHECK(json.find("{\"name\": \"thread_name\", \"ph\": \"M\", \"ts\": 0, \"pid\": 3, " + track +
                  ", \"args\": {\"name\": \"cuda compute stream\"}}") != std::string::npos);
  // Each name's lines: the host span's (main thread) where there is one, and its GPU twin's.
  const auto lines_of = [&](const std::string& name) {
    std::vector<std::string> lines;
    const std::string key = "{\"name\": \"" + name + "\", ";
    for (std::size_t at = json.find(key); at != std::string::npos; at = json.find(key, at + 1))
      lines.push_back(json.substr(at, json.find('\n', at) - at));
    return lines;
  };
  const std::string on_track = track + ", \"args\": {\"step\": 2, \"gpu\": true}}";
  for (const auto& [name, host_spans] : {std::pair<std::string, int>{"forward fc1", 1},
                                         {"optimizer", 1},
                                         {"allreduce bucket 0", 0}}) {
    INFO(name);
    const std::vector<std::string> lines = lines_of(name);
    REQUIRE(lines.size() == static_cast<std::size_t>(host_spans + 1));
    CHECK(lines.back().find("\"ph\": \"X\"") != std::string::npos);
    CHECK(lines.back().find(on_track) != std::string::npos);
    if (host_spans)
      CHECK(lines.front().find("\"tid\": 0, \"args\": {\"step\": 2}}") != std::string::npos);
  }
  CHECK(json.find("\"dropped_gpu_spans\": 0") != std::string::npos);
  CHECK(json.find("\"gpu_anchor_uncertainty_us\": 2.0}") != std::string::npos);
  trace::set_step(0);
}

// Note [gpu span end]: a GPU half that cannot begin throws from the span's
// start and leaves nothing to end (no host span, no NVTX range); one that
// cannot end is dropped and counted, and its destructor does not throw.
TEST_CASE(
    "a GPU span that fails to begin throws and ends nothing; one that fails to end is dropped",
    "[core][trace]") {
  auto device = std::make_shared<FakeDevice>();
  device->auto_advance = true;
  detail::set_event_clock_factory(
      [device](core::Device) { return std::make_unique<FakeClock>(device); });
  const core::Stream gpu = core::Stream::default_for(core::Device::cuda(0));
  const auto dir = std::filesystem::temp_directory_path() /
                   ("lockstep-trace-gpu-fail-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  trace::enable(dir, 0, trace::parse_step_window("1:1", "window"));
  trace::set_step(1);
  device->broken = true;
  {
    trace::Span module;
    CHECK_THROWS_AS(module.open("forward", "broken", "module", &gpu), std::runtime_error);
  }
  device->broken = false;
  {
    trace::GpuSpan collective(gpu, "allreduce", "broken", "comm");
    device->broken = true;
  }
  device->broken = false;
  { trace::Span optimizer("optimizer", trace::Part::optimizer, gpu); }
  const std::string json = test::read_text(trace::finish());
  std::filesystem::remove_all(dir);
  detail::set_event_clock_factory(nullptr);
  trace::set_step(0);
  CHECK(json.find("broken") == std::string::npos);
  CHECK(json.find("\"dropped_gpu_spans\": 1") != std::string::npos);
  CHECK(json.find("\"gpu\": true") != std::string::npos);  // the optimizer's, after
}
