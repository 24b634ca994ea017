// --heartbeat FILE: a small file a run rewrites atomically at every step
// boundary and, during a long save, every second, so that a scheduler's
// liveness check (a Kubernetes livenessProbe, a Slurm health check, a cron
// job) can tell a running job from a stopped one by its contents or its time
// stamp (docs/container.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

namespace lockstep::engine {

// Note [heartbeat]: one line of JSON, {"step": 12, "phase": "training",
// "time": "2026-12-02T14:11:05Z", "unix_time": 1796220665.123, "pid": 4242},
// written to a temporary beside FILE and renamed over it (core::OutputFile),
// so that a reader never sees a partial line. Phases: "starting" (before the first step),
// "training" (at each step boundary), "saving" (rewritten every second while a checkpoint is
// written), "done", or "stopped" (a signal or an unwritable --metrics file
// ended the run before its last step). A file that cannot be written is reported once (Note
// [write failures] in engine/core/log.h) and the run goes on: a missing
// heartbeat makes the scheduler act, which is the failure's cost.
class Heartbeat {
 public:
  explicit Heartbeat(std::filesystem::path file);  // "" writes nothing
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void beat(std::int64_t step, const std::string& phase);

  // While it lives, the heartbeat is rewritten every `period_s` with `phase`.
  class Busy {
   public:
    Busy(Heartbeat& heartbeat, std::int64_t step, std::string phase, double period_s = 1.0);
    ~Busy();
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    Heartbeat& heartbeat_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool done_ = false;
    std::thread thread_;
  };

 private:
  std::filesystem::path file_;
  std::mutex mutex_;
};

}  // namespace lockstep::engine
