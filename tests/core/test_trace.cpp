// The timeline trace's recorder (engine/core/trace.h): the window parser, what
// is recorded in and out of the window, on several threads, and the file
// written (names escaped and cut, threads named, one event per span).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "engine/core/trace.h"
#include "kernels/error.h"

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
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
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
