// What a training run says about itself: the header printed before the first
// step (what was decided at start: device and why, ranks and where they run,
// batch arithmetic, precision, data, outputs) and the summary printed at the
// end (wall time, throughput, skipped steps, final and best figures, last
// checkpoint). lockstep-train and examples/custom both use it, so that any
// program built on the library starts and ends a run the same way.
//
// Note [run records]: the --metrics JSON lines hold three kinds of record,
// told apart by their keys: a run record ("run": "start" or "end") with the
// header's or summary's figures; a step record ("loss"; lockstep-train's
// first of a process also holds "kernels", Note [kernel paths]); an evaluation
// record ("val_loss", "val_accuracy"). Epochs count from 1 in every record
// and on the console; tools/plot.py and tools/to_tensorboard.py read the same.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/world.h"
#include "engine/core/json.h"
#include "engine/run_control.h"
#include "io/dataset.h"

namespace lockstep::engine {

// The deterministic setting (Note [deterministic runs] in run_report.cpp):
// applied process-wide before any model is planned.
void set_deterministic_run(bool on);
bool deterministic_run();

// One rank's place: its host and device (gathered from every rank).
struct RankPlacement {
  int rank = 0;
  std::string host;
  std::string device;  // "cpu", "cuda:0"
};
// Collective over world.host(): every rank's host name and device, in rank order.
std::vector<RankPlacement> gather_placement(comm::World& world);
// "2 ranks: host-a (ranks 0-1, cuda:0 cuda:1)", one host per entry.
std::vector<std::string> describe_placement(const std::vector<RankPlacement>& placement);

// Why `device` was chosen: `requested` is "cpu", "cuda" or "" (automatic:
// a GPU when one is usable); `requested_by` names where a request came from
// (a flag, an argument).
std::string explain_device(core::Device device, const std::string& requested,
                           const std::string& requested_by);

struct DatasetSummary {
  std::string role;  // "train", "val"
  std::string path;
  const io::Dataset* dataset = nullptr;
};
// "60000 samples, inputs u8 [1, 28, 28], labels i64, 4 shards read in parallel
// (pread)", or "... 1 shard through HDF5 (chunked with filters)".
std::string describe_dataset(const io::Dataset& dataset);

struct RunHeader {
  std::string program;        // "lockstep-train"
  std::string model;          // preset name or a description
  std::string device_reason;  // explain_device's
  int threads = 1;            // compute threads per rank
  int loader_threads = 0;     // 0: not reported
  std::string cpu_gemm;       // kernels::cpu::CpuGemmKernels::describe(); "": not reported
  std::int64_t micro_batch = 0;
  int accumulation = 1;
  std::int64_t steps_per_epoch = 0;  // 0: not known
  std::int64_t total_steps = 0;
  std::string length_reason;  // how total_steps was chosen, e.g. "3 epochs"
  std::int64_t start_step = 0;
  // How the run starts (the "start" line): "resumed from ckpt-6.h5 at step 6 ...",
  // "weights of w.h5: ..." (--init-from, WeightsLoadReport::summary); "": fresh.
  std::string resume;
  std::string precision;  // "fp32", "bf16"
  bool loss_scaling = false;
  int zero_stage = 0;                     // StepOptions::sync.zero_stage
  bool activation_checkpointing = false;  // shown with the model state
  // The per-rank model state the header expects (docs/memory.md): f32
  // parameters and gradients whole on every rank, optimizer state (all of it,
  // unsharded) divided by the ranks under ZeRO-1. 0: not reported.
  std::int64_t parameter_bytes = 0;
  std::int64_t optimizer_state_bytes = 0;
  std::vector<DatasetSummary> data;
  std::string checkpoint_dir;  // "" : none
  std::string metrics_path;    // "" : none
  // A language model's tokens per sample, for tokens/s in the summary; 0: not one.
  std::int64_t tokens_per_sample = 0;
  // How image inputs reach the model (the "input" line): the scaling, the
  // training augmentation, the normalisation and where it came from, e.g.
  // "u8 / 255, augment crop-flip (...), normalize 0.5,0.5 (the checkpoint's)"
  // (Note [input record] in engine/input_record.h); "": not shown.
  std::string input{};
};

// The header's lines, each without a newline (pure: what start_run prints).
std::vector<std::string> format_run_header(const RunHeader& header, int world_size,
                                           const std::vector<RankPlacement>& placement);
// The "run": "start" metrics record (Note [run records]).
core::Json start_record(const RunHeader& header, int world_size);
// The same record's inside as text.
[[deprecated(
    "since 0.2.0, removed in 0.3.0: start_record returns the record as a core::Json")]] std::string
run_start_record(const RunHeader& header, int world_size);

// The figures a run keeps for its summary, fed one step and one evaluation at
// a time on every rank (the numbers are global already); rank 0 reports.
class RunReport {
 public:
  // Collective (gathers placement): prints the header on rank 0 and writes
  // the start record to `metrics`. Call it when every check that can fail
  // before the first step has run, so that errors never interleave with it.
  RunReport(comm::World& world, RunHeader header, MetricsWriter& metrics);

  // A step of `samples` global samples taking `seconds` (a StepResult's figures).
  void record_step(std::int64_t step, double loss, std::int64_t samples, double seconds,
                   bool skipped);
  // `accuracy` none: a loss without the metric (regression); the summary
  // then gives the loss alone.
  void record_eval(std::int64_t step, std::int64_t epoch, double loss,
                   std::optional<double> accuracy);
  void end_epoch();
  void set_last_checkpoint(const std::string& path) { last_checkpoint_ = path; }
  // The run stops before its end, for `reason` ("on request (a signal)"): the
  // summary says "stopped at step N" instead of "done", and the end record
  // has "stopped": true and "stop_reason".
  void set_stopped(std::string reason) { stop_reason_ = std::move(reason); }

  struct Summary {
    double wall_s = 0, step_s = 0;
    std::vector<double> epoch_wall_s;  // epochs that ended in this process
    std::int64_t steps = 0, skipped_steps = 0, samples = 0;
    // Note [train loss of a part]: the mean over the unskipped steps of the
    // last epoch that this process ran, steps train_loss_first_step to
    // train_loss_last_step; train_loss_whole_epoch says whether they are all
    // of that epoch's steps (not after a resume into it, nor in an epoch a
    // stop or --steps cut short).
    std::optional<double> last_epoch_train_loss;
    std::int64_t train_loss_first_step = 0, train_loss_last_step = 0;
    std::int64_t train_loss_skipped_steps = 0;  // in that range, left out of the mean
    bool train_loss_whole_epoch = false;
    std::string stop_reason;  // "": the run went to its end (RunReport::set_stopped)
    std::optional<double> last_loss;
    std::int64_t last_step = 0;
    std::optional<double> val_loss, val_accuracy, best_val_accuracy;
    std::int64_t best_val_step = 0, best_val_epoch = 0;
  };
  Summary summary() const;
  // The summary's lines (rank 0 prints them in finish()).
  std::vector<std::string> format_summary(const Summary& s) const;
  // "memory       peak rank 0 120.4 MiB on cpu, rank 1 ...": `peak_bytes` per
  // rank, beside the devices gathered at construction; beyond 8 ranks the
  // highest and the lowest.
  std::string format_peak_memory(const std::vector<std::uint64_t>& peak_bytes) const;
  // "peak split   rank 0: parameters 1.0 MiB, gradients ...": one rank's peak
  // by kind (core::MemoryStats::peak_by_kind, Note [memory kinds]).
  static std::string format_peak_split(int rank, const std::vector<std::uint64_t>& by_kind);
  // Collective (gathers every rank's peak device memory and its split by
  // kind, core::memory_stats): prints the summary on rank 0 (the split of up
  // to 8 ranks, beyond that of the highest) and writes the "run": "end"
  // record ("peak_memory_by_kind": one object per rank).
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  comm::World& world_;
  RunHeader header_;
  std::vector<RankPlacement> placement_;
  MetricsWriter& metrics_;
  Clock::time_point start_, epoch_start_;
  Summary figures_;  // kept as they come; summary() adds wall_s and last_epoch_train_loss
  // Each epoch as this process saw it: the loss sum and count of its
  // unskipped steps, its first and last step and how many steps (skipped too).
  struct EpochSeen {
    double loss_sum = 0;
    std::int64_t losses = 0, first_step = 0, last_step = 0, steps = 0;
    bool began_here = false, ended = false;
  };
  EpochSeen epoch_, last_epoch_;
  std::string last_checkpoint_, stop_reason_;
};

}  // namespace lockstep::engine
