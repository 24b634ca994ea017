// Rank-prefixed logging (engine/core/log.h). One fmt::print per line keeps
// lines from different threads whole.
#include "engine/core/log.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "kernels/error.h"

namespace lockstep::core {
namespace {
std::atomic<LogLevel> g_level{LogLevel::warn};
std::atomic<int> g_rank{-1};
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

}  // namespace lockstep::core
