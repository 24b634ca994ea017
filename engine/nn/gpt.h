// GPT: GPT-2 as nanoGPT writes it. Token and learned position embeddings,
// L pre-LayerNorm blocks (x + attn(ln_1(x)), then x + mlp(ln_2(x)) with
// c_fc [4C, C], GELU(tanh), c_proj [C, 4C]), a final LayerNorm and a head
// tied to the token embedding (Note [tied weights] in engine/nn/linear.h).
// Parameter names and layouts are nanoGPT's (transformer.wte.weight, ...,
// transformer.h.<i>.attn.c_attn.weight, transformer.ln_f.bias); the head is
// not stored separately. Input: tokens [B, T] (i32 or i64), T <= block_size;
// output: logits [B, T, vocab].
#pragma once

#include <cstdint>
#include <vector>

#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/embedding.h"
#include "engine/nn/linear.h"
#include "engine/nn/norm.h"

namespace lockstep::engine {

struct GptConfig {
  std::int64_t layers = 0;      // L
  std::int64_t heads = 0;       // H
  std::int64_t embed_dim = 0;   // C
  std::int64_t block_size = 0;  // T, the longest sequence
  std::int64_t vocab = 0;       // V
  float dropout = 0.0f;         // nanoGPT's: embeddings, attention, residuals, MLP
  // Each block a Checkpointed (engine/nn/checkpointed.h): the same names,
  // parameters and gradients, fewer activations kept, one more forward.
  bool activation_checkpointing = false;
};

class GPT : public Module {
 public:
  explicit GPT(const GptConfig& config);

  core::Tensor forward(const core::Tensor& tokens, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dlogits, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  Embedding& wte() { return *wte_; }
  Embedding& wpe() { return *wpe_; }
  Sequential& blocks() { return *blocks_; }
  LayerNorm& ln_f() { return *ln_f_; }
  Linear& lm_head() { return *lm_head_; }
  // GPT-2's initialisation of the whole model: weights normal(0, 0.02), the
  // c_proj weights normal(0, 0.02 / sqrt(2L)), biases zero, LayerNorm weights
  // one (initializes_subtree: the blocks keep no defaults of their own).
  void reset_parameters(core::Generator& rng) override;
  bool initializes_subtree() const override { return true; }

  const GptConfig& config() const { return config_; }

 private:
  void build_children(const GptConfig& c);
  GptConfig config_;
  Embedding* wte_;
  Embedding* wpe_;
  Dropout* drop_;
  Sequential* blocks_;
  LayerNorm* ln_f_;
  Linear* lm_head_;
  core::Tensor positions_;  // [B, T] i64, 0..T-1 per row, rebuilt when B or T change
};

// Greedy decoding: appends `count` tokens to `prompt` (not empty), each the
// most likely next token given at most block_size tokens before it. Runs the
// model in eval mode on `device` and leaves it in the mode it found.
std::vector<std::int32_t> generate_greedy(GPT& model, std::vector<std::int32_t> prompt,
                                          std::int64_t count, core::Device device,
                                          const core::Stream& stream = {});

}  // namespace lockstep::engine
