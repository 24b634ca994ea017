// perturb_batch_norms: every BatchNorm2d of a model given running statistics
// away from (0, 1) and an affine away from (1, 0), drawn from `rng`, so that
// a path that drops or swaps any of them (train-mode statistics at
// evaluation, a buffer not exported or not loaded) changes the output.
#pragma once

#include <cstdint>
#include <random>

#include "engine/nn/batchnorm.h"
#include "engine/nn/module.h"

namespace lockstep::test {

inline void perturb_batch_norms(engine::Module& m, std::mt19937& rng) {
  std::uniform_real_distribution<float> mean(-0.5f, 0.5f), var(0.5f, 2.0f), scale(0.5f, 1.5f);
  if (auto* bn = dynamic_cast<engine::BatchNorm2d*>(&m)) {
    auto fill = [&](core::Tensor& t, std::uniform_real_distribution<float>& d) {
      float* p = t.data_as<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
    };
    fill(bn->running_mean()->value, mean);
    fill(bn->running_var()->value, var);
    fill(bn->weight()->value, scale);
    fill(bn->bias()->value, mean);
  }
  for (engine::Module* child : m.children()) perturb_batch_norms(*child, rng);
}

}  // namespace lockstep::test
