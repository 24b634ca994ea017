// GptBlock: GPT-2's pre-LayerNorm transformer block, x + attn(ln_1(x)) then
// + mlp(ln_2(.)), as the Sequential of two Residuals it has always been (the
// same children, names, parameters, ready order, ZeRO-3 unit and ONNX
// export), whose forward and backward can run the residual adds fused with
// the LayerNorms (Note [fused block]).
#pragma once

#include <memory>

#include "engine/nn/containers.h"
#include "engine/nn/norm.h"

namespace lockstep::engine {

// Note [fused block]: under autocast (f16, bf16) on CUDA, with the f32
// residual stream PyTorch AMP keeps, the block runs
//   h1 = ln_1(x)                       the autocast type out (no f32 copy)
//   a  = attn(h1)
//   x1, h2 = x + a, ln_2(x + a)        one pass (LayerNorm::forward_add)
//   y  = x1 + mlp(h2)                  one pass (f32 + low type, no cast)
// and backward, with dy reaching y,
//   dx1 = dy + ln_2'(mlp'(dy))         one pass (LayerNorm::backward_add)
//   dx  = dx1 + ln_1'(attn'(dx1))      one pass
// in place of a cast, an add and an f32 LayerNorm per side. The values are
// the unfused block's: each add is the same f32 addition, and each LayerNorm
// output is the value the next Linear would round to the autocast type anyway.
// The block's second add is not fused with the next block's ln_1: that would
// cross the module boundary ZeRO-3 gathers at and Checkpointed recomputes
// from, for 4 bytes an element (one f32 re-read of y). Otherwise (f32, the
// CPU, a stream not f32) the Sequential of Residuals runs as it always has;
// Fusion::always runs the fused order on any device (on the CPU through the
// kernels' twins, the same bits: tests/engine/test_gpt_block.cpp). A traced
// run marks the fused passes with host spans "fused add+layernorm" and "fused
// add+ln backward" (no GPU twin: the block's own span times the kernels, and
// tools/trace.py would count a nested GPU span twice); the unfused path has
// none.
class GptBlock : public Sequential {
 public:
  enum class Fusion {
    cuda_autocast,  // the default: fused on CUDA under f16/bf16 autocast
    always,         // fused whenever the stream is f32 (tests of the CPU twin)
    never,          // the Sequential of Residuals
  };

  // attn_branch: [ln_1 (a LayerNorm), attn]; mlp_branch: [ln_2 (a
  // LayerNorm), mlp]; each child keeps its name. The LayerNorms are set to
  // return the autocast type (LayerNorm::set_autocast_output): both feed a
  // Linear.
  GptBlock(std::unique_ptr<Sequential> attn_branch, std::unique_ptr<Sequential> mlp_branch);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  void set_fusion(Fusion fusion) { fusion_ = fusion; }

 private:
  bool fuses(const core::Tensor& x, const Context& ctx) const;

  Fusion fusion_ = Fusion::cuda_autocast;
  Residual* attn_residual_;
  Residual* mlp_residual_;
  LayerNorm* ln_1_;
  Module* attn_;
  LayerNorm* ln_2_;
  Module* mlp_;
  bool fused_forward_ = false;  // which path the last training forward took
};

}  // namespace lockstep::engine
