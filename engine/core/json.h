// JSON string quoting for the files the library writes by hand (the timeline
// trace, the metrics records, the flight recorder's dumps): one escaper, so
// that every file quotes a name the same way and stays valid JSON whatever
// bytes the name holds.
#pragma once

#include <string>
#include <string_view>

namespace lockstep::core {

// `text` as a JSON string literal, quotes included: '"' and '\' escaped,
// control characters as \u00XX; other bytes (UTF-8) pass through.
std::string json_string(std::string_view text);

}  // namespace lockstep::core
