// Finite-difference gradient checks for modules, on the CPU: the objective is
// L = sum(y * r) for a fixed random r (accumulated in f64), so dL/dy = r, and
// each checked gradient element is compared with a central difference.
//
// Tolerance: the central difference has truncation error O(step^2 |f'''|) and
// rounding error about u |y| k / step (u = 2^-24, k outputs touched by one
// input); with step 1e-2 and O(1) values both stay below 1e-3, so
// |analytic - numeric| <= abs_tol + rel_tol |numeric| with 2e-3 and 1e-2
// passes a correct gradient and fails a wrong one (errors are O(1) then).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/nn/module.h"

namespace lockstep::test {

struct GradCheckOptions {
  float step = 1e-2f;
  double abs_tol = 2e-3;
  double rel_tol = 1e-2;
  int max_checks = 48;  // elements checked per tensor (spread evenly)
};

inline core::Tensor random_f32(const core::Shape& shape, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<std::size_t>(core::shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return core::Tensor::from_vector(v, shape, DType::f32);
}

inline double objective(engine::Module& m, const core::Tensor& x, const core::Tensor& r,
                        engine::Context& ctx) {
  const core::Tensor y = m.forward(x, ctx);
  const auto yv = (y.dtype() == DType::f32 ? y : y.cast(DType::f32)).to_vector<float>();
  const auto rv = r.to_vector<float>();
  double sum = 0.0;
  for (std::size_t i = 0; i < yv.size(); ++i) sum += static_cast<double>(yv[i]) * rv[i];
  return sum;
}

// Checks dx (when the module returns one) and every parameter gradient.
inline void check_gradients(engine::Module& m, const core::Tensor& x, engine::Context ctx = {},
                            GradCheckOptions opt = {}) {
  m.train();
  ctx.on_grad_ready = nullptr;
  const core::Tensor y0 = m.forward(x, ctx);
  const core::Tensor r = random_f32(y0.shape(), 99);
  for (engine::Parameter* p : m.parameters())
    if (p->grad.defined()) p->grad.fill_(0.0);
  const core::Tensor dx = m.backward(r, ctx);

  auto check = [&](const char* what, core::Tensor target, const std::vector<float>& analytic) {
    float* data = target.data_as<float>();
    const std::int64_t n = target.numel();
    const std::int64_t stride = std::max<std::int64_t>(1, n / opt.max_checks);
    for (std::int64_t i = 0; i < n; i += stride) {
      const float saved = data[i];
      data[i] = saved + opt.step;
      const double plus = objective(m, x, r, ctx);
      data[i] = saved - opt.step;
      const double minus = objective(m, x, r, ctx);
      data[i] = saved;
      const double numeric = (plus - minus) / (2.0 * opt.step);
      INFO(m.describe() << " " << what << " element " << i << ": analytic " << analytic[i]
                        << ", numeric " << numeric);
      REQUIRE(std::fabs(analytic[i] - numeric) <= opt.abs_tol + opt.rel_tol * std::fabs(numeric));
    }
  };
  if (dx.defined() && x.dtype() == DType::f32) check("input", x, dx.to_vector<float>());
  for (engine::Parameter* p : m.parameters())
    if (p->grad.defined()) check(p->name.c_str(), p->value, p->grad.to_vector<float>());
}

}  // namespace lockstep::test
