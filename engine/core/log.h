// Logging with a rank prefix, to stderr. Library code logs through these;
// programs print their own progress on rank 0 only. Also the record of files
// a run failed to write (Note [write failures]).
#pragma once

#include <fmt/core.h>

#include <string>
#include <string_view>
#include <vector>

namespace lockstep::core {

enum class LogLevel { quiet, warn, info, debug };

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses quiet|warn|info|debug; throws InvalidArgument naming the flag value.
LogLevel parse_log_level(std::string_view text);
// Set by comm::init once the rank is known; -1 (the default) prints no prefix.
void set_log_rank(int rank);

void log_message(LogLevel level, std::string_view message);

template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::warn)
    log_message(LogLevel::warn, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::info)
    log_message(LogLevel::info, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::debug)
    log_message(LogLevel::debug, fmt::format(format, std::forward<Args>(args)...));
}

// Note [write failures]: a file a run writes beside its checkpoints (the
// metrics, a trace, a flight dump) that cannot be written is never silent.
// report_write_failure() says, once per file and whatever the log level,
// which file failed and why, and keeps that line for the run's summary
// (write_failures()). Whether the run goes on is the writer's rule, listed in
// docs/faults.md: a metrics file that fails stops the run at the next step
// boundary, after saving (MetricsWriter); a trace or a flight dump does not.
// Returns whether this was the file's first failure.
bool report_write_failure(const std::string& file, const std::string& reason);
// "FILE: REASON" for every file that failed, in the order they first failed.
std::vector<std::string> write_failures();

}  // namespace lockstep::core
