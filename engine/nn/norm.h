// LayerNorm over the last dimension, with an elementwise affine weight (init
// 1) and bias (init 0) as PyTorch's LayerNorm(normalized_shape). It computes
// in f32 (f64 row statistics) under autocast and returns f32, as PyTorch
// AMP's layer_norm does, unless told to return the autocast type; and it can
// take the residual add before it (forward_add): Note [low-type LayerNorm]
// (kernels/layernorm.h).
#pragma once

#include <cstdint>

#include "engine/nn/module.h"

namespace lockstep::engine {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t features, float eps = 1e-5f, bool affine = true);
  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;

  // Under autocast (f16, bf16), return y in the autocast type instead of f32:
  // for a LayerNorm whose consumer rounds its input to that type anyway (a
  // Linear), so the values it computes are the same and y moves half the
  // bytes. Off by default. On CUDA the kernel reads a low-type input and
  // writes a low-type output directly; on the CPU (and on CUDA when input
  // and output are f32) the f32 path runs and y is cast.
  void set_autocast_output(bool on) { autocast_output_ = on; }
  bool autocast_output() const { return autocast_output_; }

  // The residual add before this LayerNorm and the LayerNorm, in one pass on
  // CUDA: sum = residual + branch (residual f32, the stream; branch any float
  // type, added in f32 as Residual adds), y = forward(sum). backward_add then
  // takes y's gradient and the gradient reaching `sum` through the stream
  // (f32) and returns the gradient of `sum` (so of both residual and branch),
  // f32: the LayerNorm's dx plus dstream, in one pass on CUDA. On the CPU both
  // compose Residual's add and this module's forward and backward, the same
  // bits as the unfused modules.
  struct AddOutput {
    core::Tensor sum;  // f32
    core::Tensor y;
  };
  AddOutput forward_add(const core::Tensor& residual, const core::Tensor& branch, Context& ctx);
  core::Tensor backward_add(const core::Tensor& dy, const core::Tensor& dstream, Context& ctx);

  // Read by the ONNX exporter (engine/export/).
  std::int64_t features() const { return features_; }
  float eps() const { return eps_; }
  Parameter* weight() { return weight_; }  // null without affine
  Parameter* bias() { return bias_; }
  void reset_parameters(core::Generator& rng) override;

 private:
  DType output_type(const Context& ctx) const;
  // LayerNorm's dx, in the input's type, plus dstream when it is defined.
  core::Tensor input_grad_of(const core::Tensor& dy, const core::Tensor& dstream, Context& ctx);

  std::int64_t features_;
  float eps_;
  bool autocast_output_ = false;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  // Kept for backward: the input (f32 on the CPU, its own type on CUDA), mean
  // and rstd (f32).
  core::Tensor input_, mean_, rstd_;
  DType input_dtype_ = DType::f32;
};

}  // namespace lockstep::engine
