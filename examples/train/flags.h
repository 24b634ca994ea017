// lockstep-train's flags: Flags, what they hold, and parse_flags, which
// defines each flag with its default, range and help (CLI11, through
// examples/common/flags.h) and refuses combinations that do nothing or
// contradict each other, before anything starts. main.cpp runs what they ask.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/data_parallel_step.h"

namespace lockstep::examples::train {

struct Flags {
  std::string data, val_data, model = "mlp", optimizer = "sgd", schedule = "constant";
  std::string precision = "fp32", device, shuffle = "on", checkpoint_dir, resume, init_from;
  std::string metrics, log_level = "info", trace, trace_steps = "1:", heartbeat,
                       loss = "cross-entropy";
  std::int64_t epochs = 0, steps = 0, batch_size = 64, warmup = 0, checkpoint_every = 0;
  std::int64_t log_every = 50;
  int accum = 1, keep = 3, threads = 1, zero = 0,
      max_consecutive_skips = engine::StepOptions{}.max_consecutive_skips;
  double lr = 0.05, momentum = 0.9, weight_decay = 0.0, clip = 0.0, dropout = 0.0,
         label_smoothing = 0.0;
  std::int64_t sample_tokens = 0;
  std::string prompt = "\n";
  std::uint64_t seed = 0;
  bool no_decay_bias_norm = false, deterministic = false, profile = false;
  bool unfused_kernels = false;
  bool cuda_graph = false;                // StepOptions::cuda_graph (Note [step graph])
  bool activation_checkpointing = false;  // Note [activation checkpointing]
  bool allow_partial_weights = false;     // --init-from: Note [weights files]
  // The model's build (engine::make_model): its widths divided, and
  // torchvision's zero_init_residual and channels-last activations (Note
  // [channels-last layers]) for resnet and resnet50.
  std::int64_t width_divisor = 1;
  bool zero_init_residual = false;
  bool channels_last = false;
  int loader_threads = 2;  // per rank: reading, decoding and augmenting batches

  // The image pipeline and evaluation (docs/data-format.md, "Image pipeline").
  std::string augment, normalize;
  std::int64_t val_every = 0;
  bool eval_only = false;

  // --rank-invariant (Note [rank-invariant step]): --global-batch rows, in
  // chunks of --batch-size; --accum follows from the world size.
  bool rank_invariant = false;
  std::int64_t global_batch = 0;
};

// Fills `f` from the command line. Returns the exit code when the program
// should end here (--help, a refused value or combination, said on stderr),
// nothing when it should run.
std::optional<int> parse_flags(int argc, char** argv, Flags& f);

}  // namespace lockstep::examples::train
