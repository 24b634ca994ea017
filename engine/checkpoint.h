// What a checkpoint holds and how a run is put back from it (the format is
// in docs/checkpoints.md; the files themselves in engine/checkpoint_file.h).
//
// /model/<param>, /buffers/<buffer>: f32 weights and buffers in PyTorch
// layouts by name; /optimizer/<param>/<state>: momentum_buffer, or exp_avg
// and exp_avg_sq; root attributes: format_version, step, epoch, position,
// loss_scale, scaler_growth_tracker, optimizer.step, rng_seed, rng_offset,
// world_size, global_batch, and config.<field> for every fingerprinted field.
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
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

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

// Weights only: every trainable parameter from /model/<name> of any HDF5
// file with that layout (and /buffers/<name> when present); f16 and f64
// weights load as f32 (io::read_tensor). Missing or misshapen parameters, and
// types that do not fit, are errors naming them.
void load_weights(const std::filesystem::path& file, Module& model, const core::Stream& stream);

}  // namespace lockstep::engine
