// Logging with a rank prefix, to stderr. Library code logs through these;
// programs print their own progress on rank 0 only.
#pragma once

#include <fmt/core.h>

#include <string_view>

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

}  // namespace lockstep::core
