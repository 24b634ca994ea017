// LossScaler against GradScaler's contract: defaults, unscaling, a step with
// an inf or NaN skipped without a trace (parameters and optimizer state
// unchanged, scale halved), growth after the interval, and state round trips.
// Scales are powers of two, so scaling and unscaling are exact and the
// comparisons below are exact. The scale stops at its floor, where an inf
// or NaN is an error.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "engine/optim/adamw.h"
#include "engine/optim/loss_scaler.h"
#include "support/optim_fixture.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

std::vector<std::vector<float>> scaled(std::vector<std::vector<float>> grads, float scale) {
  for (auto& g : grads)
    for (float& x : g) x *= scale;
  return grads;
}

std::vector<std::vector<float>> read_grads(const ParameterStore& store) {
  std::vector<std::vector<float>> out;
  for (const auto& s : store.slots()) out.push_back(test::read(s.parameter->grad));
  return out;
}

std::vector<std::vector<float>> read_state(const Optimizer& opt) {
  std::vector<std::vector<float>> out;
  for (const auto& s : opt.state_tensors()) out.push_back(test::read(s.value));
  return out;
}

}  // namespace

TEST_CASE("the loss scaler defaults to GradScaler's settings, for f16 only", "[engine][scaler]") {
  const LossScaler f16 = LossScaler::for_autocast(DType::f16);
  CHECK(f16.enabled());
  CHECK(f16.scale() == 65536.0f);
  CHECK(LossScalerOptions{}.growth_interval == 2000);
  CHECK(LossScalerOptions{}.growth_factor == 2.0f);
  CHECK(LossScalerOptions{}.backoff_factor == 0.5f);
  for (std::optional<DType> other : {std::optional<DType>(DType::bf16), std::optional<DType>()}) {
    LossScaler off = LossScaler::for_autocast(other);
    CHECK_FALSE(off.enabled());
    CHECK(off.scale() == 1.0f);
    // Disabled: no unscaling, no check, never a skip.
    auto bag = test::make_bag();
    ParameterStore store(*bag, core::Device::cpu());
    auto grads = test::step_grads(store, 0);
    grads[0][0] = std::numeric_limits<float>::infinity();
    test::set_grads(store, grads);
    off.unscale(store.grads());
    CHECK(off.update());
    CHECK(read_grads(store) == grads);
  }
}

TEST_CASE("an inf or NaN skips the step without a trace and backs off; clean steps grow",
          "[engine][scaler]") {
  LossScalerOptions options;
  options.init_scale = 1024.0f;
  options.growth_interval = 3;
  LossScaler scaler(options);
  // Two identical models: `scaled_run` goes through the scaler, `clean_run`
  // takes only the clean steps, unscaled. They must end equal.
  auto bag = test::make_bag(), clean_bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu()), clean(*clean_bag, core::Device::cpu());
  test::randomize_values(store, 5);
  clean.values().copy_from(store.values());
  AdamW scaled_run(store, decay_groups(store, 0.01, 0.1));
  AdamW clean_run(clean, decay_groups(clean, 0.01, 0.1));

  struct Expect {
    float nonfinite;  // 0: a clean step
    bool step;
    float scale_after;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Expect script[] = {
      {0, true, 1024}, {0, true, 1024}, {inf, false, 512}, {0, true, 512},
      {0, true, 512},  {0, true, 1024}, {nan, false, 512}, {-inf, false, 256},
      {0, true, 256},  {0, true, 256},  {0, true, 512},
  };
  int step = 0;
  for (const Expect& e : script) {
    INFO("step " << step);
    const auto grads = test::step_grads(store, step);
    auto input = scaled(grads, scaler.scale());
    if (e.nonfinite != 0) input[3][17] = e.nonfinite;
    test::set_grads(store, input);
    const auto values_before = test::read(store.values());
    const auto state_before = read_state(scaled_run);
    const auto steps_before = scaled_run.steps();

    scaler.unscale(store.grads());
    const bool take = scaler.update();
    REQUIRE(take == e.step);
    CHECK(scaler.scale() == e.scale_after);
    if (take) {
      CHECK(read_grads(store) == grads);  // unscaled exactly
      scaled_run.step();
      test::set_grads(clean, grads);
      clean_run.step();
    } else {
      CHECK(test::read(store.values()) == values_before);
      CHECK(read_state(scaled_run) == state_before);
      CHECK(scaled_run.steps() == steps_before);
    }
    ++step;
  }
  CHECK(test::read(store.values()) == test::read(clean.values()));
  CHECK(read_state(scaled_run) == read_state(clean_run));
}

TEST_CASE("the scale never grows to inf", "[engine][scaler]") {
  LossScalerOptions options;
  options.init_scale = std::ldexp(1.0f, 127);
  options.growth_interval = 1;
  LossScaler scaler(options);
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  scaler.unscale(store.grads());
  CHECK(scaler.update());
  CHECK(scaler.scale() == std::ldexp(1.0f, 127));
  CHECK(scaler.state().growth_tracker == 0);
}

TEST_CASE("loss scaler state round-trips and misuse is an error", "[engine][scaler]") {
  LossScalerOptions options;
  options.growth_interval = 10;
  LossScaler scaler(options);
  scaler.set_state({128.0f, 7});
  CHECK(scaler.scale() == 128.0f);
  CHECK(scaler.state().growth_tracker == 7);
  CHECK_THROWS_WITH(scaler.set_state({128.0f, 10}), Catch::Contains("growth tracker 10"));
  CHECK_THROWS_WITH(scaler.set_state({0.0f, 0}),
                    Catch::Contains("(scale 0.000000, growth tracker 0) is invalid"));
  CHECK_THROWS_WITH((void)scaler.update(), Catch::Contains("without unscale()"));
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  scaler.unscale(store.grads());
  CHECK_THROWS_WITH(scaler.unscale(store.grads()),
                    Catch::Contains("unscale called twice in one step"));
  options.backoff_factor = 1.5f;
  CHECK_THROWS_WITH(LossScaler(options), Catch::Contains("backoff_factor 1.5"));
}

TEST_CASE("backing off stops at the floor, and an inf or NaN found there is an error",
          "[engine][scaler][nonfinite]") {
  LossScalerOptions options;
  options.init_scale = 6.0f;
  options.min_scale = 2.0f;
  LossScaler scaler(options);
  CHECK(LossScalerOptions{}.min_scale == 1.0f);  // DeepSpeed's and Megatron's default
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  auto overflow = [&] {
    auto grads = test::step_grads(store, 0);
    grads[1][3] = std::numeric_limits<float>::infinity();
    test::set_grads(store, grads);
    scaler.unscale(store.grads());
    return scaler.update();
  };
  CHECK_FALSE(overflow());
  CHECK(scaler.scale() == 3.0f);
  CHECK_FALSE(overflow());
  CHECK(scaler.scale() == 2.0f);  // 1.5 would be below the floor
  // A clean step at the floor is taken as usual.
  test::set_grads(store, test::step_grads(store, 1));
  scaler.unscale(store.grads());
  CHECK(scaler.update());
  CHECK_THROWS_AS(overflow(), NumericalError);
  CHECK_THROWS_WITH(overflow(), Catch::StartsWith("the loss scale is at its floor (min_scale 2)"));
  // The floor bounds the options and the restored state.
  CHECK_THROWS_WITH(scaler.set_state({1.0f, 0}), Catch::Contains("min_scale 2.0"));
  options.min_scale = 8.0f;
  CHECK_THROWS_WITH(LossScaler(options), Catch::Contains("0 < min_scale <= init_scale"));
}
