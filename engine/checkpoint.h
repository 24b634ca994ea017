// What a checkpoint holds and how a run is put back from it (the format is
// in docs/checkpoints.md; the files themselves in engine/checkpoint_file.h).
//
// /model/<param>, /buffers/<buffer>: f32 weights and buffers in PyTorch
// layouts by name; /optimizer/<param>/<state>: momentum_buffer, or exp_avg
// and exp_avg_sq; root attributes: format_version, step, epoch, position,
// loss_scale, scaler_growth_tracker, optimizer.step, rng_seed, rng_offset,
// world_size, global_batch, config.<field> for every fingerprinted field, and
// input.<field> (Note [input record] in engine/input_record.h).
//
// Note [resume fingerprint]: the config.* attributes are what a resume may
// not change (model, optimizer and its hyper-parameters, global batch,
// precision, seed, dataset, dropout); steps, epochs, logging, checkpoint
// cadence, threads and the world size (with the same global batch) may
// change. A difference is an error naming the field and both values. A resume
// compares the union of the checkpoint's config.* keys and the run's, a key
// missing on one side taking its default: a field that a checkpoint lacks (one
// written only when set, or added after the checkpoint was made) is compared
// too, and a saved field with neither a value in this run nor a default is an
// error (the checkpoint of another program, or of a newer one).
// RunCheckpoints adds the fields it computes from the run itself and checks
// them first (Note [run fingerprint], engine/run_checkpoints.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint_file.h"
#include "engine/nn/module.h"
#include "engine/optim/loss_scaler.h"
#include "engine/optim/optimizer.h"

namespace lockstep::engine {

inline constexpr std::int64_t kCheckpointFormatVersion = 1;

struct TrainingState {
  std::int64_t step = 0;      // steps taken
  std::int64_t epoch = 0;     // the epoch in progress
  std::int64_t position = 0;  // global samples of that epoch consumed
  LossScalerState scaler{1.0f, 0};
  std::uint64_t seed = 0;
  int world_size = 1;
  std::int64_t global_batch = 0;
  std::map<std::string, std::string> config;  // Note [resume fingerprint]
  // Written as input.<key> (Note [input record] in engine/input_record.h);
  // empty: none. Not compared on resume: config.* holds what may not change.
  std::map<std::string, std::string> input{};
};

// Copies the model, its buffers and the optimizer state to the host. Throws
// NumericalError naming the tensor and element when any f32 value is inf or
// NaN: such a checkpoint is never written. With a sharded optimizer (ZeRO-1)
// the state is gathered from every rank first, so the contents are the same
// as without ZeRO: a collective then, which every rank must call.
CheckpointContents capture_checkpoint(Module& model, const Optimizer& optimizer,
                                      const TrainingState& state, const core::Stream& stream);

// Checks the format version, the model's parameter names and shapes and the
// fingerprint against `config`, filled in from `config_defaults` on either
// side (Note [resume fingerprint]), then copies
// weights, buffers and optimizer state into the live objects (a sharded
// optimizer takes its shard's part; nothing is communicated). Returns the
// saved state; `file` names the checkpoint in errors.
TrainingState restore_checkpoint(const CheckpointContents& contents, const std::string& file,
                                 Module& model, Optimizer& optimizer,
                                 const std::map<std::string, std::string>& config,
                                 const std::map<std::string, std::string>& config_defaults,
                                 const core::Stream& stream);

// Note [weights files]: load_weights reads lockstep's layout (parameters
// under /model, buffers under /buffers: a checkpoint, or a file written the
// same way) and PyTorch's state_dict as h5py writes it (every entry under
// /model, BatchNorm's running_mean, running_var and num_batches_tracked
// included), or a mix of both. Every parameter and buffer of the model must
// be in the file once, and every dataset under /model and /buffers must be
// taken by one of them; other groups (a checkpoint's /optimizer) and
// attributes are not weights and are not read. Anything else is refused,
// naming what is missing and what is unused, unless the caller allows a
// partial load (PyTorch's load_state_dict(strict=False)). Two entries are not
// held to that:
// - num_batches_tracked (an int64 scalar in PyTorch) loads when present; when
//   absent it keeps its value, as PyTorch 2's BatchNorm does with a
//   state_dict that has no version metadata (a dict read back from h5py;
//   older releases set 0), and the report says so. lockstep's BatchNorm2d
//   only counts batches: its momentum is always a number, so no output
//   depends on the count (PyTorch reads it only with momentum=None);
// - a tied weight's second name (GPT's lm_head.weight, which PyTorch's
//   state_dict lists beside transformer.wte.weight) is taken when it holds
//   the owner's values bit for bit, and refused when it differs.
// Everything is checked (names, shapes, types) before anything is copied: a
// refused file leaves the model as it was.
struct WeightsLoadOptions {
  // Load the entries the model and the file both have, leave the model's
  // other parameters and buffers as they are, and report the rest instead of
  // refusing the file. A file that shares no entry with the model is refused
  // all the same.
  bool allow_partial = false;
};

// What load_weights did (Note [weights files]), by dotted name.
struct WeightsLoadReport {
  std::vector<std::string> loaded;  // parameters and buffers set from the file
  // Partial loads only: the model's entries the file lacks (left as they
  // were), and the file's datasets nothing took ("/model/head.weight").
  std::vector<std::string> missing, unused;
  // num_batches_tracked buffers the file lacks, kept as they were.
  std::vector<std::string> kept_counters;
  bool partial() const { return !missing.empty() || !unused.empty(); }
  // One line for a run header or a program's output: what was loaded and
  // what was skipped, naming the first few of each.
  std::string summary() const;
};

// Weights only (Note [weights files]): the model's parameters and buffers
// from `file`; f16 and f64 floats load as f32 (io::read_tensor). A missing or
// unused entry (without allow_partial), a misshapen one or a type that does
// not fit is an error naming it and the file.
WeightsLoadReport load_weights(const std::filesystem::path& file, Module& model,
                               const core::Stream& stream, const WeightsLoadOptions& options);
// The same with WeightsLoadOptions{} (no partial load), the report dropped.
void load_weights(const std::filesystem::path& file, Module& model, const core::Stream& stream);

}  // namespace lockstep::engine
