// CausalSelfAttention as nanoGPT writes it: one fused QKV Linear (c_attn,
// weight [3C, C], bias [3C]), H heads of size D = C / H, scores scaled by
// 1/sqrt(D), the causal mask, softmax, attention dropout, the output Linear
// (c_proj) and residual dropout. Input and output are [batch, seq, C].
// The head products are strided-batched GEMMs (kernels/gemm.h), on the CPU
// per block of query rows and on the heads where the Linears keep them (Notes
// [blocked causal attention] and [heads in place], attention.cpp); the masked
// softmax and the head moves are kernels/attention.h. Under autocast the
// GEMMs run in the low type and the softmax in f32, as PyTorch's autocast does.
// On CUDA under bf16/f16 autocast with attention dropout inactive, the core is
// cuDNN's fused attention (kernels/sdpa.h) where cuDNN supports the shape, and
// the path above otherwise (Note [fused attention], attention.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "engine/nn/activation.h"
#include "engine/nn/linear.h"
#include "engine/nn/module.h"
#include "kernels/sdpa.h"

namespace lockstep::engine {

// The CPU head products' query rows per block (Note [blocked causal
// attention], attention.cpp); bench/gemm_floor.h times the same blocks.
inline constexpr std::int64_t kCausalQueryBlock = 64;

// Why CausalSelfAttention on `device` with shape `s` (its type the compute
// type) does not take cuDNN's fused attention, by the rules known without a
// GPU: the device, the type, active attention dropout, a build without
// cudnn-frontend or the path turned off (kernels::set_fused_kernels), the
// shape. Empty when only cuDNN's own check remains
// (Note [fused attention], attention.cpp).
std::string fused_attention_refusal(core::Device device, bool dropout_active,
                                    const kernels::SdpaShape& s);

class CausalSelfAttention : public Module {
 public:
  // `dropout` is nanoGPT's: the attention weights' and the output's.
  CausalSelfAttention(std::int64_t embed_dim, std::int64_t heads, float dropout = 0.0f);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  std::int64_t embed_dim() const { return embed_dim_; }
  std::int64_t num_heads() const { return num_heads_; }

  Linear& c_attn() { return *c_attn_; }
  Linear& c_proj() { return *c_proj_; }

 private:
  // Note [fused attention]: whether this forward takes cuDNN's path.
  bool choose_fused(const kernels::SdpaShape& s, const core::Tensor& qkv, bool backward_too,
                    bool deterministic) const;
  core::Tensor forward_fused(const core::Tensor& qkv, const kernels::SdpaShape& s,
                             bool deterministic, Context& ctx);
  core::Tensor backward_fused(const core::Tensor& dy, Context& ctx);

  std::int64_t embed_dim_, num_heads_, head_dim_;
  float attn_dropout_p_;
  Linear* c_attn_;
  Dropout* attn_dropout_;
  Linear* c_proj_;
  Dropout* resid_dropout_;
  // Kept for backward (training only): q, k, v in the compute type (c_attn's
  // rows [B, T, 3C] on the CPU, [3, B * H, T, D] on CUDA: Note [heads in
  // place]), the softmax output [B * H, T, T] f32, and the weights the PV
  // product used (after dropout, in the compute type). The fused path keeps
  // c_attn's rows in qkv_heads_, O's rows [B, T, C] and the log-sum-exp
  // [B, H, T] f32 instead, and whether its backward is deterministic.
  core::Tensor qkv_heads_, probs_, weights_, out_, stats_;
  bool fused_ = false, deterministic_ = false;
  std::int64_t batch_ = 0, seq_ = 0;
};

}  // namespace lockstep::engine
