// The timeline trace's recorder (engine/core/trace.h): the window parser, what
// is recorded in and out of the window, on several threads, and the file
// written (names escaped and cut, threads named, one event per span); the step
// breakdown against the trace's own durations; the profile's sums by name.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include <unistd.h>

#include "engine/core/trace.h"
#include "kernels/error.h"
#include "support/read_text.h"

using namespace lockstep;
namespace trace = lockstep::core::trace;

namespace {
std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("step windows parse and refuse bad text naming the flag", "[core][trace]") {
  CHECK(trace::parse_step_window("3:9", "--w").first == 3);
  CHECK(trace::parse_step_window("3:9", "--w").last == 9);
  CHECK(trace::parse_step_window(":5", "--w").first == 1);
  CHECK(trace::parse_step_window("5:", "--w").last == INT64_MAX);
  CHECK(trace::parse_step_window("4:4", "--w").first == 4);
  for (const char* bad : {"9:3", "0:2", "x", "3", "1:2x", ":0", "-1:3", "99999999999999999999:"}) {
    INFO(bad);
    CHECK_THROWS_WITH(trace::parse_step_window(bad, "--w"), Catch::Contains("--w"));
  }
}

TEST_CASE("spans inside the window are written as trace events", "[core][trace]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("lockstep-trace-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  CHECK_FALSE(trace::active());
  { trace::Span before("before enable", "test"); }
  trace::enable(dir, 7, trace::parse_step_window("2:3", "window"));
  CHECK_THROWS_AS(trace::enable(dir, 7), InvalidArgument);
  trace::set_step(1);
  CHECK_FALSE(trace::active());
  { trace::Span early("before the window", "test"); }
  trace::set_step(2);
  CHECK(trace::active());
  { trace::Span a("forward", "fc1", "test"); }
  { trace::Span quoted("say \"hi\"\\", "test"); }
  { trace::Span longer(std::string(100, 'x'), "test"); }
  trace::instant("bucket 0 ready", "test");
  std::thread worker([] {
    trace::set_thread_name("worker 0");
    for (int i = 0; i < 3; ++i) trace::Span s("work", "test");
  });
  worker.join();
  trace::set_step(4);
  CHECK_FALSE(trace::active());
  { trace::Span late("after the window", "test"); }
  const std::filesystem::path file = trace::finish();
  CHECK(file == dir / "rank-7.json");
  CHECK_FALSE(trace::active());
  const std::string json = test::read_text(file);
  std::filesystem::remove_all(dir);
  CHECK(json.rfind("{\"traceEvents\": [", 0) == 0);
  CHECK(count(json, "\"name\": \"forward fc1\"") == 1);
  CHECK(count(json, "\"name\": \"say \\\"hi\\\"\\\\\"") == 1);
  CHECK(count(json, "\"name\": \"" + std::string(47, 'x') + "\"") == 1);
  CHECK(count(json, "\"name\": \"bucket 0 ready\", \"cat\": \"test\", \"ph\": \"i\"") == 1);
  CHECK(count(json, "\"name\": \"work\"") == 3);
  CHECK(count(json, "\"args\": {\"name\": \"main\"}") == 1);
  CHECK(count(json, "\"args\": {\"name\": \"worker 0\"}") == 1);
  CHECK(count(json, "\"pid\": 7") == count(json, "\"ph\""));
  CHECK(count(json, "\"ph\": \"X\"") == 6);
  CHECK(json.find("before the window") == std::string::npos);
  CHECK(json.find("after the window") == std::string::npos);
  CHECK(json.find("before enable") == std::string::npos);
  CHECK(json.find("\"dropped_events\": 0") != std::string::npos);
}

namespace {
// The "dur" (µs) of the first complete event named `name` in a trace file's text.
double duration_us(const std::string& json, const std::string& name) {
  const std::size_t at = json.find("\"name\": \"" + name + "\"");
  REQUIRE(at != std::string::npos);
  const std::size_t dur = json.find("\"dur\": ", at);
  REQUIRE(dur != std::string::npos);
  return std::stod(json.substr(dur + 7, 32));
}

}  // namespace

TEST_CASE("a step's breakdown adds up this thread's part spans, traced or not", "[core][trace]") {
  using Clock = std::chrono::steady_clock;
  trace::set_step(0);
  REQUIRE_FALSE(trace::active());
  trace::reset_breakdown();
  const auto outer_start = Clock::now();
  {
    trace::Span wait("data wait", trace::Part::data);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const double outer_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - outer_start).count();
  { trace::Span not_a_part("allreduce", "comm"); }  // a category alone adds nothing
  std::thread other([] { trace::Span elsewhere("forward", trace::Part::compute); });
  other.join();  // another thread's parts are its own
  trace::Breakdown b = trace::breakdown();
  // sleep_for waits at least 2 ms; the span lies inside the outer clock reads.
  CHECK(b.data_wait_ms >= 2.0);
  CHECK(b.data_wait_ms <= outer_ms);
  CHECK(b.compute_ms == 0.0);
  CHECK(b.exposed_comm_ms == 0.0);
  CHECK(b.optimizer_ms == 0.0);
  {
    trace::Span sync("gradient sync wait", trace::Part::comm);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  { trace::Span agreement("agreement", trace::Part::comm); }
  CHECK(trace::breakdown().exposed_comm_ms >= 0.1);
  trace::reset_breakdown();
  b = trace::breakdown();
  CHECK(b.data_wait_ms + b.compute_ms + b.exposed_comm_ms + b.optimizer_ms == 0.0);

  // Traced, each part's sum is its events' durations: the same two clock reads.
  const auto dir =
      std::filesystem::temp_directory_path() / ("lockstep-breakdown-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  trace::enable(dir, 0);
  trace::set_step(1);
  trace::reset_breakdown();
  {
    trace::Span forward("forward", trace::Part::compute);
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  { trace::Span optimizer("optimizer", trace::Part::optimizer); }
  b = trace::breakdown();
  const std::string json = test::read_text(trace::finish());
  std::filesystem::remove_all(dir);
  CHECK(json.find("\"name\": \"forward\", \"cat\": \"compute\"") != std::string::npos);
  CHECK(json.find("\"name\": \"optimizer\", \"cat\": \"optimizer\"") != std::string::npos);
  // The trace writes durations to the nanosecond (3 decimals of µs): 1e-6 ms.
  CHECK(b.compute_ms == Approx(duration_us(json, "forward") / 1e3).margin(1e-6));
  CHECK(b.optimizer_ms == Approx(duration_us(json, "optimizer") / 1e3).margin(1e-6));
  trace::set_step(0);
}

TEST_CASE("the profile adds up every thread's spans by name from the first step on",
          "[core][trace]") {
  CHECK(trace::finish_profile().rows.empty());  // not enabled: nothing
  trace::set_step(0);
  trace::enable_profile();
  CHECK_FALSE(trace::active());  // no step has begun
  { trace::Span setup("setup collective", "comm"); }
  trace::set_step(1);
  CHECK(trace::active());
  for (int i = 0; i < 3; ++i) {
    trace::Span work("work", "test");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  { trace::Span part("data wait", trace::Part::data); }
  std::thread worker([] {
    for (int i = 0; i < 2; ++i) trace::Span s("work", "test");
    trace::Span other("load batch", "data");
  });
  worker.join();
  const trace::Profile p = trace::finish_profile();
  CHECK_FALSE(trace::active());
  { trace::Span after("after the profile", "test"); }
  CHECK(trace::finish_profile().rows.empty());
  REQUIRE(p.rows.size() == 3);
  std::map<std::string, trace::ProfileRow> by_name;
  for (const trace::ProfileRow& r : p.rows) by_name[r.name] = r;
  CHECK(by_name.count("setup collective") == 0);
  CHECK(by_name["work"].count == 5);  // 3 here, 2 on the worker
  CHECK(by_name["data wait"].count == 1);
  CHECK(by_name["load batch"].count == 1);
  // "work" slept 3 x 200 µs at least; each row's max is within its total.
  CHECK(p.rows[0].name == "work");
  CHECK(by_name["work"].total_ms >= 0.6);
  for (const trace::ProfileRow& r : p.rows) CHECK(r.max_ms <= r.total_ms);
  CHECK(p.rows[1].total_ms >= p.rows[2].total_ms);
  CHECK(p.wall_ms >= 0.6);  // the main thread's three "work" spans lie within it
  const std::string table = trace::format_profile(p);
  CHECK(table.rfind("span", 0) == 0);
  CHECK(table.find("% of run") != std::string::npos);
  CHECK(table.find("\nwork ") != std::string::npos);
  CHECK(count(table, "\n") == 4);  // the header and three rows
  trace::set_step(0);
}
