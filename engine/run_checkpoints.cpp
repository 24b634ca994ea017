// RunCheckpoints (engine/run_checkpoints.h): the directory, the choice, the
// restore and the saves of one run, and the run's fingerprint (Note [run
// fingerprint]).
#include "engine/run_checkpoints.h"

#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>

#include "comm/flight_recorder.h"
#include "engine/checkpoint_choice.h"
#include "engine/core/trace.h"
#include "engine/nn/channels_last.h"

namespace lockstep::engine {
namespace {

// LOCKSTEP_TEST_SAVE_DELAY: seconds added to each write of rank 0.
double test_save_delay_s() {
  const char* text = std::getenv("LOCKSTEP_TEST_SAVE_DELAY");
  if (!text) return 0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (*text == '\0' || *end != '\0' || !(seconds >= 0 && seconds <= 3600))
    throw InvalidArgument(fmt::format(
        "LOCKSTEP_TEST_SAVE_DELAY='{}' is not a number of seconds from 0 to 3600", text));
  return seconds;
}

// Note [run fingerprint]: the version of the record a checkpoint carries.
constexpr std::int64_t kFingerprintVersion = 1;

// Note [run fingerprint]: the fields lockstep-train recorded before 0.2.0
// under these names and in these words, compared in its older checkpoints.
bool recorded_before_0_2(const std::string& name) {
  return name == "global_batch" || name == "precision" || name == "seed" || name == "shuffle" ||
         name == "dataset";
}

// 64-bit FNV-1a: a digest of the parameter names and shapes that a message can show.
std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// The `parameters` field: the root's type, the count of parameters and of
// their values, and a digest of every name and shape in order. A ChannelsLast
// root is its inner model's type: the layout is no part of a checkpoint, and
// a resume may switch it (Note [channels-last layers]).
std::string parameters_field(Module& model) {
  auto* channels_last = dynamic_cast<ChannelsLast*>(&model);
  const std::string& type = (channels_last ? channels_last->inner() : model).type_name();
  std::string layout;
  std::int64_t values = 0;
  const std::vector<Parameter*> parameters = model.parameters();
  for (const Parameter* p : parameters) {
    layout += p->name + core::shape_str(p->value.shape()) + ";";
    values += p->value.numel();
  }
  return fmt::format("{}, {} parameters of {} values (names and shapes {:016x})", type,
                     parameters.size(), values, fnv1a(layout));
}

// The checkpoint's config.<name>, if it holds one as a string.
std::optional<std::string> saved_field(const CheckpointContents& c, const std::string& name) {
  const auto it = c.attributes.find("config." + name);
  if (it == c.attributes.end() || !std::holds_alternative<std::string>(it->second))
    return std::nullopt;
  return std::get<std::string>(it->second);
}

}  // namespace

std::vector<std::string> run_fingerprint_names() {
  return {"parameters",   "loss",    "precision",    "rank_invariant", "seed",
          "global_batch", "shuffle", "sampler_seed", "dataset"};
}

std::vector<RunFingerprintField> run_fingerprint(Module& model, const DataParallelStep& step,
                                                 const io::BatchSource* source, int world_size) {
  const StepOptions& o = step.options();
  std::vector<RunFingerprintField> fields{
      {"parameters", parameters_field(model), "the model"},
      // StepOptions::loss null: the step's default, CrossEntropyLoss().
      {"loss", o.loss ? o.loss->describe() : CrossEntropyLoss().describe(), "StepOptions::loss"},
      {"precision",
       !o.autocast                 ? "fp32"
       : *o.autocast == DType::f16 ? "fp16"
                                   : "bf16",
       "StepOptions::autocast"},
      {"rank_invariant", o.rank_invariant ? "on" : "off", "StepOptions::rank_invariant"},
      {"seed", std::to_string(o.seed), "StepOptions::seed"}};
  if (!source) return fields;
  const io::DistributedSampler& sampler = source->sampler();
  // Note [rank-invariant batches] (engine/trainer.h): one batch of K x B rows per step.
  const std::int64_t global_batch =
      sampler.options().micro_batch * world_size * (o.rank_invariant ? 1 : o.accumulation);
  fields.push_back({"global_batch", std::to_string(global_batch),
                    "SamplerOptions::micro_batch x ranks x StepOptions::accumulation"});
  fields.push_back(
      {"shuffle", sampler.options().shuffle ? "on" : "off", "SamplerOptions::shuffle"});
  fields.push_back(
      {"sampler_seed",
       sampler.options().shuffle ? std::to_string(sampler.options().seed) : "none (not shuffled)",
       "SamplerOptions::seed"});
  fields.push_back(
      {"dataset", fmt::format("{} samples", sampler.dataset_size()), "the batch source's dataset"});
  return fields;
}

RunCheckpoints::RunCheckpoints(comm::World& world, RunCheckpointOptions options)
    : world_(world), options_(std::move(options)) {
  using Start = RunCheckpointOptions::Start;
  for (const std::string& name : run_fingerprint_names())
    if (options_.config.count(name))
      throw InvalidArgument(fmt::format(
          "RunCheckpointOptions::config has a field '{}' ('{}'), which RunCheckpoints records "
          "itself from the run (Note [run fingerprint]): drop it from config, or rename it if "
          "it means something else",
          name, options_.config.at(name)));
  if (!options_.directory.empty()) {
    directory_.emplace(
        options_.directory, options_.keep_last,
        options_.start == Start::fresh ? CheckpointStart::fresh : CheckpointStart::resume,
        world_.rank() == 0 ? CheckpointLock::hold : CheckpointLock::none);
    comm::set_flight_directory(options_.directory);  // where flight-rank-<r>.json dumps go
  }
  // Collective whatever the start, so that ranks given different starts
  // cannot wait on each other (Note [checkpoint choice]).
  const std::string newest = newest_checkpoint_name_of_rank0(
      world_.host(), options_.start == Start::latest && directory_ ? &*directory_ : nullptr);
  if (options_.start == Start::latest && !newest.empty())
    resume_file_ = directory_->directory() / newest;
  if (options_.start == Start::file) resume_file_ = options_.file;
}

std::pair<std::string, std::string> RunCheckpoints::agreement_field() const {
  return checkpoint_agreement_field(resume_file_);
}

RunPosition RunCheckpoints::restore(Module& model, Optimizer& optimizer, DataParallelStep& step,
                                    LossScaler& scaler, const io::BatchSource& source,
                                    const core::Stream& stream) {
  return restore_from(model, optimizer, step, scaler, &source, stream);
}

RunPosition RunCheckpoints::restore(Module& model, Optimizer& optimizer, DataParallelStep& step,
                                    LossScaler& scaler, const core::Stream& stream) {
  return restore_from(model, optimizer, step, scaler, nullptr, stream);
}

RunPosition RunCheckpoints::restore_from(Module& model, Optimizer& optimizer,
                                         DataParallelStep& step, LossScaler& scaler,
                                         const io::BatchSource* source,
                                         const core::Stream& stream) {
  if (!resume_file_) return {};
  // ZeRO-3: the loaded values reach each rank's shard (Note [parameter units]).
  const DataParallelStep::FullParameters full = step.full_parameters(true);
  const CheckpointContents contents = read_checkpoint(*resume_file_);
  // Note [run fingerprint]: compared first, naming what sets the field. The
  // program's own fields follow in restore_checkpoint, which takes the
  // checkpoint's recorded values as given.
  const bool recorded = contents.attributes.count("fingerprint_version") > 0;
  std::map<std::string, std::string> config = options_.config;
  for (const RunFingerprintField& field : run_fingerprint(model, step, source, world_.size())) {
    const std::optional<std::string> saved = saved_field(contents, field.name);
    if (!saved) {
      if (recorded)
        throw InvalidArgument(fmt::format(
            "cannot resume from {}: it records the run's fingerprint but not its {} (a damaged "
            "file, or one written by another program)",
            resume_file_->string(), field.name));
      continue;  // before 0.2.0: not recorded
    }
    config[field.name] = *saved;
    if (!recorded && !recorded_before_0_2(field.name)) continue;
    if (*saved != field.value) {
      const auto named = options_.set_by.find(field.name);
      throw InvalidArgument(fmt::format(
          "cannot resume from {}: {} was '{}' and is now '{}' (set by {}; a resume may change "
          "the world size, the accumulation and the micro-batch where the global batch holds, the "
          "ZeRO stage, steps, epochs, logging, checkpoint cadence and threads, not {}: "
          "docs/checkpoints.md)",
          resume_file_->string(), field.name, *saved, field.value,
          named != options_.set_by.end() ? named->second : field.set_by, field.name));
    }
  }
  // The data's fields a run without a source cannot compare (the deprecated restore).
  for (const std::string& name : run_fingerprint_names())
    if (const std::optional<std::string> saved = saved_field(contents, name))
      config.emplace(name, *saved);
  const TrainingState s = restore_checkpoint(contents, resume_file_->string(), model, optimizer,
                                             config, options_.config_defaults, stream);
  step.set_steps(s.step);
  scaler.set_state(s.scaler);
  // The checkpoint resumed from is this run's save of that step: a save
  // before any further step (a run resumed at its end) would rewrite one of
  // the run's inputs with the same state, which Note [one way to write a
  // file] refuses; it is already saved.
  std::error_code error;
  if (directory_ &&
      std::filesystem::equivalent(
          *resume_file_, directory_->directory() / fmt::format("ckpt-{}.h5", s.step), error))
    last_saved_ = s.step;
  return {s.step, {s.epoch, s.position}};
}

io::LoaderPosition RunCheckpoints::next_position(const io::BatchSource& source, int accumulation) {
  const io::LoaderPosition at = source.position();
  const io::DistributedSampler& sampler = source.sampler();
  const std::int64_t left = sampler.batches_per_epoch() - at.position / sampler.global_batch();
  if (left < accumulation) return {at.epoch + 1, 0};
  return at;
}

std::filesystem::path RunCheckpoints::save(Module& model, const Optimizer& optimizer,
                                           const DataParallelStep& step, const LossScaler& scaler,
                                           const io::BatchSource& source,
                                           const core::Stream& stream) {
  if (!directory_ || last_saved_ == step.steps()) return {};
  last_saved_ = step.steps();
  core::trace::Span span("checkpoint save", "checkpoint");
  // Rank 0 writes while the others wait for it in the next step, past their
  // timeout if need be (Note [busy ranks]); every rank copies the state first.
  comm::Watchdog::Busy saving(&world_.watchdog(),
                              fmt::format("saving the checkpoint of step {}", step.steps()));
  const io::LoaderPosition next = next_position(source, step.options().accumulation);
  const TrainingState state{step.steps(),
                            next.epoch,
                            next.position,
                            scaler.state(),
                            step.options().seed,
                            world_.size(),
                            source.sampler().global_batch(),
                            options_.config,
                            options_.input};
  const CheckpointContents contents = [&] {
    const DataParallelStep::FullParameters full = step.full_parameters();  // ZeRO-3
    TrainingState recorded = state;
    for (RunFingerprintField& field : run_fingerprint(model, step, &source, world_.size()))
      recorded.config[field.name] = std::move(field.value);  // Note [run fingerprint]
    CheckpointContents c = capture_checkpoint(model, optimizer, recorded, stream);
    c.attributes["fingerprint_version"] = kFingerprintVersion;
    return c;
  }();
  if (world_.rank() != 0) return {};  // rank 0 writes: every rank holds the same state
  std::optional<Heartbeat::Busy> beating;
  if (options_.heartbeat) beating.emplace(*options_.heartbeat, step.steps(), "saving");
  if (const double delay_s = test_save_delay_s(); delay_s > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
  return directory_->save(step.steps(), contents);
}

}  // namespace lockstep::engine
