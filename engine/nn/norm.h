// LayerNorm over the last dimension, with an elementwise affine weight (init
// 1) and bias (init 0) as PyTorch's LayerNorm(normalized_shape). It computes
// in f32 under autocast (a low-type input is widened first).
#pragma once

#include <cstdint>

#include "engine/nn/module.h"

namespace lockstep::engine {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t features, float eps = 1e-5f, bool affine = true);
  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  std::int64_t features() const { return features_; }
  float eps() const { return eps_; }
  Parameter* weight() { return weight_; }  // null without affine
  Parameter* bias() { return bias_; }
  void reset_parameters(core::Generator& rng) override;

 private:
  std::int64_t features_;
  float eps_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  core::Tensor input_, mean_, rstd_;  // f32, kept for backward
  DType input_dtype_ = DType::f32;
};

}  // namespace lockstep::engine
