// Heartbeat (engine/heartbeat.h, Note [heartbeat]): each beat an OutputFile
// (Note [one way to write a file]) renamed over the file; a Busy keeps a
// thread rewriting it while a save runs.
#include "engine/heartbeat.h"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>

#include "engine/core/json.h"
#include "engine/core/log.h"
#include "engine/core/output_file.h"
#include "kernels/error.h"

namespace lockstep::engine {
namespace fs = std::filesystem;

Heartbeat::Heartbeat(fs::path file) : file_(std::move(file)) {}

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
  const std::string line = core::Json::object()
                               .set("step", step)
                               .set("phase", phase)
                               .set("time", time)
                               .set("unix_time", std::round(unix_time * 1e3) / 1e3)
                               .set("pid", static_cast<std::int64_t>(::getpid()))
                               .dump() +
                           "\n";
  std::lock_guard lock(mutex_);
  try {
    // Not fsynced: a liveness signal rewritten every step is stale after a
    // machine crash whatever was synced; the rename keeps it whole.
    core::OutputFile out(file_, "the heartbeat file", /*durable=*/false);
    out.write(line);
    out.commit();
  } catch (const core::OutputFileError& e) {
    core::report_write_failure(
        "the heartbeat file " + file_.string(),
        fmt::format("{} (a liveness check on it will fail; the run goes on)", e.reason()));
  }
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
