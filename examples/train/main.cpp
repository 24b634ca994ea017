// lockstep-train: trains a model preset on HDF5 shards, as one process or
// under mpirun, with checkpoints and exact resume. It is also the worked
// example of the whole API: World, Dataset and DataLoader, model and
// ParameterStore, optimizer, schedule, loss scaler, Trainer, checkpoints.
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <filesystem>
#include <optional>

#include "comm/world.h"
#include "engine/checkpoint.h"
#include "engine/core/log.h"
#include "engine/models.h"
#include "engine/optim/adamw.h"
#include "engine/optim/sgd.h"
#include "engine/run_control.h"
#include "engine/trainer.h"
#include "kernels/gemm.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

struct Flags {
  std::string data, val_data, model = "mlp", optimizer = "sgd", schedule = "constant";
  std::string precision = "fp32", device, shuffle = "on", checkpoint_dir, resume, init_from;
  std::string metrics, log_level = "info";
  std::int64_t epochs = 0, steps = 0, batch_size = 64, warmup = 0, checkpoint_every = 0;
  std::int64_t log_every = 50;
  int accum = 1, keep = 3, threads = 1;
  double lr = 0.05, momentum = 0.9, weight_decay = 0.0, clip = 0.0;
  std::uint64_t seed = 0;
  bool no_decay_bias_norm = false, deterministic = false;
};

std::optional<DType> autocast_for(const std::string& precision) {
  if (precision == "fp32") return std::nullopt;
  if (precision == "fp16") return DType::f16;
  if (precision == "bf16") return DType::bf16;
  throw InvalidArgument("--precision '" + precision + "' is not fp32, fp16 or bf16");
}

// The fields a resume may not change (Note [resume fingerprint]).
std::map<std::string, std::string> fingerprint(const Flags& f, std::int64_t global_batch,
                                               const io::Dataset& data) {
  return {{"model", f.model},
          {"optimizer",
           fmt::format("{} lr={} momentum={} weight_decay={} no_decay_bias_norm={}", f.optimizer,
                       f.lr, f.momentum, f.weight_decay, f.no_decay_bias_norm)},
          {"schedule", fmt::format("{} warmup={} clip={}", f.schedule, f.warmup, f.clip)},
          {"global_batch", std::to_string(global_batch * f.accum)},
          {"precision", f.precision},
          {"seed", std::to_string(f.seed)},
          {"shuffle", f.shuffle},
          {"dataset", fmt::format("{} samples", data.size())}};
}

int run(Flags& f, comm::World& world) {
  const bool lead = world.rank() == 0;
  core::set_log_level(core::parse_log_level(f.log_level));
  kernels::cpu::set_gemm_threads(f.threads);
  install_signal_handlers();
  const core::Device device = world.device();
  const ModelPreset& preset = model_preset(f.model);

  io::Dataset train_data = io::Dataset::open(f.data);
  std::unique_ptr<Module> model = make_model(f.model);
  initialize(*model, f.seed);
  ParameterStore store(*model, device);
  core::Stream stream = core::Stream::create(device);
  if (!f.init_from.empty()) load_weights(f.init_from, *model, stream);

  auto groups = f.no_decay_bias_norm ? decay_groups(store, f.lr, f.weight_decay)
                                     : single_group(store, f.lr, f.weight_decay);
  std::unique_ptr<Optimizer> optimizer;
  if (f.optimizer == "sgd") {
    optimizer = std::make_unique<SGD>(store, groups, SgdOptions{.momentum = f.momentum}, stream);
  } else if (f.optimizer == "adamw") {
    optimizer = std::make_unique<AdamW>(store, groups, AdamwOptions{}, stream);
  } else {
    throw InvalidArgument("--optimizer '" + f.optimizer + "' is not sgd or adamw");
  }

  io::LoaderOptions loader_options;
  loader_options.sampler = {.micro_batch = f.batch_size,
                            .world_size = world.size(),
                            .rank = world.rank(),
                            .shuffle = f.shuffle == "on",
                            .seed = f.seed};
  loader_options.threads = 2;
  loader_options.device = device;
  loader_options.stream = stream;
  loader_options.scale_u8 = true;
  loader_options.num_classes = preset.classes;
  io::DataLoader loader(train_data, loader_options);
  const std::int64_t steps_per_epoch = loader.batches_per_epoch() / f.accum;
  if (steps_per_epoch == 0)
    throw InvalidArgument(
        fmt::format("--data {} has {} samples: too few for one step of {} x {} x {}", f.data,
                    train_data.size(), world.size(), f.batch_size, f.accum));
  const std::int64_t total_steps =
      f.steps > 0 ? f.steps : std::max<std::int64_t>(1, f.epochs) * steps_per_epoch;

  ScheduleOptions schedule;
  schedule.total_steps = total_steps;
  schedule.warmup_steps = f.warmup;
  schedule.step_size = std::max<std::int64_t>(1, total_steps / 3);  // --schedule step: 3 decays
  LossScaler scaler = LossScaler::for_autocast(autocast_for(f.precision));
  TrainerOptions trainer_options;
  trainer_options.accumulation = f.accum;
  trainer_options.autocast = autocast_for(f.precision);
  trainer_options.max_grad_norm = f.clip;
  trainer_options.seed = f.seed;
  trainer_options.sync.host_overlap = comm::host_overlap_pays(world, f.threads);
  Trainer trainer(*model, store, *optimizer, make_scheduler(f.schedule, schedule), scaler, world,
                  trainer_options, stream);

  const auto config = fingerprint(f, f.batch_size * world.size(), train_data);
  std::optional<CheckpointDirectory> checkpoints;
  if (!f.checkpoint_dir.empty()) {
    try {
      checkpoints.emplace(f.checkpoint_dir, f.keep,
                          f.resume.empty() ? CheckpointStart::fresh : CheckpointStart::resume);
    } catch (const CheckpointDirectoryInUse& e) {
      throw InvalidArgument(fmt::format(
          "--checkpoint-dir {} already holds checkpoints of a run (the newest {}): pass "
          "--resume auto to continue it, another --checkpoint-dir to start a new one, or remove "
          "them",
          f.checkpoint_dir, e.newest().filename().string()));
    }
  }
  std::int64_t epoch = 0, position = 0;
  if (!f.resume.empty()) {
    std::optional<std::filesystem::path> file;
    if (f.resume == "auto") {
      if (!checkpoints) throw InvalidArgument("--resume auto needs --checkpoint-dir");
      file = checkpoints->latest_good();
    } else {
      file = f.resume;
    }
    if (file) {
      const TrainingState s = restore_checkpoint(read_checkpoint(*file), file->string(), *model,
                                                 *optimizer, config, stream);
      trainer.set_steps(s.step);
      scaler.set_state(s.scaler);
      epoch = s.epoch;
      position = s.position;
      if (lead)
        fmt::print("resumed from {} at step {} (epoch {}, sample {})\n", file->string(), s.step,
                   epoch, position);
    } else if (lead) {
      fmt::print("no checkpoint in {}: starting fresh\n", f.checkpoint_dir);
    }
  }
  std::int64_t last_saved = -1;
  auto save = [&](std::int64_t at_epoch, std::int64_t at_position) {
    if (!checkpoints || last_saved == trainer.steps()) return;
    last_saved = trainer.steps();
    TrainingState s{trainer.steps(),
                    at_epoch,
                    at_position,
                    scaler.state(),
                    f.seed,
                    world.size(),
                    f.batch_size * world.size(),
                    config};
    const CheckpointContents contents = capture_checkpoint(*model, *optimizer, s, stream);
    if (lead) fmt::print("saved {}\n", checkpoints->save(trainer.steps(), contents).string());
  };

  std::optional<io::DataLoader> val_loader;
  if (!f.val_data.empty()) {
    io::LoaderOptions v = loader_options;
    v.sampler.shuffle = false;
    v.sampler.drop_last = false;
    val_loader.emplace(io::Dataset::open(f.val_data), v);
  }
  MetricsWriter metrics(lead ? f.metrics : "");
  EtaClock eta;
  eta.start(trainer.steps());
  if (lead)
    fmt::print("training {} on {} ({} samples) with {} rank(s) on {}, {} steps of {} samples\n",
               f.model, f.data, train_data.size(), world.size(), device.str(), total_steps,
               f.batch_size * world.size() * f.accum);

  // Where the next step would start: saved with every checkpoint.
  std::int64_t next_epoch = epoch, next_position = position;
  bool stopped = false;
  for (; trainer.steps() < total_steps && !stopped; ++epoch, position = 0) {
    loader.start_epoch(epoch, position);
    while (trainer.steps() < total_steps) {
      const std::optional<StepResult> r = trainer.step(loader);
      if (!r) break;
      next_epoch = epoch;
      next_position = loader.position().position;
      if (lead) {
        metrics.write(fmt::format(
            R"("step": {}, "epoch": {}, "loss": {:.6g}, "lr": {:.6g}, "loss_scale": {}, "grad_norm": {:.6g}, "skipped": {}, "samples_per_s": {:.1f})",
            r->step, epoch, r->loss, r->lr, r->loss_scale, r->grad_norm, r->skipped,
            r->samples / r->seconds));
        if (r->step % f.log_every == 0 || r->step == total_steps || r->step == 1)
          fmt::print("{}\n",
                     progress_line(r->step, total_steps, r->loss, r->lr, r->samples / r->seconds,
                                   eta.eta_s(r->step, total_steps)));
      }
      if (r->stop || (f.checkpoint_every > 0 && r->step % f.checkpoint_every == 0))
        save(next_epoch, next_position);
      if (r->stop) {
        if (lead) fmt::print("stop requested: stopped at step {}\n", r->step);
        stopped = true;
        break;
      }
    }
    if (stopped) break;
    if (trainer.steps() < total_steps || next_position >= loader.sampler().epoch_positions()) {
      next_epoch = epoch + 1;  // the epoch ran out
      next_position = 0;
    }
    if (val_loader) {
      const EvalResult e = trainer.evaluate(*val_loader);
      if (lead) {
        fmt::print("epoch {}: val_loss {:.4f}  val_accuracy {:.2f}%  ({} samples)\n", epoch, e.loss,
                   100 * e.accuracy, e.samples);
        metrics.write(
            fmt::format(R"("step": {}, "epoch": {}, "val_loss": {:.6g}, "val_accuracy": {:.6g})",
                        trainer.steps(), epoch, e.loss, e.accuracy));
      }
    }
  }
  save(next_epoch, next_position);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<comm::World> world;
  Flags f;
  CLI::App app{"lockstep-train: data-parallel training of a model preset on HDF5 shards"};
  app.add_option("--data", f.data, "training shards (a directory of *.h5)")->required();
  app.add_option("--val-data", f.val_data, "evaluation shards, evaluated after every epoch");
  app.add_option("--model", f.model, "mlp, cnn, resnet or mlp-large")->capture_default_str();
  auto* epochs = app.add_option("--epochs", f.epochs, "epochs to train");
  app.add_option("--steps", f.steps, "optimizer steps to train (instead of --epochs)")
      ->excludes(epochs);
  app.add_option("--batch-size", f.batch_size, "micro-batch per rank")->capture_default_str();
  app.add_option("--accum", f.accum, "micro-batches per optimizer step")->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd or adamw")->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "weight decay, on every parameter")
      ->capture_default_str();
  app.add_flag("--no-decay-bias-norm", f.no_decay_bias_norm, "no weight decay on biases and norms");
  app.add_option("--schedule", f.schedule, "constant, step, cosine or linear")
      ->capture_default_str();
  app.add_option("--warmup", f.warmup, "linear warmup steps")->capture_default_str();
  app.add_option("--clip", f.clip, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  app.add_option("--precision", f.precision, "fp32, fp16 or bf16")->capture_default_str();
  app.add_option("--device", f.device, "cpu or cuda (default: cuda when usable)");
  app.add_option("--seed", f.seed, "seed of initialisation, shuffling and dropout")
      ->capture_default_str();
  app.add_option("--shuffle", f.shuffle, "on or off")->capture_default_str();
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "where checkpoints go");
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "save every N steps (0: at the end only)");
  app.add_option("--keep", f.keep, "checkpoints kept")->capture_default_str();
  app.add_option("--resume", f.resume, "auto (the newest good checkpoint) or a checkpoint file");
  app.add_option("--init-from", f.init_from, "start from the /model weights of this HDF5 file");
  app.add_option("--metrics", f.metrics, "append JSON lines (one per step and evaluation) here");
  app.add_option("--log-every", f.log_every, "progress line every N steps")->capture_default_str();
  app.add_option("--log-level", f.log_level, "quiet, warn, info or debug")->capture_default_str();
  app.add_option("--threads", f.threads, "CPU threads per rank (OpenBLAS)")->capture_default_str();
  app.add_flag("--deterministic", f.deterministic, "deterministic cuDNN algorithms only");
  CLI11_PARSE(app, argc, argv);
  try {
    comm::InitOptions init;
    init.use_gpu = f.device != "cpu";
    world = comm::init(argc, argv, init);
    if (f.device == "cuda" && !world->device().is_cuda())
      throw InvalidArgument("--device cuda, but no GPU is usable here (use --device cpu)");
    const int rc = run(f, *world);
    world->shutdown();
    return rc;
  } catch (const std::exception& e) {
    if (world && world->size() > 1) world->abort(std::string("lockstep-train: ") + e.what(), 1);
    fmt::print(stderr, "lockstep-train: {}\n", e.what());
    return 1;
  }
}
