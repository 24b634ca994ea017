// Shared by the optimizer, scaler and [gpu] optimizer tests: a module that is
// only a bag of parameters of odd sizes and mixed roles, so that its
// ParameterStore has padding between parameters and decay_groups() gives two
// interleaved groups, plus helpers to read and write parameters as vectors.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/module.h"
#include "engine/parameter_store.h"

namespace lockstep::test {

class ParameterBag final : public engine::Module {
 public:
  explicit ParameterBag(const std::vector<std::pair<core::Shape, engine::ParamRole>>& params)
      : Module("ParameterBag") {
    for (std::size_t i = 0; i < params.size(); ++i) {
      std::string name = "p";  // not "p" + ...: GCC 12 warns falsely (-Wrestrict) on that
      name += std::to_string(i);
      add_parameter(name, params[i].first, params[i].second);
    }
  }
  core::Tensor forward(const core::Tensor&, engine::Context&) override {
    throw InvalidArgument("ParameterBag has no forward");
  }
  core::Tensor backward(const core::Tensor&, engine::Context&) override {
    throw InvalidArgument("ParameterBag has no backward");
  }
};

// Roles alternate so that both groups of decay_groups() have several
// parameters and interleave in the flat layout; 65 and 130 cross the 64-element
// alignment, 1 is the smallest parameter.
inline std::unique_ptr<ParameterBag> make_bag(std::int64_t extra_large = 0) {
  using engine::ParamRole;
  std::vector<std::pair<core::Shape, ParamRole>> params = {
      {{3, 11}, ParamRole::weight}, {{7}, ParamRole::bias},   {{1}, ParamRole::norm},
      {{5, 13}, ParamRole::weight}, {{130}, ParamRole::bias}, {{2, 3, 5}, ParamRole::weight}};
  if (extra_large > 0) params.push_back({{extra_large}, ParamRole::weight});
  return std::make_unique<ParameterBag>(params);
}

inline std::vector<float> uniform(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> read(const core::Tensor& t) { return t.to_vector<float>(); }

inline void write(core::Tensor& t, const std::vector<float>& values) {
  t.copy_from(core::Tensor::from_vector(values, t.shape(), DType::f32));
}

// Random values for every parameter (uniform in [-1, 1]) from `seed`.
inline void randomize_values(engine::ParameterStore& store, std::uint32_t seed) {
  for (const auto& s : store.slots())
    write(s.parameter->value, uniform(static_cast<std::size_t>(s.numel), seed + s.offset));
}

// The gradients of step `step`: uniform, with a magnitude that differs per
// parameter (0.01 to 3) so that eps and the moment estimates matter.
inline std::vector<std::vector<float>> step_grads(const engine::ParameterStore& store, int step) {
  static const float kScales[] = {1.0f, 0.01f, 3.0f, 0.2f, 1.5f, 0.05f, 0.7f};
  std::vector<std::vector<float>> grads;
  for (std::size_t i = 0; i < store.slots().size(); ++i)
    grads.push_back(uniform(static_cast<std::size_t>(store.slots()[i].numel),
                            static_cast<std::uint32_t>(1000 * step + i), kScales[i % 7]));
  return grads;
}

inline void set_grads(engine::ParameterStore& store, const std::vector<std::vector<float>>& grads) {
  for (std::size_t i = 0; i < grads.size(); ++i) write(store.slots()[i].parameter->grad, grads[i]);
}

}  // namespace lockstep::test
