// Learning-rate schedules as pure functions of the training step, so a resumed
// run gets exactly the lr an uninterrupted one had and a checkpoint needs only
// the step. Each kind may start with W warmup steps rising linearly from
// base_lr / W at step 0 to base_lr at step W - 1; the decay then runs over the
// steps after warmup. The formulas are written beside the code (lr_scheduler.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/optim/optimizer.h"

namespace lockstep::engine {

enum class ScheduleKind { constant, step, multistep, exponential, cosine, linear };

struct ScheduleOptions {
  std::int64_t warmup_steps = 0;  // W
  // cosine, linear: the run's length T; the decay ends at step T - 1.
  std::int64_t total_steps = 0;
  std::int64_t step_size = 0;  // step: lr *= gamma every step_size steps after warmup
  // multistep: lr *= gamma at each of these steps, counted from the end of
  // warmup as PyTorch's SequentialLR counts them; ascending.
  std::vector<std::int64_t> milestones;
  double gamma = 0.1;    // step, multistep, exponential
  double eta_min = 0.0;  // cosine: the lr at the last step
};

class LrScheduler {
 public:
  // Checks that `options` has what `kind` needs (total_steps > warmup_steps
  // for cosine and linear, step_size > 0 for step, gamma > 0, ...).
  LrScheduler(ScheduleKind kind, ScheduleOptions options);

  ScheduleKind kind() const { return kind_; }
  const ScheduleOptions& options() const { return options_; }

  // The lr at training step `step` (0 for the first) of a group whose base lr
  // is `base_lr`. Past the last step of cosine and linear the lr stays at
  // their end value.
  double lr_at(std::int64_t step, double base_lr) const;
  // Sets each group's lr to lr_at(step, its initial lr). Call before the
  // optimizer step of training step `step`; steps the loss scaler skipped
  // count, as they do for torch.optim.lr_scheduler.
  void apply(Optimizer& optimizer, std::int64_t step) const;

 private:
  ScheduleKind kind_;
  ScheduleOptions options_;
};

// constant|step|multistep|exponential|cosine|linear (the command line's
// --schedule); throws InvalidArgument listing the names.
ScheduleKind parse_schedule_kind(std::string_view name);
std::string kind_name(ScheduleKind kind);  // the name parse_schedule_kind takes
LrScheduler make_scheduler(std::string_view name, const ScheduleOptions& options);

}  // namespace lockstep::engine
