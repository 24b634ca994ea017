// RunCheckpoints: a training run's checkpoints in one object, for
// lockstep-train and for any loop of the user's own: the directory (whose
// lock rank 0 holds), the choice of the checkpoint to resume from (Note
// [checkpoint choice]), putting the whole run back from it (weights, buffers,
// optimizer state, the step count that drives the schedule and dropout keys,
// the loss scaler, the data position), and saves of that state with the
// atomic files and retention of engine/checkpoint_file.h. It also records
// and checks the run's fingerprint, computed from the run itself (Note [run
// fingerprint]), so that every program has the one resume check.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/world.h"
#include "engine/checkpoint.h"
#include "engine/checkpoint_file.h"
#include "engine/data_parallel_step.h"
#include "engine/heartbeat.h"
#include "io/batch_source.h"

namespace lockstep::engine {

struct RunCheckpointOptions {
  // Where checkpoints are saved; empty: none are (`file` may still be resumed).
  std::filesystem::path directory;
  int keep_last = 3;  // Note [checkpoint retention]
  // latest: the newest good checkpoint in `directory`, or a fresh start when
  // there is none (or no directory); fresh: `directory` must hold no
  // checkpoints; file: `file`.
  enum class Start { latest, fresh, file };
  Start start = Start::latest;
  std::filesystem::path file;
  // Note [resume fingerprint]: the program's own fields a resume may not
  // change, beside the ones RunCheckpoints records itself (Note [run
  // fingerprint]; a `config` field under one of run_fingerprint_names() is
  // refused), and the value of a field in a checkpoint written before the
  // field was.
  std::map<std::string, std::string> config, config_defaults;
  // How this program sets each field of the run fingerprint, by name, for
  // the message of a refused resume (lockstep-train: {"precision",
  // "--precision"}); a field left out is named by its library option.
  std::map<std::string, std::string> set_by{};
  // Rewritten with phase "saving" every second while rank 0 writes; may be null.
  Heartbeat* heartbeat = nullptr;
  // Written into every checkpoint as input.<key> (Note [input record] in
  // engine/input_record.h: InputRecord::fields()); empty: none.
  std::map<std::string, std::string> input{};
};

// Note [run fingerprint]: what a resume may not change, computed from the
// run itself rather than written by hand: the model (its type, parameter
// names and shapes), the loss (describe()), the precision (autocast), the
// rank-invariant mode, the dropout seed, the global batch (micro-batch rows
// x ranks x accumulation, the source's one batch of K x B rows per rank in
// the rank-invariant mode), the data's order (shuffle and the sampler's
// seed) and size. RunCheckpoints::save records each as config.<name> with
// the root attribute fingerprint_version; RunCheckpoints::restore compares
// them before anything is loaded and refuses a difference naming the field,
// both values and what sets it. The world size, the accumulation and the
// micro-batch (where the global batch holds), the ZeRO stage (its checkpoint
// is the same file), the steps, checkpoint cadence, logging and threads may
// change (docs/checkpoints.md). A checkpoint without fingerprint_version
// (before 0.2.0) is compared on the fields it has under the names and in the
// words lockstep-train wrote then (global_batch, precision, seed, shuffle,
// dataset); its other config.* fields under these names are not compared
// and nothing is warned; its next save records them all.
struct RunFingerprintField {
  std::string name;    // config.<name> in a checkpoint
  std::string value;   // "128", "fp16", "on"
  std::string set_by;  // the library option that sets it
};

// The fields RunCheckpoints records, in the order a resume compares them.
std::vector<std::string> run_fingerprint_names();

// The run's fingerprint as RunCheckpoints records it; with `source` null,
// without the data's fields (global_batch, shuffle, sampler_seed, dataset).
// Under ZeRO-3 the caller holds the step's full_parameters().
std::vector<RunFingerprintField> run_fingerprint(Module& model, const DataParallelStep& step,
                                                 const io::BatchSource* source, int world_size);

// Where a run continues: the steps taken and the data position of the next.
struct RunPosition {
  std::int64_t step = 0;
  io::LoaderPosition data;
};

class RunCheckpoints {
 public:
  // Collective over world.host(). Rank 0 takes the directory and its lock
  // (CheckpointDirectoryLocked naming the holder when another run has it;
  // CheckpointDirectoryInUse for a fresh start into a directory that holds
  // checkpoints), then every rank learns which file it resumes from.
  RunCheckpoints(comm::World& world, RunCheckpointOptions options);

  // The file this rank resumes from, if any.
  const std::optional<std::filesystem::path>& resume_file() const { return resume_file_; }
  // ("checkpoint", what this rank resumes from): put it in StepOptions::
  // agreement, so that a rank whose copy differs stops every rank before the
  // first step (Note [checkpoint choice]).
  std::pair<std::string, std::string> agreement_field() const;

  // Puts the run back from resume_file(): weights, buffers, the optimizer
  // state, step.steps() and the loss scaler. Returns where to continue
  // (step 0, epoch 0, position 0 without a file). Throws naming the file and
  // the field for a checkpoint of another model or configuration, the run's
  // fingerprint included (Note [run fingerprint]) with `source` the one the
  // run trains on.
  RunPosition restore(Module& model, Optimizer& optimizer, DataParallelStep& step,
                      LossScaler& scaler, const io::BatchSource& source,
                      const core::Stream& stream);
  // 0.1's form, without the source: the data's fields are not compared.
  [[deprecated(
      "pass the batch source the run trains on: restore(model, optimizer, step, scaler, "
      "source, stream) also checks the global batch and the data order")]] RunPosition
  restore(Module& model, Optimizer& optimizer, DataParallelStep& step, LossScaler& scaler,
          const core::Stream& stream);

  // Collective (a sharded optimizer gathers its state): the run's state after
  // step.steps(), continuing where `source` stands (next_position()). Rank 0
  // writes it and returns its path; other ranks, and a run without a
  // directory, return an empty path. A second save of the same step writes
  // nothing. Throws IoError (a full disk) leaving every earlier checkpoint as
  // it was. LOCKSTEP_TEST_SAVE_DELAY (seconds, for tests: a slower disk) is
  // added to rank 0's write.
  std::filesystem::path save(Module& model, const Optimizer& optimizer,
                             const DataParallelStep& step, const LossScaler& scaler,
                             const io::BatchSource& source, const core::Stream& stream);

  // The data position after the step just taken from `source`: where it
  // stands, or the start of the next epoch when the epoch has no whole step
  // of `accumulation` micro-batches left (Trainer::step would return none).
  static io::LoaderPosition next_position(const io::BatchSource& source, int accumulation);

  // Without a directory there is nothing to save to.
  bool saves() const { return directory_.has_value(); }
  const std::filesystem::path& directory() const { return options_.directory; }

 private:
  RunPosition restore_from(Module& model, Optimizer& optimizer, DataParallelStep& step,
                           LossScaler& scaler, const io::BatchSource* source,
                           const core::Stream& stream);

  comm::World& world_;
  RunCheckpointOptions options_;
  std::optional<CheckpointDirectory> directory_;
  std::optional<std::filesystem::path> resume_file_;
  std::int64_t last_saved_ = -1;
};

}  // namespace lockstep::engine
