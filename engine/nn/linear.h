// Linear: y = x W^T + b for x [..., in_features], W [out, in] (PyTorch's
// layout); leading dimensions are rows. Under autocast the GEMMs run in
// f16/bf16 with f32 accumulation on a low-precision copy of W made once per
// weight version (once per optimizer step, not per micro-batch), and dW lands
// in the f32 gradient directly (GEMM with an f32 C and beta = 1). On CUDA the
// bias, and a fused GELU(tanh), run in the GEMM's cuBLASLt epilogue (Note
// [gemm epilogues] in kernels/gemm.h); the CPU runs the same ops separately.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/nn/module.h"
#include "kernels/activation.h"

namespace lockstep::engine {

class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true);
  // Note [fused activation]: y = GELU_tanh(x W^T + b), one layer where GPT-2's
  // MLP had Linear then GELU(approximate='tanh'); the same parameters, names
  // and bits on the CPU (Linear's ops, then GELU's, in their order). On CUDA
  // under f16/bf16 autocast (f32 keeps the separate kernels: Note [epilogue
  // fallback]) the forward is one GEMM with the GELU_AUX_BIAS epilogue, which also keeps
  // the pre-activation for backward (as GELU kept its input); the backward
  // applies GELU's derivative with the elementwise kernel and fuses the bias
  // gradient into the dW GEMM (BGRADB), unless the next layer does both
  // (take_gelu_gradient_from). Only gelu_tanh, with a bias: what cuBLASLt's
  // epilogue computes. The ONNX exporter writes the two nodes.
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias,
         kernels::Activation fused_activation);

  // Note [gelu gradient from the next layer]: this layer's input is
  // `previous`'s output (a Linear with a fused GELU, GPT-2's c_fc before
  // c_proj). This layer's dX GEMM then gives the gradient at previous's
  // pre-activation and previous's bias gradient in one call (on CUDA the
  // DGELU_BGRAD epilogue, on the CPU the same ops as previous would run, so
  // the same bits), and previous's backward starts from there. It does so
  // only when previous kept its pre-activation in this pass at this layer's
  // input shape and type and both want their gradients; otherwise previous
  // does it itself.
  void take_gelu_gradient_from(Linear& previous);
  // Note [tied weights]: a Linear whose weight is another module's parameter
  // (GPT's head uses the token embedding's [vocab, dim] table). The owner
  // registers, initialises, stores and reports it; this layer only adds its
  // dW into the shared gradient. The owner's backward must run after this
  // layer's (the embedding is the first layer, so it does), so that the
  // owner's ready report comes after both contributions.
  Linear(Parameter& tied_weight, bool bias);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }
  // The activation applied after the bias (Note [fused activation]).
  std::optional<kernels::Activation> activation() const { return activation_; }
  void reset_parameters(core::Generator& rng) override;

  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }

 private:
  std::int64_t in_features_, out_features_;
  Parameter* weight_;
  bool tied_ = false;
  Parameter* bias_ = nullptr;
  std::optional<kernels::Activation> activation_;
  core::Tensor pre_activation_;              // Note [fused activation], kept for backward
  Linear* gelu_producer_ = nullptr;          // Note [gelu gradient from the next layer]
  bool gradient_at_pre_activation_ = false;  // set by the next layer's backward
  core::Tensor input_;  // in the compute type, kept for backward (training only)
  DType input_dtype_ = DType::f32;
  core::Shape input_shape_;
  AutocastWeight low_weight_;  // Note [autocast weight copy]
};

// PyTorch's default init for Linear and Conv2d: kaiming_uniform_(a = sqrt(5)) on
// the weight and uniform(+-1/sqrt(fan_in)) on the bias, which both reduce to
// uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)). The tensor must be on the CPU.
void init_uniform(core::Tensor& value, core::Generator& rng, float bound);

}  // namespace lockstep::engine
