// lockstep-train: trains a model preset on HDF5 shards, as one process or
// under mpirun, with checkpoints and exact resume. It is also the worked
// example of the whole API: World, Dataset and DataLoader, model and
// ParameterStore, optimizer, schedule, loss scaler, Trainer, checkpoints.
#include <fmt/core.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "comm/ordered_reduce.h"
#include "comm/world.h"
#include "engine/checkpoint.h"
#include "engine/core/log.h"
#include "engine/core/memory.h"
#include "engine/core/trace.h"
#include "engine/heartbeat.h"
#include "engine/input_record.h"
#include "engine/kernel_paths.h"
#include "engine/models.h"
#include "engine/optim/adamw.h"
#include "engine/optim/sgd.h"
#include "engine/run_checkpoints.h"
#include "engine/run_control.h"
#include "engine/run_report.h"
#include "engine/trainer.h"
#include "examples/common/flags.h"
#include "examples/train/flags.h"
#include "io/loader.h"
#include "kernels/fusion.h"
#include "kernels/gemm.h"

using namespace lockstep;
using namespace lockstep::engine;
using namespace lockstep::examples;
using train::Flags;

namespace {

std::optional<DType> autocast_for(const std::string& precision) {
  if (precision == "fp32") return std::nullopt;
  if (precision == "fp16") return DType::f16;
  if (precision == "bf16") return DType::bf16;
  throw InvalidArgument("--precision '" + precision + "' is not fp32, fp16 or bf16");
}

// The settings every rank must share; a resume may not change them either,
// the ones RunCheckpoints records itself (Note [run fingerprint]) compared
// by it, the others as the program's own (Note [resume fingerprint]).
std::map<std::string, std::string> settings(const Flags& f, std::int64_t global_batch,
                                            const io::Dataset& data) {
  std::map<std::string, std::string> fields{
      {"model",
       f.width_divisor == 1 ? f.model : fmt::format("{} width/{}", f.model, f.width_divisor)},
      {"optimizer",
       fmt::format("{} lr={} momentum={} weight_decay={} no_decay_bias_norm={}", f.optimizer, f.lr,
                   f.momentum, f.weight_decay, f.no_decay_bias_norm)},
      {"schedule", fmt::format("{} warmup={} clip={}", f.schedule, f.warmup, f.clip)},
      {"global_batch", std::to_string(global_batch * f.accum)},
      {"precision", f.precision},
      {"seed", std::to_string(f.seed)},
      {"shuffle", f.shuffle},
      {"dataset", fmt::format("{} samples", data.size())},
      {"dropout", fmt::format("{}", f.dropout)},
      {"loss", fmt::format("{} label_smoothing={}", f.loss, f.label_smoothing)},
      {"augment", fmt::format("{} normalize={}", f.augment.empty() ? "none" : f.augment,
                              f.normalize.empty() ? "none" : f.normalize)}};
  return fields;
}

// The program's own fields of the resume check: settings() less those
// RunCheckpoints records itself (Note [run fingerprint]).
std::map<std::string, std::string> own_fingerprint(std::map<std::string, std::string> fields) {
  for (const std::string& name : run_fingerprint_names()) fields.erase(name);
  return fields;
}

// What a field of own_fingerprint() is in a checkpoint that lacks it: one
// made before the field was written always (Note [resume fingerprint]).
const std::map<std::string, std::string> kFingerprintDefaults{
    {"dropout", fmt::format("{}", Flags{}.dropout)}, {"augment", "none normalize=none"}};

// The flags that set the fields RunCheckpoints records, for a refused resume.
const std::map<std::string, std::string> kFingerprintFlags{
    {"parameters", "--model"},
    {"loss", "--loss and --label-smoothing"},
    {"precision", "--precision"},
    {"rank_invariant", "--rank-invariant"},
    {"seed", "--seed"},
    {"global_batch", "--batch-size x ranks x --accum, or --global-batch with --rank-invariant"},
    {"shuffle", "--shuffle"},
    {"sampler_seed", "--seed"},
    {"dataset", "--data"}};

// A language-model preset needs token shards whose windows fit its context;
// an image preset needs labels for cross-entropy and float targets of its
// output's shape for the other losses.
void check_data_fits(const ModelPreset& preset, const std::string& loss, const io::Dataset& data,
                     const std::string& flag, const std::string& path) {
  const io::ShardFormat& format = data.format();
  if (preset.language_model && !format.is_tokens())
    throw InvalidArgument(fmt::format(
        "{} {} holds {}, but --model {} reads token shards (write them with lockstep-shard text)",
        flag, path, format.str(), preset.name));
  if (preset.language_model && loss != "cross-entropy")
    throw InvalidArgument(fmt::format(
        "--loss {}: --model {} predicts the next token, which needs --loss cross-entropy", loss,
        preset.name));
  if (!preset.language_model && format.is_tokens())
    throw InvalidArgument(fmt::format("{} {} holds token windows, but --model {} needs labels",
                                      flag, path, preset.name));
  if (!preset.language_model && loss == "cross-entropy" && !format.has_labels)
    throw InvalidArgument(fmt::format(
        "{} {} holds {}: --loss cross-entropy reads class indices from a 'labels' dataset (float "
        "'targets' need --loss mse, l1, huber or bce)",
        flag, path, format.str()));
  const core::Shape output{preset.classes};
  if (!preset.language_model && loss != "cross-entropy" &&
      !(format.has_targets && format.target_shape == output))
    throw InvalidArgument(fmt::format(
        "{} {} holds {}: --loss {} reads float 'targets' of the model's output shape {} per "
        "sample (--model {}); write them with h5py as docs/data-format.md shows",
        flag, path, format.str(), loss, core::shape_str(output), preset.name));
  if (preset.language_model && format.sample_shape[0] - 1 > preset.sample_shape[0])
    throw InvalidArgument(fmt::format(
        "{} {} holds windows of {} tokens, longer than --model {}'s context of {} + 1 (write "
        "them with a smaller --seq)",
        flag, path, format.sample_shape[0], preset.name, preset.sample_shape[0]));
}

// Note [classes from the data]: resnet50's preset has ImageNet's 1000
// classes, but a recipe is as often run on a subset or another dataset. With
// --loss cross-entropy and a dataset that names its classes (the classes.txt
// lockstep-shard images writes), --model resnet50 gets as many outputs as it
// names, and the header says so. Without a classes.txt the preset's count
// stays (labels are checked against it). The other presets keep theirs:
// their class counts are their datasets' (10 for Fashion-MNIST and CIFAR).
// lockstep-predict and lockstep-export take the count (and the widths) from
// the checkpoint's weights (Note [model from the weights], engine/predict.h).
struct ClassChoice {
  std::int64_t classes = 0;  // make_model's: 0 for the preset's
  std::string note;          // for the header's model line; "": the preset's count
};

ClassChoice choose_classes(const ModelPreset& preset, const std::string& loss,
                           const io::Dataset& data, const std::string& flag) {
  const auto named = static_cast<std::int64_t>(data.class_names().size());
  if (preset.name != "resnet50" || loss != "cross-entropy" || named == 0 || named == preset.classes)
    return {};
  return {named, fmt::format("{} classes, as {}'s {} names them (the preset has {})", named, flag,
                             data.class_names_file().filename().string(), preset.classes)};
}

// What StepOptions::cuda_graph cannot hold (Note [step graph]), in flags, before anything loads.
void check_cuda_graph_flags(const Flags& f, core::Device device, int ranks) {
  if (!f.cuda_graph) return;
  const auto refuse = [](const std::string& why) {
    throw InvalidArgument("--cuda-graph: " + why + "; run without --cuda-graph");
  };
  if (!device.is_cuda())
    refuse(fmt::format("the run is on {}, and CUDA graphs need a GPU", device.str()));
  if (ranks > 1)
    refuse(fmt::format("{} ranks; capturing several ranks' allreduces is not built, only one rank",
                       ranks));
  if (f.zero != 0) refuse(fmt::format("--zero {} gathers and shards on the host mid-step", f.zero));
  if (f.rank_invariant) refuse("--rank-invariant sums its chunks in a host-driven tree");
  if (f.dropout > 0)
    refuse(fmt::format(
        "--dropout {} draws masks from the step number, which a replay cannot change", f.dropout));
}

// The header's model line: "resnet50", or with what changed it ("resnet50,
// 3 classes, as --data's classes.txt names them (...), widths / 16").
std::string model_text(const Flags& f, const ClassChoice& classes) {
  std::string text = f.model;
  if (!classes.note.empty()) text += ", " + classes.note;
  if (f.width_divisor != 1) text += fmt::format(", widths / {}", f.width_divisor);
  if (f.zero_init_residual) text += ", zero-init residual";
  if (f.channels_last) text += ", channels-last";
  return text;
}

// Note [augment recipes]: --augment names how training images are cropped
// and flipped in the loader threads (io/image_transform.h), keyed by (seed,
// epoch, sample): "imagenet" is torchvision's RandomResizedCrop (scale 0.08-1,
// ratio 3/4-4/3) to the model's input size and a horizontal flip; "crop-flip"
// a random crop of the input size from the image padded by 4 zero pixels a
// side and a horizontal flip (the CIFAR and Fashion-MNIST recipe); "preset"
// picks imagenet for resnet and resnet50 and crop-flip for the 28x28 presets. Evaluation,
// and training without --augment, takes the centre crop (the whole image when
// it already has the input size). --normalize MEAN,STD subtracts the mean and
// divides by the std of pixels in [0, 1]: two numbers for every channel, or
// one mean and one std a channel (C means, then C stds); "none" is none.
// Encoded-image shards always go through the pipeline, which also decodes
// them. Checkpoints record all of it (Note [input record]), and
// choose_normalize applies the record of --init-from's file.
io::ImageOptions image_options(const Flags& f, const ModelPreset& preset, const io::Dataset& data,
                               bool training) {
  const io::ShardFormat& format = data.format();
  if (f.augment.empty() && f.normalize.empty() && !format.encoded) return {};
  if (preset.language_model || preset.sample_shape.size() != 3)
    throw InvalidArgument(fmt::format(
        "--augment, --normalize and encoded-image shards need an image model, but --model {} "
        "takes {}",
        preset.name, core::shape_str(preset.sample_shape)));
  if (!format.encoded && (format.input_dtype != DType::u8 || format.sample_shape.size() != 3))
    throw InvalidArgument(fmt::format(
        "--augment and --normalize work on images of bytes (u8 [C, H, W] or encoded-image "
        "shards), but the shards hold {} (write u8 images, or leave both flags out)",
        format.str()));
  io::ImageOptions o{.channels = preset.sample_shape[0],
                     .height = preset.sample_shape[1],
                     .width = preset.sample_shape[2],
                     .seed = f.seed};
  const bool imagenet_preset = preset.name == "resnet" || preset.name == "resnet50";
  const std::string recipe = f.augment != "preset" ? f.augment
                             : imagenet_preset     ? "imagenet"
                                                   : "crop-flip";
  if (training && recipe == "imagenet") {
    o.crop = io::CropKind::random_resized;
    o.flip = true;
  } else if (training && recipe == "crop-flip") {
    o.crop = io::CropKind::random_padded;
    o.padding = 4;
    o.flip = true;
  }
  if (!f.normalize.empty()) {
    std::vector<float> values;
    for (std::size_t at = 0; at <= f.normalize.size();) {
      const std::size_t comma = std::min(f.normalize.find(',', at), f.normalize.size());
      const std::string text = f.normalize.substr(at, comma - at);
      char* end = nullptr;
      const float v = std::strtof(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !std::isfinite(v))
        throw InvalidArgument(
            fmt::format("--normalize {}: '{}' is not a number", f.normalize, text));
      values.push_back(v);
      at = comma + 1;
    }
    const auto channels = static_cast<std::size_t>(o.channels);
    if (values.size() != 2 && values.size() != 2 * channels)
      throw InvalidArgument(fmt::format(
          "--normalize {}: {} numbers, but --model {} takes {} channel{}: give a mean and a std "
          "(2 numbers) or {} means then {} stds",
          f.normalize, values.size(), preset.name, channels, channels == 1 ? "" : "s", channels,
          channels));
    const std::size_t half = values.size() / 2;
    o.mean.assign(values.begin(), values.begin() + half);
    o.std.assign(values.begin() + half, values.end());
  }
  try {
    o.check();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("--normalize {}: {}", f.normalize, e.what()));
  }
  return o;
}

// The crop part of an image pipeline ("center 28x28 of 1 channel"), for the
// header and the input record; "none" without a pipeline.
std::string crop_text(io::ImageOptions o) {
  if (!o.enabled()) return "none";
  o.mean.clear();
  o.std.clear();
  return o.str();
}

// The normalisation a run uses and where it came from (Note [input record]
// in engine/input_record.h): --normalize given on purpose wins ("none": no
// normalisation); otherwise the record of --init-from's file gives it (for
// --eval-only too); a file without a record leaves the flags as they are.
struct InputChoice {
  std::string normalize;  // as --normalize takes it; "" for none
  std::string source;     // " (the checkpoint's)": how the header says where it came from
};

InputChoice choose_normalize(const Flags& f, const std::optional<InputRecord>& record) {
  const bool given = !f.normalize.empty();
  const std::string flag = f.normalize == "none" ? "" : f.normalize;
  if (f.init_from.empty()) return {flag, given ? " (--normalize)" : ""};
  if (!record)
    return {flag, fmt::format(" ({}: {} has no input record, as a PyTorch state_dict has none)",
                              given ? "--normalize" : "no --normalize", f.init_from)};
  const std::string saved = record->normalized() ? record->normalize() : "";
  if (!given) return {saved, " (the checkpoint's)"};
  std::string canonical = flag;
  try {
    canonical = float_list_text(parse_float_list(flag, "--normalize"));
  } catch (const InvalidArgument&) {
    // image_options says what is wrong with it, as without a record
  }
  if (canonical == saved) return {flag, " (--normalize, as the checkpoint's)"};
  return {flag, fmt::format(" (overriding the checkpoint's {})", record->normalize())};
}

// The header's "input" line for an image model: "u8 / 255, augment crop-flip
// (random-padded ...), normalize 0.5,0.5 (the checkpoint's), evaluation center
// 28x28 of 1 channel"; without the augmentation for --eval-only (`training`
// false), which never augments.
std::string input_text(const Flags& f, const InputChoice& choice, const io::Dataset& data,
                       const io::ImageOptions& train_images, const io::ImageOptions& eval_images,
                       bool training) {
  const io::ShardFormat& format = data.format();
  std::string augment;
  if (training)
    augment = fmt::format(
        ", augment {}",
        f.augment.empty() ? "none" : fmt::format("{} ({})", f.augment, crop_text(train_images)));
  return fmt::format("{}{}, normalize {}{}, evaluation {}",
                     format.encoded || format.input_dtype == DType::u8 ? "u8 / 255" : "as stored",
                     augment, choice.normalize.empty() ? "none" : choice.normalize, choice.source,
                     crop_text(eval_images));
}

// How --data and --val-data are opened: --loss bce reads its targets as
// probabilities, so the shards' targets must lie in [0, 1].
io::OpenOptions open_options(const Flags& f) { return {.probability_targets = f.loss == "bce"}; }

// --loss and --label-smoothing as the loss object.
std::shared_ptr<Loss> loss_for(const Flags& f) {
  if (f.label_smoothing != 0.0 && f.loss != "cross-entropy")
    throw InvalidArgument(fmt::format(
        "--label-smoothing {} applies to --loss cross-entropy, not {}", f.label_smoothing, f.loss));
  if (f.loss == "cross-entropy")
    return std::make_shared<CrossEntropyLoss>(-100, static_cast<float>(f.label_smoothing));
  return make_loss(f.loss);
}

// Note [loader pace]: the step's "data" part (core::trace::Breakdown) is the
// time the main thread waited in the loader's next() for a batch that was
// not ready yet. A CUDA step ends with the loss read back, so the GPU has
// nothing queued while the host waits: that wait is the device idling for
// want of data. Summed over the run's steps after its first (which waits
// for the loader's start), its share of the step time says who set the
// pace: at 10% or more, the loader (more --loader-threads, or a cheaper
// pipeline); below, the model. Rank 0's, printed before the summary (the
// metrics' per-step data_wait_ms give every step's).
struct LoaderPace {
  std::int64_t steps = 0, first_step = 0, last_step = 0;
  double wait_ms = 0, step_ms = 0;

  void add(std::int64_t step, double step_wait_ms, double total_ms) {
    if (steps++ == 0) first_step = step;
    last_step = step;
    wait_ms += step_wait_ms;
    step_ms += total_ms;
  }
  std::string text(int loader_threads, const std::string& device) const {
    const double share = step_ms > 0 ? wait_ms / step_ms : 0.0;
    return fmt::format(
        "loader pace: rank 0's steps waited for data {:.1f}% of their time (steps {}-{}, {} loader "
        "thread{} a rank): {}",
        100 * share, first_step, last_step, loader_threads, loader_threads == 1 ? "" : "s",
        share >= 0.1 ? fmt::format("the loader, not the {}, set the pace (raise --loader-threads; "
                                   "bench_loader --device cuda --threads-sweep says how many "
                                   "a GPU needs)",
                                   device)
                     : fmt::format("the step's compute on the {} set the pace", device));
  }
};

// An evaluation's line on the console and its metrics record: bits per
// token for a language model, the accuracy where the loss has it.
// `where` opens the console line ("epoch 2", "step 40"), `fields` the record.
void print_eval(MetricsWriter& metrics, const EvalResult& e, const std::string& where,
                core::Json record, bool language_model) {
  std::string console = fmt::format("{}: val_loss {:.4f}", where, e.loss);
  record.set("val_loss", e.loss);
  if (language_model) {  // bits per token: per byte for byte-level tokens (gpt-tiny)
    const double bits = e.loss / std::log(2.0);
    console += fmt::format("  val_bits_per_token {:.4f}", bits);
    record.set("val_bits_per_token", bits);
  }
  if (e.accuracy) {
    console += fmt::format("  {} {:.2f}%", language_model ? "next-token accuracy" : "val_accuracy",
                           100 * *e.accuracy);
    record.set("val_accuracy", *e.accuracy);
  }
  fmt::print("{}  ({} {})\n", console, e.samples, language_model ? "windows" : "samples");
  metrics.write(record);
}

// --eval-only: the /model weights of --init-from (a checkpoint or a weights
// file) evaluated on --val-data on every rank's share, as an epoch's end
// evaluates; printed by rank 0 and recorded in --metrics.
int evaluate_only(const Flags& flags, comm::World& world) {
  if (flags.val_data.empty() || flags.init_from.empty())
    throw InvalidArgument(
        "--eval-only evaluates the weights of --init-from FILE (a checkpoint) on --val-data DIR: "
        "pass both");
  Flags f = flags;
  const InputChoice input = choose_normalize(flags, read_input_record(flags.init_from));
  f.normalize = input.normalize;
  core::set_log_level(core::parse_log_level(f.log_level));
  use_cpu_threads(f.threads, world.rank() == 0);
  set_deterministic_run(f.deterministic);
  kernels::set_fused_kernels(!f.unfused_kernels);
  const core::Device device = world.device();
  const ModelPreset& preset = model_preset(f.model);
  io::Dataset val_data = io::Dataset::open(f.val_data, open_options(f));
  check_data_fits(preset, f.loss, val_data, "--val-data", f.val_data);
  const ClassChoice classes = choose_classes(preset, f.loss, val_data, "--val-data");
  std::unique_ptr<Module> model =
      make_model(f.model, ModelOptions{.width_divisor = f.width_divisor,
                                       .classes = classes.classes,
                                       .channels_last = f.channels_last});
  initialize(*model, f.seed);
  ParameterStore store(*model, device);
  core::Stream stream = core::Stream::create(device);
  const WeightsLoadReport weights = load_weights(
      f.init_from, *model, stream, WeightsLoadOptions{.allow_partial = f.allow_partial_weights});
  if (world.rank() == 0 && (weights.partial() || !weights.kept_counters.empty()))
    fmt::print("weights of {}: {}\n", f.init_from, weights.summary());
  SGD optimizer(store, single_group(store, 0.0, 0.0), SgdOptions{}, stream);  // never steps
  io::LoaderOptions v;
  v.sampler = {.micro_batch = f.batch_size,
               .world_size = world.size(),
               .rank = world.rank(),
               .shuffle = false,
               .drop_last = false};
  v.threads = f.loader_threads;
  v.device = device;
  v.stream = stream;
  v.images = image_options(f, preset, val_data, false);
  v.scale_u8 =
      val_data.format().input_dtype == DType::u8 && !preset.language_model && !v.images.enabled();
  if (world.rank() == 0 && !preset.language_model && preset.sample_shape.size() == 3)
    fmt::print("input: {}\n", input_text(f, input, val_data, {}, v.images, false));
  v.num_classes = classes.classes > 0 ? classes.classes : preset.classes;
  io::DataLoader loader(val_data, v);
  StepOptions options;
  options.loss = loss_for(f);
  options.autocast = autocast_for(f.precision);
  options.seed = f.seed;
  options.agreement = {{"model", f.model},
                       {"init_from", std::filesystem::path(f.init_from).filename().string()}};
  for (auto& field : val_data.agreement_fields()) options.agreement.push_back(field);
  LossScaler scaler = LossScaler::for_autocast(options.autocast);
  ScheduleOptions schedule;
  schedule.total_steps = 1;
  Trainer trainer(*model, store, optimizer, make_scheduler("constant", schedule), scaler, world,
                  options, stream);
  const EvalResult e = trainer.evaluate(loader);
  MetricsWriter metrics(world.rank() == 0 ? f.metrics : "");
  if (world.rank() == 0)
    print_eval(metrics, e, fmt::format("{} on {}", f.init_from, f.val_data),
               core::Json::object()
                   .set("eval_only", f.init_from)
                   .set("val_data", f.val_data)
                   .set("ranks", world.size()),
               preset.language_model);
  return metrics.failed() ? 1 : 0;
}

// --rank-invariant: the chunks per rank K = --global-batch / (--batch-size x
// ranks), which must be a power of two (Note [invariant world sizes]).
int invariant_accumulation(const Flags& f, int world_size) {
  const std::int64_t chunks = f.global_batch / f.batch_size;
  const std::vector<int> sizes = comm::invariant_world_sizes(chunks);
  if (f.global_batch % f.batch_size != 0 || !comm::invariant_world_size(chunks, world_size))
    throw InvalidArgument(fmt::format(
        "--rank-invariant: --global-batch {} is not a power-of-two number of --batch-size {} "
        "chunks on each of {} ranks{}; {} (Note [invariant world sizes], comm/ordered_reduce.h)",
        f.global_batch, f.batch_size, world_size,
        f.global_batch % f.batch_size != 0
            ? fmt::format(" ({} rows are not whole chunks)", f.global_batch)
            : fmt::format(" ({} chunks)", chunks),
        f.global_batch % f.batch_size != 0
            ? "make --global-batch a multiple of --batch-size"
            : fmt::format("run {} chunks on {} ranks", chunks, comm::world_sizes_text(sizes))));
  return static_cast<int>(chunks / world_size);
}

int run(const Flags& flags, comm::World& world) {
  Flags with_accum = flags;
  if (flags.rank_invariant) with_accum.accum = invariant_accumulation(flags, world.size());
  // Before the fingerprint: a resume of an --init-from run sees the same value.
  const InputChoice input = choose_normalize(
      flags, flags.init_from.empty() ? std::nullopt : read_input_record(flags.init_from));
  with_accum.normalize = input.normalize;
  const Flags& f = with_accum;
  // A batch of K x B rows per rank per step (Note [rank-invariant batches]).
  const std::int64_t loader_rows = f.rank_invariant ? f.batch_size * f.accum : f.batch_size;
  const int loader_batches = f.rank_invariant ? 1 : f.accum;
  const bool lead = world.rank() == 0;
  if (!f.trace.empty()) {
    world.host().barrier();
    start_trace(world.rank(), f.trace, f.trace_steps);
  }
  core::set_log_level(core::parse_log_level(f.log_level));
  use_cpu_threads(f.threads, lead);
  // Note [rank-invariant step]: on CUDA the mode needs the deterministic kernels.
  set_deterministic_run(f.deterministic || f.rank_invariant);
  kernels::set_fused_kernels(!f.unfused_kernels);
  install_signal_handlers();
  const core::Device device = world.device();
  check_cuda_graph_flags(f, device, world.size());
  const ModelPreset& preset = model_preset(f.model);

  if (f.sample_tokens > 0 && !preset.language_model)
    throw InvalidArgument(
        fmt::format("--sample-tokens {}: --model {} generates no text (only the GPT presets do)",
                    f.sample_tokens, f.model));
  if (f.val_every > 0 && f.val_data.empty())
    throw InvalidArgument(
        fmt::format("--val-every {} evaluates on --val-data: pass it too", f.val_every));
  std::shared_ptr<Loss> loss = loss_for(f);
  io::Dataset train_data = io::Dataset::open(f.data, open_options(f));
  check_data_fits(preset, f.loss, train_data, "--data", f.data);
  std::optional<io::Dataset> val_data;
  if (!f.val_data.empty()) {
    val_data = io::Dataset::open(f.val_data, open_options(f));
    check_data_fits(preset, f.loss, *val_data, "--val-data", f.val_data);
    io::check_same_classes(train_data, "--data " + f.data, *val_data,  // Note [same classes]
                           "--val-data " + f.val_data);
  }
  const ClassChoice classes = choose_classes(preset, f.loss, train_data, "--data");
  std::unique_ptr<Module> model =
      make_model(f.model, ModelOptions{.dropout = static_cast<float>(f.dropout),
                                       .activation_checkpointing = f.activation_checkpointing,
                                       .width_divisor = f.width_divisor,
                                       .zero_init_residual = f.zero_init_residual,
                                       .classes = classes.classes,
                                       .channels_last = f.channels_last});
  initialize(*model, f.seed);
  // ZeRO-2 never makes the flat gradient buffer (Note [transient gradients]);
  // ZeRO-3 lays the units out for the world (Note [parameter units]).
  ParameterStore store(
      *model, device, {},
      f.zero >= 2 ? ParameterStore::Gradients::groups : ParameterStore::Gradients::flat,
      f.zero == 3 ? ParameterUnits{default_units(*model), world.size()} : ParameterUnits{});
  core::Stream stream = core::Stream::create(device);
  std::string weights_note;  // said in the header's "start" line unless a resume replaces them
  if (!f.init_from.empty())
    weights_note =
        fmt::format("weights of {}: {}", f.init_from,
                    load_weights(f.init_from, *model, stream,
                                 WeightsLoadOptions{.allow_partial = f.allow_partial_weights})
                        .summary());

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

  const std::int64_t optimizer_state_bytes = optimizer->state_bytes();  // unsharded: the header's
  io::LoaderOptions loader_options;
  loader_options.sampler = {.micro_batch = loader_rows,
                            .world_size = world.size(),
                            .rank = world.rank(),
                            .shuffle = f.shuffle == "on",
                            .seed = f.seed};
  loader_options.threads = f.loader_threads;
  loader_options.device = device;
  loader_options.stream = stream;
  // u8 inputs (images of bytes) are scaled to [0, 1]; f16 and f32 ones are
  // used as stored.
  loader_options.images = image_options(f, preset, train_data, true);
  loader_options.scale_u8 = train_data.format().input_dtype == DType::u8 &&
                            !preset.language_model && !loader_options.images.enabled();
  loader_options.num_classes = classes.classes > 0 ? classes.classes : preset.classes;
  const io::ImageOptions eval_images = image_options(f, preset, train_data, false);
  const InputRecord input_record{
      .scale_u8 = loader_options.scale_u8 || loader_options.images.enabled(),
      .mean = loader_options.images.mean,
      .std = loader_options.images.std,
      .augment = f.augment.empty() ? "none" : f.augment,
      .eval_transform = crop_text(eval_images)};
  loader_options.held_batches = loader_batches;  // Trainer::step holds a step's micro-batches
  // Checked before the loader sizes its buffers from --batch-size and --accum.
  const std::int64_t steps_per_epoch =
      io::DistributedSampler(train_data.size(), loader_options.sampler).batches_per_epoch() /
      loader_batches;
  if (steps_per_epoch == 0)
    throw InvalidArgument(fmt::format(
        "--data {} has {} samples: too few for one step of {} ranks x --batch-size {} x --accum "
        "{} (lower --batch-size or --accum)",
        f.data, train_data.size(), world.size(), f.batch_size, f.accum));
  io::DataLoader loader(train_data, loader_options);
  const std::int64_t total_steps =
      f.steps > 0 ? f.steps : std::max<std::int64_t>(1, f.epochs) * steps_per_epoch;
  const std::string length_reason =
      f.steps > 0    ? fmt::format("--steps {}", f.steps)
      : f.epochs > 0 ? fmt::format("--epochs {}", f.epochs)
                     : std::string("1 epoch, as neither --epochs nor --steps was given");

  ScheduleOptions schedule;
  schedule.total_steps = total_steps;
  schedule.warmup_steps = f.warmup;
  schedule.step_size = std::max<std::int64_t>(1, total_steps / 3);  // --schedule step: 3 decays
  StepOptions trainer_options;
  trainer_options.loss = loss;
  trainer_options.accumulation = f.accum;
  trainer_options.autocast = autocast_for(f.precision);
  LossScaler scaler = LossScaler::for_autocast(trainer_options.autocast);
  trainer_options.max_grad_norm = f.clip;
  trainer_options.seed = f.seed;
  trainer_options.max_consecutive_skips = f.max_consecutive_skips;
  trainer_options.sync.zero_stage = f.zero;
  trainer_options.rank_invariant = f.rank_invariant;
  trainer_options.cuda_graph = f.cuda_graph;

  const auto config = settings(f, f.batch_size * world.size(), train_data);
  if (f.resume == "auto" && f.checkpoint_dir.empty())
    throw InvalidArgument("--resume auto needs --checkpoint-dir");
  Heartbeat heartbeat(lead ? f.heartbeat : "");  // Note [heartbeat]
  RunCheckpointOptions checkpoint_options{
      .directory = f.checkpoint_dir,
      .keep_last = f.keep,
      .start = f.resume.empty()     ? RunCheckpointOptions::Start::fresh
               : f.resume == "auto" ? RunCheckpointOptions::Start::latest
                                    : RunCheckpointOptions::Start::file,
      .file = f.resume == "auto" ? std::string() : f.resume,
      .config = own_fingerprint(config),
      .config_defaults = kFingerprintDefaults,
      .set_by = kFingerprintFlags,
      .heartbeat = &heartbeat,
      .input = input_record.fields()};
  std::optional<RunCheckpoints> checkpoints;
  try {
    checkpoints.emplace(world, std::move(checkpoint_options));
  } catch (const CheckpointDirectoryLocked& e) {
    throw IoError(fmt::format(
        "--checkpoint-dir {} is another run's: {} holds its lock (wait for that run to end or "
        "stop it, or pass another --checkpoint-dir)",
        f.checkpoint_dir, e.holder().empty() ? "a process starting up" : e.holder()));
  } catch (const CheckpointDirectoryInUse& e) {
    throw InvalidArgument(fmt::format(
        "--checkpoint-dir {} already holds checkpoints of a run (the newest {}): pass "
        "--resume auto to continue it, another --checkpoint-dir to start a new one, or remove "
        "them",
        f.checkpoint_dir, e.newest().filename().string()));
  }
  // Every rank checks the others' configuration, data and checkpoint in the
  // Trainer's constructor, before anything trains (comm::check_agreement).
  for (const auto& [key, value] : config) trainer_options.agreement.emplace_back(key, value);
  // Every rank alike, but not in the fingerprint: a resume may turn it on or
  // off, as the gradients are the same bits (Note [activation checkpointing]).
  trainer_options.agreement.emplace_back("activation_checkpointing",
                                         f.activation_checkpointing ? "on" : "off");
  // The same for the layout (Note [channels-last layers]): the same
  // checkpoints, and on the CPU the same bits.
  trainer_options.agreement.emplace_back("channels_last", f.channels_last ? "on" : "off");
  for (auto& field : train_data.agreement_fields()) trainer_options.agreement.push_back(field);
  for (auto& [key, value] : val_data ? val_data->agreement_fields() : comm::NamedValues{})
    trainer_options.agreement.emplace_back("val_" + key, value);
  trainer_options.agreement.push_back(checkpoints->agreement_field());
  Trainer trainer(*model, store, *optimizer, make_scheduler(f.schedule, schedule), scaler, world,
                  trainer_options, stream);

  // The epoch counts from 0 here, from 1 in what is shown.
  const RunPosition start = checkpoints->restore(*model, *optimizer, trainer.data_parallel_step(),
                                                 scaler, loader, stream);
  std::int64_t epoch = start.data.epoch, position = start.data.position;
  std::string resume_note;
  if (const auto& file = checkpoints->resume_file())
    resume_note = fmt::format("resumed from {} at step {} (epoch {}, sample {})", file->string(),
                              start.step, epoch + 1, position);
  else if (f.resume == "auto")
    resume_note = fmt::format("no checkpoint in {}: starting fresh", f.checkpoint_dir);
  if (!checkpoints->resume_file() && !weights_note.empty())
    resume_note += (resume_note.empty() ? "" : "; ") + weights_note;
  MetricsWriter metrics(lead ? f.metrics : "");
  heartbeat.beat(trainer.steps(), "starting");
  std::optional<RunReport> report;
  auto save = [&] {
    const std::filesystem::path path =
        checkpoints->save(*model, *optimizer, trainer.data_parallel_step(), scaler, loader, stream);
    if (path.empty()) return;
    report->set_last_checkpoint(path.string());
    fmt::print("saved {}\n", path.string());
    std::fflush(stdout);
  };

  std::optional<io::DataLoader> val_loader;
  if (val_data) {
    io::LoaderOptions v = loader_options;
    v.images = image_options(f, preset, *val_data, false);
    v.scale_u8 = val_data->format().input_dtype == DType::u8 && !preset.language_model &&
                 !v.images.enabled();
    v.sampler.shuffle = false;
    v.sampler.drop_last = false;
    val_loader.emplace(*val_data, v);
  }
  RunHeader header{.program = "lockstep-train",
                   .model = model_text(f, classes),
                   .device_reason = explain_device(device, f.device, "--device"),
                   .threads = f.threads,
                   .loader_threads = loader_options.threads,
                   .cpu_gemm = device.is_cuda() ? "" : kernels::cpu::cpu_gemm_kernels().describe(),
                   .micro_batch = f.batch_size,
                   .accumulation = f.accum,
                   .steps_per_epoch = steps_per_epoch,
                   .total_steps = total_steps,
                   .length_reason = length_reason,
                   .start_step = trainer.steps(),
                   .resume = resume_note,
                   .precision = f.precision,
                   .loss_scaling = scaler.enabled(),
                   .zero_stage = f.zero,
                   .activation_checkpointing = f.activation_checkpointing,
                   .parameter_bytes = 4 * store.size(),
                   .optimizer_state_bytes = optimizer_state_bytes,
                   .data = {{"train", f.data, &train_data}},
                   .checkpoint_dir = f.checkpoint_dir,
                   .metrics_path = f.metrics};
  if (val_data) header.data.push_back({"val", f.val_data, &*val_data});
  if (!preset.language_model && preset.sample_shape.size() == 3)
    header.input = input_text(f, input, train_data, loader_options.images, eval_images, true);
  // A language model's step counts target tokens (StepResult::samples); the
  // report, the metrics and the progress line count windows (tokens/s: the summary).
  const std::int64_t tokens_per_window =
      preset.language_model ? train_data.format().sample_shape[0] - 1 : 1;
  if (preset.language_model) header.tokens_per_sample = tokens_per_window;
  report.emplace(world, std::move(header), metrics);
  EtaClock eta;
  eta.start(trainer.steps());
  const std::int64_t first_step = trainer.steps() + 1;
  if (f.profile) core::trace::enable_profile();  // from the first step on
  LoaderPace pace;

  bool stopped = false;
  // Note [one record per evaluation]: --val-every's evaluation at an epoch's
  // last step is that epoch's evaluation too; the end of the epoch does not
  // evaluate the same weights again (nor record them twice).
  std::int64_t evaluated_at = -1;
  for (; trainer.steps() < total_steps && !stopped; ++epoch, position = 0) {
    loader.start_epoch(epoch, position);
    while (trainer.steps() < total_steps) {
      const std::optional<StepResult> r = trainer.step(loader);
      if (!r) break;
      // Samples (windows for a language model) per second, as the summary counts them.
      const std::int64_t samples = r->samples / tokens_per_window;
      const double samples_per_s = static_cast<double>(samples) / r->seconds;
      report->record_step(r->step, r->loss, samples, r->seconds, r->skipped);
      if (r->step > first_step) pace.add(r->step, r->breakdown.data_wait_ms, 1e3 * r->seconds);
      heartbeat.beat(r->step, "training");
      // Rank 0's breakdown and device memory; the summary gives every rank's peak.
      const std::size_t peak_bytes = core::memory_stats(device).peak_bytes;
      // Note [kernel paths]: which fused paths this process's first step took,
      // said once: a "kernels" block after its line and in its step record.
      std::optional<KernelPaths> kernel_paths;
      if (lead && r->step == first_step)
        kernel_paths = collect_kernel_paths(device, optimizer.get(), trainer_options.autocast);
      if (lead && !f.metrics.empty()) {  // formatted only when written
        core::Json record = core::Json::object()
                                .set("step", r->step)
                                .set("epoch", epoch + 1)
                                .set("loss", r->loss)
                                .set("lr", r->lr)
                                .set("loss_scale", r->loss_scale)
                                .set("grad_norm", r->grad_norm)
                                .set("skipped", r->skipped)
                                .set("samples_per_s", samples_per_s)
                                .set("skipped_steps", r->skipped_steps);
        add_step_detail(record, r->breakdown, 1e3 * r->seconds, peak_bytes);
        if (kernel_paths) record.set("kernels", kernel_paths->json());
        metrics.write(record);
      }
      if (lead && (r->step % f.log_every == 0 || r->step == total_steps || r->step == 1))
        fmt::print("{}  {}\n",
                   progress_line(r->step, total_steps, r->loss, r->lr, samples_per_s,
                                 eta.eta_s(r->step, total_steps)),
                   step_detail(r->breakdown, 1e3 * r->seconds, peak_bytes, device.str()));
      if (kernel_paths)
        for (const std::string& line : kernel_paths->header_lines()) fmt::print("{}\n", line);
      if (val_loader && f.val_every > 0 && r->step % f.val_every == 0 && !r->stop) {
        const EvalResult e = trainer.evaluate(*val_loader);
        report->record_eval(r->step, epoch + 1, e.loss, e.accuracy);
        evaluated_at = r->step;
        if (lead)
          print_eval(metrics, e, fmt::format("step {}", r->step),
                     core::Json::object().set("step", r->step).set("epoch", epoch + 1),
                     preset.language_model);
      }
      if (r->stop || (f.checkpoint_every > 0 && r->step % f.checkpoint_every == 0)) save();
      if (r->stop) {
        const std::string why = metrics.failed()
                                    ? "as the --metrics file cannot be written (see above)"
                                    : "on request (a signal)";
        report->set_stopped(why);
        if (lead) {
          // Flushed at once: under mpirun a SIGKILL may follow (docs/communication.md).
          fmt::print("stopped at step {} {}: {}\n", r->step, why,
                     checkpoints->saves() ? "to continue, run the same command with --resume auto"
                                          : "nothing saved (no --checkpoint-dir)");
          std::fflush(stdout);
        }
        stopped = true;
        break;
      }
    }
    if (stopped) break;
    if (trainer.steps() < total_steps ||
        loader.position().position >= loader.sampler().epoch_positions())
      report->end_epoch();  // the epoch ran out
    // Note [one record per evaluation]: not again at a step --val-every evaluated.
    if (val_loader && evaluated_at != trainer.steps()) {
      const EvalResult e = trainer.evaluate(*val_loader);
      report->record_eval(trainer.steps(), epoch + 1, e.loss, e.accuracy);
      evaluated_at = trainer.steps();
      if (lead)
        print_eval(metrics, e, fmt::format("epoch {}", epoch + 1),
                   core::Json::object().set("step", trainer.steps()).set("epoch", epoch + 1),
                   preset.language_model);
    }
  }
  save();
  // A stopped run has not finished training: no sample of it.
  if (lead && f.sample_tokens > 0 && !stopped) {
    std::vector<std::int32_t> prompt;  // bytes as tokens 0-255: char is signed on x86
    for (const unsigned char byte : f.prompt) prompt.push_back(byte);
    const std::vector<std::int32_t> text =
        generate_greedy(static_cast<GPT&>(*model), prompt, f.sample_tokens, device, stream);
    std::string bytes;
    for (std::int32_t t : text) bytes.push_back(static_cast<char>(t));
    fmt::print("sample (greedy, {} tokens after the prompt):\n{}\n", f.sample_tokens, bytes);
  }
  if (const auto file = core::trace::finish(); !file.empty() && lead)
    fmt::print("trace: {} (and the other ranks' files beside it)\n", file.string());
  if (const core::trace::Profile p = core::trace::finish_profile(); f.profile && lead)
    fmt::print(
        "profile of rank 0: spans by name over {:.3f} s from step {} on (a span's time "
        "also counts in the spans around it)\n{}",
        p.wall_ms / 1e3, first_step, core::trace::format_profile(p));
  if (lead && pace.steps > 0)
    fmt::print("{}\n", pace.text(loader_options.threads, device.is_cuda() ? "GPU" : "CPU"));
  if (const StepGraphCounts* g = trainer.data_parallel_step().graph_counts(); lead && g)
    fmt::print("cuda graph: {} captured ({} nodes), {} steps replayed, {} eager{}\n", g->captures,
               g->nodes, g->replays, g->eager,
               g->last_eager_reason.empty() ? "" : " (last: " + g->last_eager_reason + ")");
  report->finish();  // "stopped at step N" after a stop, "done at step N" otherwise
  heartbeat.beat(trainer.steps(), stopped ? "stopped" : "done");
  return metrics.failed() ? 1 : 0;  // Note [write failures]: lost metrics are an error
}

}  // namespace

int main(int argc, char** argv) {
  train::Flags f;
  if (const std::optional<int> exit_code = train::parse_flags(argc, argv, f)) return *exit_code;
  comm::InitOptions init;
  init.use_gpu = f.device != "cpu";
  return comm::guarded_main("lockstep-train", argc, argv, init, [&](comm::World& world) {
    if (f.device == "cuda" && !world.device().is_cuda())
      throw InvalidArgument("--device cuda, but no GPU is usable here (use --device cpu)");
    return f.eval_only ? evaluate_only(f, world) : run(f, world);
  });
}
