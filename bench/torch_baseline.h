// bench_step's PyTorch baseline: bench/torch_step.py running in a child
// process under a given Python, kept alive so that warm blocks of PyTorch
// steps can take turns with lockstep's own (bench::warm_blocks) and the
// machine's drift and other load hit both alike. The child warms up, says
// "ready" with its torch version, then runs N steps for each line "N" it reads.
#pragma once

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/core/json.h"

namespace lockstep::bench {

class TorchBaseline {
 public:
  // Starts the child and waits for its "ready" line. When it cannot (no torch
  // under `python`, a crash), ready() is false and why_none() holds its last line.
  TorchBaseline(const std::string& python, const std::string& script_args, int threads)
      : python_(python) {
    int to_child[2], from_child[2];
    // O_CLOEXEC: a later child must not hold this one's input open (it would never end).
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      why_none_ = "cannot create a pipe for " + python;
      return;
    }
    // The script beside this source, unless LOCKSTEP_BENCH_DIR names another
    // copy: a binary packed for another machine (tools/gpu-check.sh) finds it there.
    const char* bench_dir = std::getenv("LOCKSTEP_BENCH_DIR");
    const std::string cmd = fmt::format(
        "OMP_NUM_THREADS={0} OPENBLAS_NUM_THREADS={0} exec \"$0\" '{1}/torch_step.py' {2} 2>&1",
        threads, bench_dir != nullptr ? bench_dir : LOCKSTEP_BENCH_DIR, script_args);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::close(to_child[0]), ::close(to_child[1]), ::close(from_child[0]), ::close(from_child[1]);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), python.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    if (pid_ < 0) {
      ::close(to_child[1]), ::close(from_child[0]);
      why_none_ = "cannot start " + python;
      return;
    }
    to_ = ::fdopen(to_child[1], "w");
    from_ = ::fdopen(from_child[0], "r");
    const std::optional<std::string> ready = reply("\"ready\"");
    if (!ready) return;
    version_ = core::Json::parse(*ready, "bench/torch_step.py's ready line")
                   .text("torch_version")
                   .value_or("");
  }
  ~TorchBaseline() {
    if (to_) std::fclose(to_);  // end of input: the child exits
    if (from_) std::fclose(from_);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  TorchBaseline(const TorchBaseline&) = delete;
  TorchBaseline& operator=(const TorchBaseline&) = delete;

  bool ready() const { return why_none_.empty(); }
  const std::string& why_none() const { return why_none_; }
  const std::string& python() const { return python_; }
  const std::string& torch_version() const { return version_; }
  double peak_bytes() const { return peak_bytes_; }

  // Seconds for `steps` PyTorch steps (the child times them itself).
  double run(int steps) {
    if (!ready()) throw std::runtime_error("the PyTorch baseline is not running: " + why_none_);
    fmt::print(to_, "{}\n", steps);
    std::fflush(to_);
    const std::optional<std::string> line = reply("\"seconds\"");
    const std::optional<core::Json> answer =
        line ? std::optional(core::Json::parse(*line, "bench/torch_step.py's answer"))
             : std::nullopt;
    const std::optional<double> seconds = answer ? answer->number("seconds") : std::nullopt;
    if (!seconds)
      throw std::runtime_error(python_ + " stopped answering bench/torch_step.py's requests (" +
                               why_none_ + ")");
    peak_bytes_ = answer->number("peak_bytes").value_or(peak_bytes_);
    return *seconds;
  }

 private:
  // The next line holding `key`, skipping warnings the child prints; on end
  // of output, nothing, with why_none_ naming the last line it printed.
  std::optional<std::string> reply(const std::string& key) {
    std::array<char, 4096> buffer{};
    std::string last;
    while (std::fgets(buffer.data(), buffer.size(), from_)) {
      std::string line = buffer.data();
      while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
      if (line.rfind("{", 0) == 0 && line.find(key) != std::string::npos) return line;
      if (!line.empty()) last = line;
    }
    why_none_ = fmt::format("{} could not run bench/torch_step.py ({})", python_,
                            last.empty() ? "no output" : last);
    return std::nullopt;
  }

  std::string python_, version_, why_none_;
  pid_t pid_ = -1;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
  double peak_bytes_ = 0;
};

}  // namespace lockstep::bench
