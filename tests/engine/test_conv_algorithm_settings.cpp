// The process-wide convolution algorithm settings (kernels/conv.h, Note [conv
// algorithm choice] in kernels/cuda/conv.cu): new plans are timed when the
// setting asks for it and the run is not deterministic, never in a
// deterministic run, and the run header's "deterministic on" (engine
// deterministic_run()) follows deterministic() whatever the timing setting.
// Host logic only: the CUDA choice itself is held by tests/engine/gpu.
#include <catch2/catch.hpp>

#include "engine/run_report.h"
#include "kernels/conv.h"
#include "support/conv_settings.h"

using namespace lockstep;

TEST_CASE("convolution timing is on when asked outside deterministic runs", "[engine][conv]") {
  test::ConvSettingsScope scope;
  kernels::set_deterministic(false);
  kernels::set_conv_autotune(true);
  CHECK(kernels::conv_autotune());
  CHECK_FALSE(engine::deterministic_run());
  kernels::set_conv_autotune(false);
  CHECK_FALSE(kernels::conv_autotune());
  CHECK_FALSE(engine::deterministic_run());
}

TEST_CASE("a deterministic run never times convolutions, whatever the timing setting",
          "[engine][conv]") {
  test::ConvSettingsScope scope;
  kernels::set_conv_autotune(true);
  kernels::set_deterministic(true);  // directly, as tests and library users do
  CHECK_FALSE(kernels::conv_autotune());
  CHECK(engine::deterministic_run());  // the header says "deterministic on"
  kernels::set_deterministic(false);
  CHECK(kernels::conv_autotune());  // the setting was kept, only overruled
  engine::set_deterministic_run(true);
  CHECK_FALSE(kernels::conv_autotune());
  CHECK(engine::deterministic_run());
}
