// Every lr schedule against its formula, written out again here, at the steps
// where schedules go wrong (0, the last warmup step, the first after it, the
// middle, the last and beyond), with and without warmup. Both sides compute
// in f64 from the same few operations, so they agree to 1e-12 relative.
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>

#include "engine/optim/lr_scheduler.h"
#include "engine/optim/sgd.h"
#include "support/optim_fixture.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr double kBase = 0.4;
constexpr std::int64_t kTotal = 25;

ScheduleOptions options_with(std::int64_t warmup) {
  ScheduleOptions o;
  o.warmup_steps = warmup;
  o.total_steps = kTotal;
  o.step_size = 4;
  o.milestones = {3, 7, 7, 12};
  o.gamma = 0.5;
  o.eta_min = 0.01;
  return o;
}

// The expected lr after warmup, with s steps since its end, D decay steps.
double expected_decay(ScheduleKind kind, std::int64_t s, std::int64_t decay_steps) {
  const double p = std::min(1.0, static_cast<double>(s) / static_cast<double>(decay_steps - 1));
  switch (kind) {
    case ScheduleKind::constant:
      return kBase;
    case ScheduleKind::step:  // gamma 0.5 every 4 steps
      return kBase * std::pow(0.5, std::floor(s / 4.0));
    case ScheduleKind::multistep: {  // milestones 3, 7, 7, 12 (7 counts twice)
      const int passed = (s >= 3) + 2 * (s >= 7) + (s >= 12);
      return kBase * std::pow(0.5, passed);
    }
    case ScheduleKind::exponential:
      return kBase * std::pow(0.5, static_cast<double>(s));
    case ScheduleKind::cosine:
      return 0.01 + (kBase - 0.01) * 0.5 * (1 + std::cos(std::numbers::pi * p));
    case ScheduleKind::linear:
      return kBase * (1 - p);
  }
  return 0;
}

}  // namespace

TEST_CASE("every schedule follows its formula with and without warmup", "[engine][schedule]") {
  const char* names[] = {"constant", "step", "multistep", "exponential", "cosine", "linear"};
  for (const char* name : names) {
    for (std::int64_t warmup : {0, 5}) {
      INFO(name << ", warmup " << warmup);
      const LrScheduler scheduler = make_scheduler(name, options_with(warmup));
      const ScheduleKind kind = scheduler.kind();
      const std::int64_t decay_steps = kTotal - warmup;
      std::vector<std::int64_t> steps = {0,          warmup,     warmup + 1, (warmup + kTotal) / 2,
                                         kTotal - 1, kTotal + 10};
      if (warmup > 0) steps.push_back(warmup - 1);
      for (std::int64_t t : steps) {
        INFO("step " << t);
        const double want = t < warmup ? kBase * static_cast<double>(t + 1) / warmup
                                       : expected_decay(kind, t - warmup, decay_steps);
        CHECK(scheduler.lr_at(t, kBase) == Approx(want).epsilon(1e-12).margin(1e-15));
      }
      if (warmup > 0) {
        CHECK(scheduler.lr_at(0, kBase) == Approx(kBase / warmup).epsilon(1e-12));
        CHECK(scheduler.lr_at(warmup - 1, kBase) == Approx(kBase).epsilon(1e-12));
      }
      // Every decay starts from base_lr right after warmup.
      CHECK(scheduler.lr_at(warmup, kBase) == Approx(kBase).epsilon(1e-12));
    }
  }
}

TEST_CASE("cosine and linear end exactly at their floor on the last step", "[engine][schedule]") {
  for (std::int64_t warmup : {0, 5}) {
    const auto o = options_with(warmup);
    CHECK(make_scheduler("cosine", o).lr_at(kTotal - 1, kBase) == Approx(0.01).epsilon(1e-12));
    CHECK(make_scheduler("linear", o).lr_at(kTotal - 1, kBase) == Approx(0.0).margin(1e-15));
    CHECK(make_scheduler("linear", o).lr_at(kTotal + 3, kBase) == Approx(0.0).margin(1e-15));
  }
  ScheduleOptions one;  // a single decay step is the last one
  one.warmup_steps = 3;
  one.total_steps = 4;
  CHECK(make_scheduler("linear", one).lr_at(3, kBase) == 0.0);
  CHECK(make_scheduler("linear", one).lr_at(2, kBase) == Approx(kBase).epsilon(1e-12));
}

TEST_CASE("the lr is a pure function of the step", "[engine][schedule]") {
  const LrScheduler a = make_scheduler("cosine", options_with(5));
  std::vector<double> forward, backward;
  for (std::int64_t t = 0; t < kTotal; ++t) forward.push_back(a.lr_at(t, kBase));
  const LrScheduler b = make_scheduler("cosine", options_with(5));  // as after a restart
  for (std::int64_t t = kTotal - 1; t >= 0; --t)
    backward.insert(backward.begin(), b.lr_at(t, kBase));
  CHECK(forward == backward);
}

TEST_CASE("apply scales each group's own initial lr", "[engine][schedule]") {
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  auto groups = decay_groups(store, 0.2, 0.0);
  groups[1].lr = 0.02;
  SGD sgd(store, groups);
  const LrScheduler scheduler = make_scheduler("linear", options_with(5));
  scheduler.apply(sgd, 2);
  CHECK(sgd.lr(0) == Approx(0.2 * 3 / 5).epsilon(1e-12));
  CHECK(sgd.lr(1) == Approx(0.02 * 3 / 5).epsilon(1e-12));
  scheduler.apply(sgd, 15);  // s = 10 of D = 20: p = 10/19
  CHECK(sgd.lr(0) == Approx(0.2 * (1 - 10.0 / 19)).epsilon(1e-12));
  CHECK(sgd.initial_lr(0) == 0.2);
  CHECK(sgd.initial_lr(1) == 0.02);
}

TEST_CASE("schedule names and options are checked", "[engine][schedule]") {
  CHECK(parse_schedule_kind("multistep") == ScheduleKind::multistep);
  CHECK_THROWS_WITH(parse_schedule_kind("onecycle"),
                    Catch::Contains("'onecycle'") &&
                        Catch::Contains("constant|step|multistep|exponential|cosine|linear"));
  ScheduleOptions o;
  o.warmup_steps = 10;
  o.total_steps = 10;
  CHECK_THROWS_WITH(make_scheduler("cosine", o), Catch::Contains("must exceed warmup_steps 10"));
  CHECK_THROWS_WITH(make_scheduler("step", o), Catch::Contains("step_size 0 must be > 0"));
  o.milestones = {5, 2};
  CHECK_THROWS_WITH(make_scheduler("multistep", o), Catch::Contains("ascending"));
  CHECK_NOTHROW(make_scheduler("constant", o));
  CHECK_THROWS_WITH(make_scheduler("constant", o).lr_at(-1, 0.1), Catch::Contains("negative"));
}
