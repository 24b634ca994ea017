// Rank-prefixed logging (engine/core/log.h). One fmt::print per line keeps
// lines from different threads whole.
#include "engine/core/log.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "kernels/error.h"

namespace lockstep::core {
namespace {
std::atomic<LogLevel> g_level{LogLevel::warn};
std::atomic<int> g_rank{-1};

struct WriteFailures {
  std::mutex mutex;
  std::vector<std::string> files, lines;
};
WriteFailures& write_failure_record() {
  static WriteFailures record;
  return record;
}
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }
void set_log_rank(int rank) { g_rank = rank; }

LogLevel parse_log_level(std::string_view text) {
  if (text == "quiet") return LogLevel::quiet;
  if (text == "warn") return LogLevel::warn;
  if (text == "info") return LogLevel::info;
  if (text == "debug") return LogLevel::debug;
  throw InvalidArgument("log level '" + std::string(text) +
                        "' is not one of quiet, warn, info, debug");
}

void log_message(LogLevel level, std::string_view message) {
  const char* tag = level == LogLevel::warn    ? "warning: "
                    : level == LogLevel::debug ? "debug: "
                                               : "";
  const int rank = g_rank;
  if (rank >= 0)
    fmt::print(stderr, "[rank {}] {}{}\n", rank, tag, message);
  else
    fmt::print(stderr, "[lockstep] {}{}\n", tag, message);
}

bool report_write_failure(const std::string& file, const std::string& reason) {
  WriteFailures& record = write_failure_record();
  {
    std::lock_guard lock(record.mutex);
    if (std::find(record.files.begin(), record.files.end(), file) != record.files.end())
      return false;
    record.files.push_back(file);
    record.lines.push_back(file + ": " + reason);
  }
  log_message(LogLevel::warn, "cannot write " + file + ": " + reason);
  return true;
}

std::vector<std::string> write_failures() {
  WriteFailures& record = write_failure_record();
  std::lock_guard lock(record.mutex);
  return record.lines;
}

}  // namespace lockstep::core
