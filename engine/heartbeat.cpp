// Heartbeat (engine/heartbeat.h, Note [heartbeat]): write a temporary, rename
// it over the file; a Busy keeps a thread rewriting it while a save runs.
#include "engine/heartbeat.h"

#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "engine/core/log.h"

namespace lockstep::engine {
namespace fs = std::filesystem;

Heartbeat::Heartbeat(fs::path file) : file_(std::move(file)) {
  if (!file_.empty()) temporary_ = file_.string() + ".tmp";
}

Heartbeat::~Heartbeat() = default;

void Heartbeat::beat(std::int64_t step, const std::string& phase) {
  if (file_.empty()) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char time[32];
  std::strftime(time, sizeof time, "%Y-%m-%dT%H:%M:%SZ", &utc);
  const double unix_time = std::chrono::duration<double>(now.time_since_epoch()).count();
  const std::string line =
      fmt::format(R"({{"step": {}, "phase": "{}", "time": "{}", "unix_time": {:.3f}, "pid": {}}})",
                  step, phase, time, unix_time, ::getpid()) +
      "\n";
  std::lock_guard lock(mutex_);
  errno = 0;
  std::FILE* out = std::fopen(temporary_.c_str(), "w");
  bool written = out != nullptr;
  if (out) {
    written = std::fputs(line.c_str(), out) >= 0;
    written = std::fclose(out) == 0 && written;
  }
  if (written && std::rename(temporary_.c_str(), file_.c_str()) == 0) return;
  const int error = errno;
  std::remove(temporary_.c_str());
  core::report_write_failure("the heartbeat file " + file_.string(),
                             fmt::format("{} (a liveness check on it will fail; the run goes on)",
                                         error != 0 ? std::strerror(error) : "a write failed"));
}

Heartbeat::Busy::Busy(Heartbeat& heartbeat, std::int64_t step, std::string phase, double period_s)
    : heartbeat_(heartbeat) {
  heartbeat_.beat(step, phase);
  if (heartbeat_.file_.empty()) return;
  thread_ = std::thread([this, step, phase = std::move(phase), period_s] {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::duration<double>(period_s), [this] { return done_; }))
      heartbeat_.beat(step, phase);
  });
}

Heartbeat::Busy::~Busy() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

}  // namespace lockstep::engine
