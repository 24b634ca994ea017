// lockstep-shard's progress line: "<what>: 1234/60000 samples (2%, 3.1 s)",
// printed at most once a second and at the end, shared by its converters.
#pragma once

#include <fmt/core.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace lockstep::examples {

class Progress {
 public:
  Progress(std::string what, std::int64_t total) : what_(std::move(what)), total_(total) {}
  void update(std::int64_t done) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    fmt::print("{}: {}/{} samples ({:.0f}%, {:.1f} s)\n", what_, done, total_,
               total_ ? 100.0 * done / total_ : 100.0, seconds);
    std::fflush(stdout);
  }

 private:
  std::string what_;
  std::int64_t total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
};

}  // namespace lockstep::examples
