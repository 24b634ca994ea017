// How a training run is told to stop, and how it reports progress.
//
// Note [stop requests]: SIGINT (Ctrl-C) asks the run to finish the current
// step and exit cleanly; a second SIGINT exits at once. SIGUSR1 (which mpirun
// forwards to every rank) and SIGTERM (which mpirun sends every rank when it
// aborts the job, SIGKILL following a second later) ask the same. A handler
// only sets comm's stop flag, which the data-parallel step carries in its
// step agreement (comm::StepAgreement), so a request made on any rank stops every
// rank at the same step, and with checkpointing on, the run saves there first.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "engine/core/json.h"
#include "engine/core/output_file.h"
#include "engine/core/trace.h"

namespace lockstep::engine {

// Installs the handlers of Note [stop requests] (idempotent).
void install_signal_handlers();

// The progress line programs print on rank 0:
// "step 120/1000  loss 0.4123  lr 0.1  5230 samples/s  ETA 2m13s".
std::string progress_line(std::int64_t step, std::int64_t total_steps, double loss, double lr,
                          double samples_per_s, double eta_s);
// What the progress line adds after progress_line's figures: the step's
// breakdown (Note [step breakdown], engine/core/trace.h) and the peak memory
// of this rank's device: "data 0.03  compute 10.21  comm 1.30  opt 0.52 ms
// (of 12.40)  peak 120.4 MiB on cpu".
std::string step_detail(const core::trace::Breakdown& breakdown, double step_ms,
                        std::size_t peak_bytes, const std::string& device);
// The same in a metrics record: adds "data_wait_ms", "compute_ms",
// "exposed_comm_ms", "optimizer_ms", "step_ms" and "peak_memory_bytes".
void add_step_detail(core::Json& record, const core::trace::Breakdown& breakdown, double step_ms,
                     std::size_t peak_bytes);
// The same fields as text: "\"data_wait_ms\": 0.031, \"compute_ms\": ...".
[[deprecated(
    "since 0.2.0, removed in 0.3.0: add_step_detail writes them into a core::Json")]] std::string
step_detail_fields(const core::trace::Breakdown& breakdown, double step_ms, std::size_t peak_bytes);
// "2m13s", "1h04m", "45s", "3.2s".
std::string format_duration(double seconds);
// "812 B", "3.0 KiB", "120.4 MiB", "1.20 GiB".
std::string format_bytes(std::size_t bytes);

// Appends one JSON object per line to a file (the --metrics file): appending
// means a resumed run continues the file instead of overwriting it. A record
// that cannot be written (a full disk) is reported once (Note [write
// failures]), later records are dropped, and the run is asked to stop as a
// stop signal would (Note [stop requests]): at the next step boundary, after
// saving. failed() says so.
class MetricsWriter {
 public:
  // "" writes nothing. The file is a core::AppendFile (Note [one way to
  // write a file]): a symlink or a directory there, or one of the run's
  // inputs, is refused with an IoError.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // One record, one line (Note [JSON by a library]: a non-finite number is
  // written as null and named in the record's "non_finite" member).
  void write(const core::Json& record);
  // `fields` is the inside of an object: "\"step\": 3, \"loss\": 0.5". Parsed
  // and written as write(Json); text that is not JSON is kept as a string in
  // {"unparsed_record": ...}.
  [[deprecated(
      "since 0.2.0, removed in 0.3.0: build a core::Json object and call write(Json)")]] void
  write(const std::string& fields);
  bool failed() const { return failed_; }

 private:
  std::string path_;
  std::unique_ptr<core::AppendFile> file_;
  bool failed_ = false;
};

// Seconds left at the rate seen since `start`: a running estimate of the
// remaining steps' time, from the mean step time after the first step.
class EtaClock {
 public:
  void start(std::int64_t first_step);
  double eta_s(std::int64_t step, std::int64_t total_steps) const;

 private:
  std::chrono::steady_clock::time_point start_;
  std::int64_t first_step_ = 0;
};

}  // namespace lockstep::engine
