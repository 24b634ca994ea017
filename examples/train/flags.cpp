// lockstep-train's flags (examples/train/flags.h): their definitions and the
// checks of their combinations.
#include "examples/train/flags.h"

#include <fmt/core.h>

#include <filesystem>
#include <utility>

#include "engine/models.h"
#include "examples/common/flags.h"

namespace lockstep::examples::train {

using engine::model_presets;
using engine::ModelPreset;

std::optional<int> parse_flags(int argc, char** argv, Flags& f) {
  CLI::App app{"lockstep-train: data-parallel training of a model preset on HDF5 shards"};
  app.footer(
      "Stopping: SIGINT (Ctrl-C), SIGTERM or SIGUSR1 finishes the current step, saves\n"
      "(with --checkpoint-dir) and exits 0; a second SIGINT exits at once (130).\n"
      "Under OpenMPI's mpirun, send SIGUSR1 (kill -USR1 <mpirun pid>): mpirun forwards\n"
      "it and exits 0. Ctrl-C or SIGTERM to mpirun aborts the job instead: each rank\n"
      "gets SIGTERM a second later, SIGKILL a second after that, and mpirun exits 1\n"
      "(docs/communication.md). Continue with the same command and --resume auto.");
  app.add_option("--data", f.data, "training shards (a directory of *.h5); not with --eval-only");
  app.add_option("--val-data", f.val_data, "evaluation shards, evaluated after every epoch");
  std::string presets;
  for (const ModelPreset& p : model_presets())
    presets += fmt::format("{}{} (input {})", presets.empty() ? "" : ", ", p.name,
                           core::shape_str(p.sample_shape));
  app.add_option("--model", f.model, "model preset: " + presets)->capture_default_str();
  app.add_option("--loss", f.loss,
                 "cross-entropy (class indices from the shards' 'labels'), or mse, l1, huber "
                 "(delta 1) or bce (with logits; targets in [0, 1]) against float 'targets' of "
                 "the model's output shape")
      ->capture_default_str();
  app.add_option("--label-smoothing", f.label_smoothing,
                 "cross-entropy: train towards (1 - e) onehot + e / classes")
      ->capture_default_str();
  app.add_option("--dropout", f.dropout, "dropout of the GPT presets (nanoGPT's places)")
      ->capture_default_str();
  app.add_option("--width-divisor", f.width_divisor,
                 "divide the preset's inner widths by N (its channels, hidden features or "
                 "embedding width): the same depth, names and input at a fraction of the cost, "
                 "for a quick trial of a recipe; 1 is the preset itself")
      ->capture_default_str();
  app.add_flag("--zero-init-residual", f.zero_init_residual,
               "resnet, resnet50: start the last BatchNorm weight of every residual block at 0 "
               "(torchvision's zero_init_residual, as NVIDIA's ResNet-50 recipe does)");
  app.add_flag("--channels-last", f.channels_last,
               "resnet, resnet50: run convolutions, BatchNorm and pooling on channels-last (NHWC) "
               "activations, as tensor cores prefer; input, weights and checkpoints keep "
               "PyTorch's NCHW layouts, so a resume may turn it on or off");
  auto* sample_tokens =
      app.add_option("--sample-tokens", f.sample_tokens,
                     "GPT presets: after training, print this many greedily generated tokens")
          ->capture_default_str();
  app.add_option("--prompt", f.prompt, "GPT presets: the bytes --sample-tokens continues")
      ->needs(sample_tokens);
  auto* epochs = app.add_option("--epochs", f.epochs,
                                "epochs to train [default: 1 when --steps is not given either]");
  app.add_option("--steps", f.steps, "optimizer steps to train (instead of --epochs)")
      ->excludes(epochs);
  app.add_option("--batch-size", f.batch_size, "micro-batch per rank")->capture_default_str();
  app.add_option("--accum", f.accum, "micro-batches per optimizer step")->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd or adamw")->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay,
                 "weight decay (on every parameter unless --no-decay-bias-norm)")
      ->capture_default_str();
  app.add_flag("--no-decay-bias-norm", f.no_decay_bias_norm, "no weight decay on biases and norms");
  app.add_option("--schedule", f.schedule, "constant, step, cosine or linear")
      ->capture_default_str();
  app.add_option("--warmup", f.warmup, "linear warmup steps")->capture_default_str();
  app.add_option("--clip", f.clip, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  app.add_option("--precision", f.precision, "fp32, fp16 or bf16")->capture_default_str();
  app.add_option("--zero", f.zero,
                 "ZeRO stage: 0 (every rank keeps all optimizer state), 1 (each rank keeps "
                 "its shard's), 2 (and only its shard's gradients) or 3 (and only its shard's "
                 "parameters, each transformer block or layer gathered around its passes); "
                 "checkpoints are the same in every stage")
      ->capture_default_str();
  app.add_flag(
      "--activation-checkpointing", f.activation_checkpointing,
      "recompute each transformer block (gpt-tiny, gpt2) or stage (resnet, resnet50) in backward "
      "instead of keeping its activations: the same bits, less memory, one more "
      "forward; a resume may turn it on or off");
  app.add_option("--max-consecutive-skips", f.max_consecutive_skips,
                 "stop with an error after this many steps in a row skipped for inf/NaN")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--device", f.device, "cpu or cuda (default: cuda when usable)");
  app.add_option("--seed", f.seed, "seed of initialisation, shuffling and dropout")
      ->capture_default_str();
  app.add_option("--shuffle", f.shuffle, "on or off")->capture_default_str();
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "where checkpoints go");
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "save every N steps (0: at the end only)");
  app.add_option("--keep", f.keep, "checkpoints kept")->capture_default_str();
  app.add_option("--resume", f.resume, "auto (the newest good checkpoint) or a checkpoint file");
  auto* init_from = app.add_option(
      "--init-from", f.init_from,
      "start from the weights of this HDF5 file: a checkpoint, or a PyTorch state_dict under "
      "/model (docs/models.md); every parameter and buffer, nothing left over");
  app.add_flag("--allow-partial-weights", f.allow_partial_weights,
               "with --init-from: load the entries the model and the file both have, keep the "
               "model's others as initialised, and say in the output what was skipped")
      ->needs(init_from);
  app.add_option("--metrics", f.metrics, "append JSON lines (one per step and evaluation) here");
  app.add_option("--log-every", f.log_every, "progress line every N steps")->capture_default_str();
  app.add_option("--heartbeat", f.heartbeat,
                 "rewrite this file (rank 0's) at every step boundary and every second of a save "
                 "with the step, phase and time, for liveness checks (docs/container.md)");
  app.add_option("--log-level", f.log_level, "quiet, warn, info or debug")->capture_default_str();
  app.add_option("--threads", f.threads, "CPU threads per rank (the CPU GEMM library's)")
      ->capture_default_str();
  app.add_option("--loader-threads", f.loader_threads,
                 "threads per rank reading, decoding and augmenting batches (bench_loader "
                 "--device cuda says how many a GPU's rate needs; the summary says when the "
                 "loader set the pace)")
      ->capture_default_str();
  auto* trace = app.add_option("--trace", f.trace,
                               "write a timeline of each rank to DIR/rank-<r>.json (Perfetto; "
                               "tools/trace.py)");
  app.add_option("--trace-steps", f.trace_steps, "trace only steps FIRST:LAST (e.g. 10:20)")
      ->needs(trace);
  app.add_flag("--profile", f.profile,
               "at the end, print rank 0's spans by name (count, total, mean, max ms, % of the "
               "run), slowest first");
  // The rank-invariant mode (docs/reproducibility.md).
  auto* global_batch =
      app.add_option("--global-batch", f.global_batch,
                     "with --rank-invariant: rows per optimizer step over all ranks, a "
                     "power-of-two number of --batch-size chunks per rank");
  app.add_flag("--rank-invariant", f.rank_invariant,
               "the same bits on any number of ranks the --global-batch supports, and resume "
               "on any of them (--accum follows: --global-batch / (--batch-size x ranks))")
      ->needs(global_batch)
      ->excludes("--accum");
  global_batch->needs("--rank-invariant");
  app.add_flag("--deterministic", f.deterministic,
               "repeatable bits on CUDA: deterministic cuDNN algorithms, no autotuning (the "
               "CPU is deterministic anyway)");
  app.add_flag("--unfused-kernels", f.unfused_kernels,
               "on CUDA, run the unfused ops that the fused kernels replace (attention, "
               "cross-entropy, LayerNorm, GEMM epilogues, BatchNorm; Note [one fusion switch]): "
               "to compare a run with today's fused paths");
  app.add_flag("--cuda-graph", f.cuda_graph,
               "on CUDA with one rank, replay each step's forward and backward as a CUDA graph "
               "captured after two eager steps of the same shapes (Note [step graph]; not with "
               "dropout, --zero or --rank-invariant); the same bits as without");
  // The image pipeline and evaluation (Note [augment recipes]).
  app.add_option("--augment", f.augment,
                 "crop and flip training images in the loader threads: imagenet "
                 "(random-resized-crop), crop-flip (random crop, 4 pixels of padding), or "
                 "preset (imagenet for resnet and resnet50, crop-flip for the 28x28 presets)")
      ->check(one_of({"imagenet", "crop-flip", "preset"}));
  app.add_option("--normalize", f.normalize,
                 "MEAN,STD of pixels in [0, 1], or C means then C stds (e.g. "
                 "0.485,0.456,0.406,0.229,0.224,0.225), or none; with --init-from and "
                 "--eval-only, the file's recorded normalisation unless given")
      ->check(non_empty());
  app.add_option("--val-every", f.val_every, "also evaluate on --val-data every N steps")
      ->check(within(1, kMaxSteps));
  app.add_flag("--eval-only", f.eval_only,
               "evaluate --init-from FILE on --val-data (any number of ranks), print and record "
               "the figures, and exit");

  // What each flag accepts (examples/common/flags.h), checked while parsing.
  app.get_option("--data")->check(non_empty());
  app.get_option("--val-data")->check(non_empty());
  app.get_option("--model")->check(model_name());
  app.get_option("--sample-tokens")->check(within(0, 1e6));
  app.get_option("--prompt")->check(non_empty());
  app.get_option("--epochs")->check(within(1, kMaxEpochs));
  app.get_option("--steps")->check(within(1, kMaxSteps));
  app.get_option("--batch-size")->check(within(1, kMaxRows));
  app.get_option("--accum")->check(within(1, kMaxRows));
  app.get_option("--global-batch")->check(within(1, kMaxRows));
  app.get_option("--optimizer")->check(one_of({"sgd", "adamw"}));
  app.get_option("--loss")->check(one_of({"cross-entropy", "mse", "l1", "huber", "bce"}));
  app.get_option("--label-smoothing")->check(within(0, 1));
  app.get_option("--lr")->check(within(0, 1e6));
  app.get_option("--momentum")->check(within(0, 1));
  app.get_option("--weight-decay")->check(within(0, 1e6));
  app.get_option("--schedule")->check(one_of({"constant", "step", "cosine", "linear"}));
  app.get_option("--warmup")->check(within(0, kMaxSteps));
  app.get_option("--clip")->check(within(0, 1e12));
  app.get_option("--precision")->check(precision_name());
  app.get_option("--zero")->check(within(0, 3));
  app.get_option("--device")->check(device_name());
  app.get_option("--seed")->check(seed_value());
  app.get_option("--shuffle")->check(one_of({"on", "off"}));
  app.get_option("--checkpoint-dir")->check(non_empty());
  app.get_option("--checkpoint-every")->check(within(0, kMaxSteps));
  app.get_option("--keep")->check(within(1, 1e6));
  app.get_option("--resume")->check(non_empty());
  app.get_option("--init-from")->check(non_empty());
  app.get_option("--metrics")->check(non_empty());
  app.get_option("--heartbeat")->check(non_empty());
  app.get_option("--log-every")->check(within(1, kMaxSteps));
  app.get_option("--log-level")->check(one_of({"quiet", "warn", "info", "debug"}));
  app.get_option("--threads")->check(threads_per_rank());
  app.get_option("--loader-threads")->check(threads_per_rank());
  app.get_option("--width-divisor")->check(within(1, 4096));
  app.get_option("--trace")->check(non_empty());
  app.get_option("--trace-steps")->check(step_window());
  CLI11_PARSE(app, argc, argv);
  if (f.data.empty() != f.eval_only) {
    fmt::print(stderr, "lockstep-train: {}\n",
               f.eval_only ? "--eval-only evaluates --init-from on --val-data: leave --data out"
                           : "--data is required (the training shards)");
    return 1;
  }
  // --eval-only reads the weights, the val data and how to evaluate them
  // (evaluate_only); a flag of training would do nothing there, said by name.
  if (f.eval_only)
    for (const char* flag : {"--sample-tokens",
                             "--prompt",
                             "--dropout",
                             "--zero-init-residual",
                             "--epochs",
                             "--steps",
                             "--accum",
                             "--optimizer",
                             "--lr",
                             "--momentum",
                             "--weight-decay",
                             "--no-decay-bias-norm",
                             "--schedule",
                             "--warmup",
                             "--clip",
                             "--zero",
                             "--activation-checkpointing",
                             "--max-consecutive-skips",
                             "--shuffle",
                             "--checkpoint-dir",
                             "--checkpoint-every",
                             "--keep",
                             "--resume",
                             "--log-every",
                             "--heartbeat",
                             "--trace",
                             "--trace-steps",
                             "--profile",
                             "--global-batch",
                             "--rank-invariant",
                             "--augment",
                             "--val-every"})
      if (app.count(flag) > 0) {
        fmt::print(stderr,
                   "lockstep-train: {} does nothing with --eval-only, which evaluates the "
                   "weights of --init-from on --val-data and trains nothing: leave {} out\n",
                   flag, flag);
        return 1;
      }
  // Two outputs at one name would replace each other (the heartbeat's
  // rename would drop the metrics every step); a checkpoint's name in
  // --checkpoint-dir is the run's own (kubernetes/job.yaml keeps its
  // metrics and heartbeat beside the checkpoints: that stays allowed).
  namespace fs = std::filesystem;
  if (!f.metrics.empty() && !f.heartbeat.empty() &&
      fs::weakly_canonical(f.metrics) == fs::weakly_canonical(f.heartbeat)) {
    fmt::print(stderr, "lockstep-train: --metrics and --heartbeat both name '{}': name two files\n",
               f.metrics);
    return 1;
  }
  for (const auto& [flag, path] : {std::pair{"--metrics", f.metrics}, {"--heartbeat", f.heartbeat}})
    if (!path.empty() && !f.checkpoint_dir.empty() &&
        fs::weakly_canonical(fs::path(path).parent_path().empty() ? fs::path(".")
                                                                  : fs::path(path).parent_path()) ==
            fs::weakly_canonical(f.checkpoint_dir) &&
        fs::path(path).filename().string().starts_with("ckpt-")) {
      fmt::print(stderr,
                 "lockstep-train: {} '{}' takes a checkpoint's name in --checkpoint-dir, whose "
                 "ckpt-* files the run writes and prunes: name it otherwise\n",
                 flag, path);
      return 1;
    }
  if (app.count("--momentum") > 0 && f.optimizer != "sgd") {
    fmt::print(stderr,
               "lockstep-train: --momentum {} is SGD's: --optimizer {} has none (leave it out)\n",
               f.momentum, f.optimizer);
    return 1;
  }
  return std::nullopt;
}

}  // namespace lockstep::examples::train
