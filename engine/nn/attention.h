// CausalSelfAttention as nanoGPT writes it: one fused QKV Linear (c_attn,
// weight [3C, C], bias [3C]), H heads of size D = C / H, scores scaled by
// 1/sqrt(D), the causal mask, softmax, attention dropout, the output Linear
// (c_proj) and residual dropout. Input and output are [batch, seq, C].
// The head products are strided-batched GEMMs (kernels/gemm.h), on the CPU
// per block of query rows and on the heads where the Linears keep them (Notes
// [blocked causal attention] and [heads in place], attention.cpp); the masked
// softmax and the head moves are kernels/attention.h. Under autocast the
// GEMMs run in the low type and the softmax in f32, as PyTorch's autocast does.
#pragma once

#include <cstdint>

#include "engine/nn/activation.h"
#include "engine/nn/linear.h"
#include "engine/nn/module.h"

namespace lockstep::engine {

// The CPU head products' query rows per block (Note [blocked causal
// attention], attention.cpp); bench/gemm_floor.h times the same blocks.
inline constexpr std::int64_t kCausalQueryBlock = 64;

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
  std::int64_t embed_dim_, num_heads_, head_dim_;
  Linear* c_attn_;
  Dropout* attn_dropout_;
  Linear* c_proj_;
  Dropout* resid_dropout_;
  // Kept for backward (training only): q, k, v in the compute type (c_attn's
  // rows [B, T, 3C] on the CPU, [3, B * H, T, D] on CUDA: Note [heads in
  // place]), the softmax output [B * H, T, T] f32, and the weights the PV
  // product used (after dropout, in the compute type).
  core::Tensor qkv_heads_, probs_, weights_;
  std::int64_t batch_ = 0, seq_ = 0;
};

}  // namespace lockstep::engine
