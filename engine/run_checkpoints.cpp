// RunCheckpoints (engine/run_checkpoints.h): the directory, the choice, the
// restore and the saves of one run.
#include "engine/run_checkpoints.h"

#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "comm/flight_recorder.h"
#include "engine/checkpoint_choice.h"
#include "engine/core/trace.h"

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

}  // namespace

RunCheckpoints::RunCheckpoints(comm::World& world, RunCheckpointOptions options)
    : world_(world), options_(std::move(options)) {
  using Start = RunCheckpointOptions::Start;
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
                                    LossScaler& scaler, const core::Stream& stream) {
  if (!resume_file_) return {};
  // ZeRO-3: the loaded values reach each rank's shard (Note [parameter units]).
  const DataParallelStep::FullParameters full = step.full_parameters(true);
  const TrainingState s =
      restore_checkpoint(read_checkpoint(*resume_file_), resume_file_->string(), model, optimizer,
                         options_.config, options_.config_defaults, stream);
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
                            options_.config};
  const CheckpointContents contents = [&] {
    const DataParallelStep::FullParameters full = step.full_parameters();  // ZeRO-3
    return capture_checkpoint(model, optimizer, state, stream);
  }();
  if (world_.rank() != 0) return {};  // rank 0 writes: every rank holds the same state
  std::optional<Heartbeat::Busy> beating;
  if (options_.heartbeat) beating.emplace(*options_.heartbeat, step.steps(), "saving");
  if (const double delay_s = test_save_delay_s(); delay_s > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
  return directory_->save(step.steps(), contents);
}

}  // namespace lockstep::engine
