// The timeline trace (engine/core/trace.h): per-thread span buffers of fixed
// capacity, a registry of them, and the Chrome trace-event JSON writer (the
// GPU streams' tracks come from trace_gpu.cpp); the step breakdown's
// thread-local sums and the profile's per-thread tables.
#include "engine/core/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/core/detail/trace_gpu.h"
#include "engine/core/json.h"
#include "engine/core/log.h"
#include "engine/core/output_file.h"
#include "kernels/error.h"

#if LOCKSTEP_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace lockstep::core::trace {

namespace detail {
std::atomic<unsigned> recording{0};

void copy_name(char (&out)[kNameBytes], std::string_view name, std::string_view detail) {
  std::size_t n = std::min(name.size(), sizeof out - 1);
  std::memcpy(out, name.data(), n);
  if (!detail.empty() && n + 1 < sizeof out - 1) {
    out[n++] = ' ';
    const std::size_t m = std::min(detail.size(), sizeof out - 1 - n);
    std::memcpy(out + n, detail.data(), m);
    n += m;
  }
  out[n] = '\0';
}

}  // namespace detail

namespace {

constexpr std::size_t kEventsPerThread = std::size_t{1} << 16;

struct Event {
  char name[kNameBytes];
  const char* category;
  std::int64_t start_ns;
  std::int64_t duration_ns;  // -1: an instant
  std::int64_t step;
};

// Note [lock-free buffers]: only the owning thread writes a buffer. It fills
// slot `size` and then publishes it with a release store; finish() reads
// `size` with an acquire load and never looks past it. The slots never move
// (fixed capacity), so a reader and the writer never touch the same slot; a
// full buffer counts what it drops instead of growing.
struct Buffer {
  std::unique_ptr<Event[]> events{new Event[kEventsPerThread]};
  std::atomic<std::size_t> size{0};
  std::atomic<std::uint64_t> dropped{0};
  std::string thread_name;  // under State::mutex
  int tid = 0;
  // The profile's sums by span name, this thread's; the owner takes the lock
  // per span, finish_profile() once, so it is never contended in a step.
  struct Sum {
    std::int64_t count = 0, total_ns = 0, max_ns = 0;
  };
  struct NameHash : std::hash<std::string_view> {
    using is_transparent = void;
  };
  std::mutex profile_mutex;
  std::unordered_map<std::string, Sum, NameHash, std::equal_to<>> profile;
};

struct State {
  std::mutex mutex;
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::filesystem::path directory;
  int rank = 0;
  // The window's ends, read by every thread that begins a span (Note [span step]).
  std::atomic<std::int64_t> first{1}, last{INT64_MAX};
  std::atomic<std::int64_t> step{0};
  Clock::time_point sync;
  std::atomic<bool> enabled{false};
  std::atomic<bool> profiling{false};
  std::atomic<std::int64_t> profile_start_ns{0};  // 0: no step has begun since enable_profile()
};

State& state() {
  static State s;
  return s;
}

thread_local std::shared_ptr<Buffer> t_buffer;
thread_local std::string t_name;
thread_local std::int64_t t_part_ns[4];  // Note [step breakdown], indexed by Part

std::int64_t ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Buffer& buffer() {
  if (!t_buffer) {
    State& s = state();
    auto b = std::make_shared<Buffer>();
    std::lock_guard lock(s.mutex);
    b->tid = static_cast<int>(s.buffers.size());
    b->thread_name = t_name.empty() ? fmt::format("thread {}", b->tid) : t_name;
    s.buffers.push_back(b);
    t_buffer = std::move(b);
  }
  return *t_buffer;
}

void record(const char (&name)[kNameBytes], const char* category, std::int64_t start_ns,
            std::int64_t duration_ns, std::int64_t step) {
  Buffer& b = buffer();
  const std::size_t i = b.size.load(std::memory_order_relaxed);
  if (i == kEventsPerThread) {
    b.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Event& e = b.events[i];
  std::memcpy(e.name, name, sizeof e.name);
  e.category = category;
  e.start_ns = start_ns;
  e.duration_ns = duration_ns;
  e.step = step;
  b.size.store(i + 1, std::memory_order_release);
}

void update_recording() {
  State& s = state();
  const std::int64_t step = s.step.load(std::memory_order_relaxed);
  const bool traced = s.enabled && step >= s.first && step <= s.last;
  const bool profiled = s.profiling && step >= 1;
  if (profiled && s.profile_start_ns.load(std::memory_order_relaxed) == 0)
    s.profile_start_ns.store(ns(Clock::now()), std::memory_order_relaxed);
  detail::recording.store((traced ? detail::kTraced : 0u) | (profiled ? detail::kProfiled : 0u),
                          std::memory_order_relaxed);
}

void add_to_profile(const char (&name)[kNameBytes], std::int64_t duration_ns) {
  Buffer& b = buffer();
  std::lock_guard lock(b.profile_mutex);
  if (!state().profiling.load(std::memory_order_relaxed)) return;  // finish_profile() ran
  auto it = b.profile.find(std::string_view(name));
  if (it == b.profile.end()) it = b.profile.emplace(name, Buffer::Sum{}).first;
  ++it->second.count;
  it->second.total_ns += duration_ns;
  it->second.max_ns = std::max(it->second.max_ns, duration_ns);
}

double us(std::int64_t t) { return static_cast<double>(t) / 1e3; }

// One trace event per line of the file, each an object the JSON library
// formats (Note [JSON by a library]); only the document's fixed frame around
// them is literal text, so that a trace of 10^5 events is never held twice.
void append_line(std::string& out, const Json& event) {
  out += ",\n";
  out += event.dump();
}

void append_track_name(std::string& out, int rank, int tid, const std::string& name) {
  append_line(out, Json::object()
                       .set("name", "thread_name")
                       .set("ph", "M")
                       .set("ts", 0)
                       .set("pid", rank)
                       .set("tid", tid)
                       .set("args", Json::object().set("name", name)));
}

// A complete event, or an instant when duration_ns < 0; a GPU span says so in
// its args ("gpu": true), which is how tools/trace.py tells them apart.
void append_event(std::string& out, int rank, int tid, const char* name, const char* category,
                  std::int64_t start_ns, std::int64_t duration_ns, std::int64_t step, bool gpu) {
  Json event = Json::object()
                   .set("name", name)
                   .set("cat", category)
                   .set("ph", duration_ns < 0 ? "i" : "X")
                   .set("ts", us(start_ns));
  if (duration_ns >= 0)
    event.set("dur", us(duration_ns));
  else
    event.set("s", "t");
  Json args = Json::object().set("step", step);
  if (gpu) args.set("gpu", true);
  append_line(out, event.set("pid", rank).set("tid", tid).set("args", std::move(args)));
}

std::int64_t parse_step(std::string_view text, std::string_view window, std::string_view what,
                        std::int64_t fallback) {
  if (text.empty()) return fallback;
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 1)
    throw InvalidArgument(
        fmt::format("{} '{}': '{}' is not a step number (1 or more)", what, window, text));
  return v;
}

}  // namespace

StepWindow parse_step_window(std::string_view text, std::string_view what) {
  const std::size_t colon = text.find(':');
  if (colon == std::string_view::npos)
    throw InvalidArgument(fmt::format(
        "{} '{}' is not a window of steps; give FIRST:LAST, e.g. 10:20 (either may be empty)", what,
        text));
  StepWindow w{parse_step(text.substr(0, colon), text, what, 1),
               parse_step(text.substr(colon + 1), text, what, INT64_MAX)};
  if (w.first > w.last)
    throw InvalidArgument(fmt::format(
        "{} '{}' ends before it begins; give FIRST:LAST with FIRST <= LAST", what, text));
  return w;
}

const char* category_of(Part part) {
  switch (part) {
    case Part::data:
      return "data";
    case Part::compute:
      return "compute";
    case Part::comm:
      return "comm";
    case Part::optimizer:
      return "optimizer";
  }
  return "?";
}

void reset_breakdown() {
  for (std::int64_t& part : t_part_ns) part = 0;
}

Breakdown breakdown() {
  const auto ms = [](std::int64_t t) { return static_cast<double>(t) / 1e6; };
  return {ms(t_part_ns[0]), ms(t_part_ns[1]), ms(t_part_ns[2]), ms(t_part_ns[3])};
}

void enable(const std::filesystem::path& directory, int rank, StepWindow window) {
  State& s = state();
  {
    std::lock_guard lock(s.mutex);
    if (s.enabled)
      throw InvalidArgument(
          fmt::format("trace::enable: tracing already writes to {}", s.directory.string()));
    std::error_code ec;
    std::filesystem::create_directories(directory, ec);
    if (ec)
      throw InvalidArgument(fmt::format("trace::enable: cannot create the trace directory {}: {}",
                                        directory.string(), ec.message()));
    s.directory = directory;
    s.rank = rank;
    s.first = window.first;
    s.last = window.last;
    s.sync = Clock::now();
    s.enabled = true;
  }
  set_thread_name("main");
  update_recording();
}

bool enabled() { return state().enabled.load(); }

void set_step(std::int64_t step) {
  state().step.store(step, std::memory_order_relaxed);
  update_recording();
  detail::gpu_resolve(false);  // Note [gpu event pool]
}

void set_thread_name(std::string_view name) {
  t_name = name;
  if (t_buffer) {
    std::lock_guard lock(state().mutex);
    t_buffer->thread_name = name;
  }
}

void instant(std::string_view name, const char* category) {
  if (!(detail::recording.load(std::memory_order_relaxed) & detail::kTraced)) return;
  char text[kNameBytes];
  detail::copy_name(text, name, {});
  record(text, category, ns(Clock::now()), -1, state().step.load(std::memory_order_relaxed));
#if LOCKSTEP_WITH_CUDA
  nvtxMarkA(text);
#endif
}

// Note [span step]: a span belongs to the step it began in. Another thread
// (a loader) may read `mode` for step 9 just before the main thread sets step
// 10; the step is read here once more and decides, so that a traced span's
// step always lies in the window and a profiled one's is 1 or more.
std::int64_t detail::traced_step() {
  const State& s = state();
  const std::int64_t step = s.step.load(std::memory_order_relaxed);
  return step >= s.first.load(std::memory_order_relaxed) &&
                 step <= s.last.load(std::memory_order_relaxed)
             ? step
             : -1;
}

void Span::begin(unsigned mode, std::string_view name, std::string_view detail,
                 const char* category, const Stream* stream) {
  const State& s = state();
  step_ = s.step.load(std::memory_order_relaxed);
  if (step_ < s.first.load(std::memory_order_relaxed) ||
      step_ > s.last.load(std::memory_order_relaxed))
    mode &= ~detail::kTraced;
  if (step_ < 1) mode &= ~detail::kProfiled;
  if (!mode) {
    start_ = Clock::now();
    return;
  }
  detail::copy_name(name_, name, detail);
  category_ = category;
  // The GPU span first: it may throw (a CUDA error), and then mode_ is still 0
  // and no NVTX range is open, so a destructor that runs ends nothing.
  if (stream && (mode & detail::kTraced)) {
    gpu_ = detail::gpu_begin(*stream, name_, category, step_);
    if (gpu_.timeline) mode |= kGpu;
  }
  mode_ = mode;
#if LOCKSTEP_WITH_CUDA
  nvtxRangePushA(name_);
#endif
  start_ = Clock::now();
}

void Span::end() {
  const auto stop = Clock::now();
  const std::int64_t duration_ns = ns(stop) - ns(start_);
  if (part_ >= 0) t_part_ns[part_] += duration_ns;
  if (!mode_) return;
  if (mode_ & kGpu) detail::gpu_end(gpu_);
#if LOCKSTEP_WITH_CUDA
  nvtxRangePop();
#endif
  // A span that began in the window ends in the trace even if the window closed meanwhile.
  if ((mode_ & detail::kTraced) && state().enabled)
    record(name_, category_, ns(start_), duration_ns, step_);
  if (mode_ & detail::kProfiled) add_to_profile(name_, duration_ns);
}

std::filesystem::path finish() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.enabled) return {};
  s.enabled = false;
  update_recording();
  detail::gpu_resolve(true);
  std::string out = "{\"traceEvents\": [\n";
  out += Json::object()
             .set("name", "process_name")
             .set("ph", "M")
             .set("ts", 0)
             .set("pid", s.rank)
             .set("tid", 0)
             .set("args", Json::object().set("name", fmt::format("rank {}", s.rank)))
             .dump();
  std::uint64_t dropped = 0;
  for (const auto& b : s.buffers) {
    append_track_name(out, s.rank, b->tid, b->thread_name);
    dropped += b->dropped.load(std::memory_order_relaxed);
    const std::size_t n = b->size.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n; ++i) {
      const Event& e = b->events[i];
      append_event(out, s.rank, b->tid, e.name, e.category, e.start_ns, e.duration_ns, e.step,
                   false);
    }
  }
  const detail::GpuTracks gpu = detail::take_gpu_tracks();
  for (const detail::GpuTrack& track : gpu.tracks) {
    append_track_name(out, s.rank, track.tid, track.name);
    for (const detail::GpuSpanEvent& e : track.spans)
      append_event(out, s.rank, track.tid, e.name, e.category, e.start_ns, e.duration_ns, e.step,
                   true);
  }
  out += "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": ";
  out += Json::object()
             .set("rank", s.rank)
             .set("clock_sync_us", us(ns(s.sync)))
             .set("dropped_events", dropped)
             .set("dropped_gpu_spans", gpu.dropped)
             .set("gpu_anchor_uncertainty_us", us(gpu.anchor_uncertainty_ns))
             .dump();
  out += "}\n";
  const std::filesystem::path file = s.directory / fmt::format("rank-{}.json", s.rank);
  for (const auto& b : s.buffers) b->size.store(0, std::memory_order_relaxed);
  try {
    write_file(file, out, "the trace file");  // Note [one way to write a file]
  } catch (const OutputFileError& e) {
    report_write_failure("the trace file " + file.string(),
                         fmt::format("{} (the trace is lost; the run goes on)", e.reason()));
    return {};
  }
  return file;
}

void enable_profile() {
  State& s = state();
  s.profile_start_ns.store(0, std::memory_order_relaxed);
  s.profiling = true;
  update_recording();
}

Profile finish_profile() {
  State& s = state();
  if (!s.profiling.exchange(false)) return {};
  update_recording();
  Profile p;
  const std::int64_t start = s.profile_start_ns.load(std::memory_order_relaxed);
  if (start != 0) p.wall_ms = static_cast<double>(ns(Clock::now()) - start) / 1e6;
  std::unordered_map<std::string, Buffer::Sum> sums;  // over the threads
  {
    std::lock_guard lock(s.mutex);
    for (const auto& b : s.buffers) {
      std::lock_guard own(b->profile_mutex);
      for (const auto& [name, sum] : b->profile) {
        Buffer::Sum& all = sums[name];
        all.count += sum.count;
        all.total_ns += sum.total_ns;
        all.max_ns = std::max(all.max_ns, sum.max_ns);
      }
      b->profile.clear();
    }
  }
  for (const auto& [name, sum] : sums)
    p.rows.push_back({name, sum.count, static_cast<double>(sum.total_ns) / 1e6,
                      static_cast<double>(sum.max_ns) / 1e6});
  std::sort(p.rows.begin(), p.rows.end(), [](const ProfileRow& a, const ProfileRow& b) {
    return a.total_ms != b.total_ms ? a.total_ms > b.total_ms : a.name < b.name;
  });
  return p;
}

std::string format_profile(const Profile& p) {
  std::size_t width = 4;
  for (const ProfileRow& r : p.rows) width = std::max(width, r.name.size());
  std::string out = fmt::format("{:<{}} {:>8} {:>12} {:>10} {:>10} {:>8}\n", "span", width, "count",
                                "total ms", "mean ms", "max ms", "% of run");
  for (const ProfileRow& r : p.rows)
    out += fmt::format("{:<{}} {:>8} {:>12.3f} {:>10.3f} {:>10.3f} {:>8.1f}\n", r.name, width,
                       r.count, r.total_ms, r.total_ms / static_cast<double>(r.count), r.max_ms,
                       p.wall_ms > 0 ? 100 * r.total_ms / p.wall_ms : 0.0);
  return out;
}

}  // namespace lockstep::core::trace
