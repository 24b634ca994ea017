// Learning-rate schedules (engine/optim/lr_scheduler.h). Notation: t is the
// training step (0-based), W the warmup steps, T the total steps, s = t - W
// the step counted from the end of warmup and D = T - W the decay steps.
#include "engine/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace lockstep::engine {
namespace {

struct KindName {
  ScheduleKind kind;
  std::string_view name;
};
constexpr KindName kKindNames[] = {
    {ScheduleKind::constant, "constant"},   {ScheduleKind::step, "step"},
    {ScheduleKind::multistep, "multistep"}, {ScheduleKind::exponential, "exponential"},
    {ScheduleKind::cosine, "cosine"},       {ScheduleKind::linear, "linear"}};

void require(bool ok, ScheduleKind kind, const std::string& what) {
  if (!ok) throw InvalidArgument("lr schedule '" + kind_name(kind) + "': " + what);
}

}  // namespace

std::string kind_name(ScheduleKind kind) {
  for (const KindName& k : kKindNames)
    if (k.kind == kind) return std::string(k.name);
  return "?";
}

LrScheduler::LrScheduler(ScheduleKind kind, ScheduleOptions options)
    : kind_(kind), options_(std::move(options)) {
  const ScheduleOptions& o = options_;
  require(o.warmup_steps >= 0, kind,
          "warmup_steps " + std::to_string(o.warmup_steps) + " is negative");
  switch (kind) {
    case ScheduleKind::constant:
      break;
    case ScheduleKind::step:
      require(o.step_size > 0, kind,
              "step_size " + std::to_string(o.step_size) + " must be > 0 (steps between decays)");
      [[fallthrough]];
    case ScheduleKind::multistep:
    case ScheduleKind::exponential:
      require(o.gamma > 0.0, kind, "gamma " + std::to_string(o.gamma) + " must be > 0");
      break;
    case ScheduleKind::cosine:
    case ScheduleKind::linear:
      require(o.total_steps > o.warmup_steps, kind,
              "total_steps " + std::to_string(o.total_steps) + " must exceed warmup_steps " +
                  std::to_string(o.warmup_steps) + " (the decay runs over the steps after warmup)");
      require(o.eta_min >= 0.0, kind, "eta_min " + std::to_string(o.eta_min) + " is negative");
      break;
  }
  if (kind == ScheduleKind::multistep)
    require(std::is_sorted(o.milestones.begin(), o.milestones.end()) &&
                (o.milestones.empty() || o.milestones.front() >= 0),
            kind, "milestones must be ascending and >= 0");
}

double LrScheduler::lr_at(std::int64_t step, double base_lr) const {
  if (step < 0) throw InvalidArgument("lr schedule: step " + std::to_string(step) + " is negative");
  const ScheduleOptions& o = options_;
  const std::int64_t warmup = o.warmup_steps;
  // Warmup: lr = base_lr (t + 1) / W, from base_lr / W at t = 0 to base_lr at t = W - 1.
  if (step < warmup) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const std::int64_t s = step - warmup;
  // Progress through the decay for cosine and linear: p = min(1, s / (D - 1)),
  // 0 at the first step after warmup and 1 at the last (T - 1); p = 1 when
  // D = 1, whose single step is the last.
  const std::int64_t decay_steps = o.total_steps - warmup;
  const double progress =
      decay_steps > 1 ? std::min(1.0, static_cast<double>(s) / static_cast<double>(decay_steps - 1))
                      : 1.0;
  switch (kind_) {
    case ScheduleKind::constant:  // lr = base_lr
      return base_lr;
    case ScheduleKind::step:  // lr = base_lr gamma^floor(s / step_size)   (StepLR)
      return base_lr * std::pow(o.gamma, static_cast<double>(s / o.step_size));
    case ScheduleKind::multistep: {  // lr = base_lr gamma^#{milestones m <= s}   (MultiStepLR)
      const auto passed =
          std::upper_bound(o.milestones.begin(), o.milestones.end(), s) - o.milestones.begin();
      return base_lr * std::pow(o.gamma, static_cast<double>(passed));
    }
    case ScheduleKind::exponential:  // lr = base_lr gamma^s   (ExponentialLR)
      return base_lr * std::pow(o.gamma, static_cast<double>(s));
    case ScheduleKind::cosine:  // lr = eta_min + (base_lr - eta_min) (1 + cos(pi p)) / 2
      return o.eta_min +
             (base_lr - o.eta_min) * (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    case ScheduleKind::linear:  // lr = base_lr (1 - p)
      return base_lr * (1.0 - progress);
  }
  return base_lr;
}

void LrScheduler::apply(Optimizer& optimizer, std::int64_t step) const {
  for (std::size_t g = 0; g < optimizer.group_count(); ++g)
    optimizer.set_lr(g, lr_at(step, optimizer.initial_lr(g)));
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  std::string names;
  for (const KindName& k : kKindNames) {
    if (k.name == name) return k.kind;
    if (!names.empty()) names += '|';
    names += k.name;
  }
  throw InvalidArgument("unknown lr schedule '" + std::string(name) + "' (use " + names + ")");
}

LrScheduler make_scheduler(std::string_view name, const ScheduleOptions& options) {
  return LrScheduler(parse_schedule_kind(name), options);
}

}  // namespace lockstep::engine
