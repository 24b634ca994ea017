// The CUDA optimizer, unscaling and clipping against the CPU ones: two copies
// of a parameter bag (one with a parameter long enough to span several
// segments), one ParameterStore per device, the same gradients every step.
//
// Tolerances: both backends compute the same f32 formulas, but nvcc contracts
// a * b + c into one fused multiply-add where GCC rounds twice; one rounding
// (6e-8 relative) per operation and step on values up to ~5 over six steps
// stays below 1e-5 (1 + |cpu|). Unscaling multiplies by a power of two and is
// exact on both, so scaler decisions and unscaled gradients agree exactly.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "engine/optim/adamw.h"
#include "engine/optim/clip.h"
#include "engine/optim/loss_scaler.h"
#include "engine/optim/sgd.h"
#include "support/optim_fixture.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);
constexpr std::int64_t kLarge = 70001;  // three segments of at most 32768

void require_close(const core::Tensor& gpu, const core::Tensor& cpu, double tol,
                   const std::string& what) {
  const auto g = test::read(gpu), c = test::read(cpu);
  REQUIRE(g.size() == c.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::fabs(g[i] - c[i]) <= tol * (1 + std::fabs(c[i])))
      continue;  // a message only for the element that fails
    INFO(what << " element " << i << ": cuda " << g[i] << ", cpu " << c[i]);
    REQUIRE(std::fabs(g[i] - c[i]) <= tol * (1 + std::fabs(c[i])));
  }
}

struct Pair {
  std::unique_ptr<test::ParameterBag> cpu_bag = test::make_bag(kLarge),
                                      gpu_bag = test::make_bag(kLarge);
  ParameterStore cpu{*cpu_bag, core::Device::cpu()};
  ParameterStore gpu{*gpu_bag, kGpu};
  Pair() {
    test::randomize_values(cpu, 9);
    gpu.values().copy_from(cpu.values());
  }
  void set_grads(const std::vector<std::vector<float>>& grads) {
    test::set_grads(cpu, grads);
    test::set_grads(gpu, grads);
  }
};

void compare_steps(Pair& pair, Optimizer& cpu_opt, Optimizer& gpu_opt, const core::Stream& stream) {
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    pair.set_grads(test::step_grads(pair.cpu, step));
    cpu_opt.step();
    gpu_opt.step(stream);
    stream.synchronize();
    require_close(pair.gpu.values(), pair.cpu.values(), 1e-5, "values");
    const auto gpu_state = gpu_opt.state_tensors(), cpu_state = cpu_opt.state_tensors();
    REQUIRE(gpu_state.size() == cpu_state.size());
    for (std::size_t i = 0; i < gpu_state.size(); ++i)
      require_close(gpu_state[i].value, cpu_state[i].value, 1e-5,
                    cpu_state[i].parameter + "/" + cpu_state[i].state);
  }
  // The padding between parameters stays zero (Note [padding stays zero]).
  std::vector<bool> used(pair.gpu.size());
  for (const auto& s : pair.gpu.slots())
    for (std::int64_t i = 0; i < s.numel; ++i) used[s.offset + i] = true;
  const auto values = test::read(pair.gpu.values());
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!used[i]) REQUIRE(values[i] == 0.0f);
}

}  // namespace

TEST_CASE("cuda SGD steps match the cpu ones with every option", "[gpu][optim]") {
  const SgdOptions cases[] = {
      {0.0, 0.0, false}, {0.9, 0.0, false}, {0.8, 0.3, false}, {0.9, 0.0, true}};
  for (const SgdOptions& o : cases) {
    INFO("momentum " << o.momentum << ", dampening " << o.dampening << ", nesterov " << o.nesterov);
    Pair pair;
    auto groups = [](ParameterStore& s) {
      auto g = decay_groups(s, 0.05, 0.1);
      g[1].lr = 0.02;
      return g;
    };
    SGD cpu_opt(pair.cpu, groups(pair.cpu), o);
    SGD gpu_opt(pair.gpu, groups(pair.gpu), o);
    compare_steps(pair, cpu_opt, gpu_opt, core::Stream::create(kGpu));
  }
}

TEST_CASE("cuda AdamW steps match the cpu ones with every option", "[gpu][optim]") {
  const AdamwOptions cases[] = {{0.9, 0.999, 1e-8}, {0.5, 0.9, 1e-3}, {0.0, 0.99, 0.1}};
  for (const AdamwOptions& o : cases) {
    INFO("betas " << o.beta1 << ", " << o.beta2 << ", eps " << o.eps);
    Pair pair;
    auto groups = [](ParameterStore& s) {
      auto g = decay_groups(s, 0.01, 0.2);
      g[1].lr = 0.03;
      return g;
    };
    AdamW cpu_opt(pair.cpu, groups(pair.cpu), o);
    AdamW gpu_opt(pair.gpu, groups(pair.gpu), o);
    // The CPU stream: the GPU step runs on the default stream and waits.
    compare_steps(pair, cpu_opt, gpu_opt, core::Stream());
  }
}

TEST_CASE("cuda and cpu loss scalers take the same decisions", "[gpu][scaler]") {
  LossScalerOptions options;
  options.init_scale = 4096.0f;
  options.growth_interval = 2;
  LossScaler cpu_scaler(options), gpu_scaler(options);
  Pair pair;
  const core::Stream stream = core::Stream::create(kGpu);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // A non-finite value at step 1 (in the long parameter's last segment), 4 and 5.
  const float injected[] = {0, inf, 0, 0, nan, -inf, 0, 0};
  for (int step = 0; step < 8; ++step) {
    INFO("step " << step);
    auto grads = test::step_grads(pair.cpu, step);
    for (auto& g : grads)
      for (float& x : g) x *= cpu_scaler.scale();
    if (injected[step] != 0) grads.back()[kLarge - 2] = injected[step];
    pair.set_grads(grads);
    cpu_scaler.unscale(pair.cpu.grads());
    gpu_scaler.unscale(pair.gpu.grads(), stream);
    const bool cpu_take = cpu_scaler.update();
    const bool gpu_take = gpu_scaler.update(stream);
    REQUIRE(gpu_take == cpu_take);
    REQUIRE(gpu_take == (injected[step] == 0));
    REQUIRE(gpu_scaler.scale() == cpu_scaler.scale());
    REQUIRE(gpu_scaler.state().growth_tracker == cpu_scaler.state().growth_tracker);
    if (cpu_take) REQUIRE(test::read(pair.gpu.grads()) == test::read(pair.cpu.grads()));
  }
}

// The CUDA sum of squares adds in another order (f64 either way, of squares
// exact in f64, all positive): the norms agree within (n - 1) 2^-53 relative,
// about 1e-11 for these ~1e5 values; the clipped gradients, an f32 multiply,
// to 1e-6.
TEST_CASE("cuda clipping matches the cpu one", "[gpu][optim]") {
  Pair pair;
  pair.set_grads(test::step_grads(pair.cpu, 3));
  const double cpu_norm = grad_norm(pair.cpu.grads());
  const double max_norm = cpu_norm / 4;
  CHECK(clip_grad_norm(pair.gpu.grads(), max_norm) == Approx(cpu_norm).epsilon(1e-11));
  CHECK(clip_grad_norm(pair.cpu.grads(), max_norm) == Approx(cpu_norm).epsilon(1e-11));
  require_close(pair.gpu.grads(), pair.cpu.grads(), 1e-6, "clipped gradients");
}

// Note [non-finite steps]: finite f32 gradients near 1e20 square past
// FLT_MAX; the CUDA norm's f64 output keeps the sum finite, as the CPU's
// does. Each square of an f32 is exact in f64, so the two sums differ only by
// their order: under n 2^-53 relative (n ~ 1e5), about 1e-11.
TEST_CASE("cuda gradient norm stays finite past FLT_MAX, as the cpu one", "[gpu][optim]") {
  Pair pair;
  auto grads = test::step_grads(pair.cpu, 4);
  for (auto& g : grads)
    for (float& x : g) x *= 1e20f;
  pair.set_grads(grads);
  const double cpu_norm = grad_norm(pair.cpu.grads());
  REQUIRE(std::isfinite(cpu_norm));
  REQUIRE(cpu_norm * cpu_norm > std::numeric_limits<float>::max());
  CHECK(grad_norm(pair.gpu.grads()) == Approx(cpu_norm).epsilon(1e-11));
}

// ZeRO-1's shard norm: several ranges, an empty one among them, read back in
// one copy (grad_sum_squares). Per range the same f64 bound as above; the
// ranges' totals are then added in the same order on both devices.
TEST_CASE("cuda sum of squares over several ranges matches the cpu one", "[gpu][optim]") {
  Pair pair;
  pair.set_grads(test::step_grads(pair.cpu, 5));
  const std::int64_t n = pair.cpu.grads().numel();
  const std::vector<comm::FlatRange> ranges{
      {0, n / 5}, {n / 5, 0}, {n / 3, n / 4}, {n - n / 7, n / 7}};
  double expected = 0.0;
  for (const comm::FlatRange& r : ranges) expected += grad_sum_squares(pair.cpu.grads(), {r});
  CHECK(grad_sum_squares(pair.cpu.grads(), ranges) == expected);
  CHECK(grad_sum_squares(pair.gpu.grads(), ranges) == Approx(expected).epsilon(1e-11));
  CHECK(grad_sum_squares(pair.gpu.grads(), {{0, 0}}) == 0.0);
}
