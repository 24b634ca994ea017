// GPT (engine/nn/gpt.h).
#include "engine/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "engine/nn/attention.h"
#include "engine/nn/checkpointed.h"
#include "engine/nn/gpt_block.h"

namespace lockstep::engine {
namespace {

// One transformer block: two residual branches, each named at the block's
// level (h.<i>.ln_1, h.<i>.attn, h.<i>.ln_2, h.<i>.mlp).
std::unique_ptr<Module> block(const GptConfig& c) {
  auto attn_branch = std::make_unique<Sequential>();
  attn_branch->emplace<LayerNorm>("ln_1", c.embed_dim, 1e-5f);
  attn_branch->emplace<CausalSelfAttention>("attn", c.embed_dim, c.heads, c.dropout);
  auto mlp_branch = std::make_unique<Sequential>();
  mlp_branch->emplace<LayerNorm>("ln_2", c.embed_dim, 1e-5f);
  auto& mlp = mlp_branch->emplace<Sequential>("mlp");
  // c_fc then GELU(approximate='tanh') as one layer: Note [fused activation];
  // c_proj's backward gives the gradient at GELU's input (Note [gelu gradient
  // from the next layer]).
  auto& c_fc = mlp.emplace<Linear>("c_fc", c.embed_dim, 4 * c.embed_dim, true,
                                   kernels::Activation::gelu_tanh);
  mlp.emplace<Linear>("c_proj", 4 * c.embed_dim, c.embed_dim).take_gelu_gradient_from(c_fc);
  mlp.emplace<Dropout>("dropout", c.dropout);
  // Note [fused block]: the Sequential of two Residuals, fused under autocast on CUDA.
  return std::make_unique<GptBlock>(std::move(attn_branch), std::move(mlp_branch));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

GPT::GPT(const GptConfig& config) : Module("GPT"), config_(config) {
  const GptConfig& c = config;
  if (c.layers <= 0 || c.heads <= 0 || c.embed_dim <= 0 || c.block_size <= 0 || c.vocab <= 0)
    throw InvalidArgument("GPT(layers=" + std::to_string(c.layers) + ", heads=" +
                          std::to_string(c.heads) + ", embed_dim=" + std::to_string(c.embed_dim) +
                          ", block_size=" + std::to_string(c.block_size) +
                          ", vocab=" + std::to_string(c.vocab) + "): sizes must be positive");
  {
    // Note [initialised when built]: GPT-2's scheme below covers every
    // parameter, so the layers draw nothing of their own.
    DeferInitialization defer;
    build_children(c);
  }
  initialize_when_built();
}

void GPT::build_children(const GptConfig& c) {
  wte_ = &static_cast<Embedding&>(
      add_child("transformer.wte", std::make_unique<Embedding>(c.vocab, c.embed_dim)));
  wpe_ = &static_cast<Embedding&>(
      add_child("transformer.wpe", std::make_unique<Embedding>(c.block_size, c.embed_dim)));
  drop_ =
      &static_cast<Dropout&>(add_child("transformer.drop", std::make_unique<Dropout>(c.dropout)));
  auto h = std::make_unique<Sequential>();
  for (std::int64_t i = 0; i < c.layers; ++i)
    h->add(std::to_string(i),
           c.activation_checkpointing ? std::make_unique<Checkpointed>(block(c)) : block(c));
  blocks_ = &static_cast<Sequential&>(add_child("transformer.h", std::move(h)));
  blocks_->trace_children();  // Note [module spans]
  ln_f_ = &static_cast<LayerNorm&>(
      add_child("transformer.ln_f", std::make_unique<LayerNorm>(c.embed_dim, 1e-5f)));
  ln_f_->set_autocast_output(true);  // it feeds lm_head: Note [low-type LayerNorm]
  Parameter& table = *wte_->own_parameters().front();
  lm_head_ = &static_cast<Linear&>(add_child("lm_head", std::make_unique<Linear>(table, false)));
}

void GPT::reset_parameters(core::Generator& rng) {
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers));
  for (Parameter* p : parameters()) {
    if (p->role == ParamRole::norm) {
      p->value.fill_(ends_with(p->name, ".weight") ? 1.0 : 0.0);
    } else if (p->role == ParamRole::bias) {
      p->value.fill_(0.0);
    } else {
      rng.normal(p->value, 0.0f, ends_with(p->name, "c_proj.weight") ? residual_std : 0.02f);
    }
  }
}

core::Tensor GPT::forward(const core::Tensor& tokens, Context& ctx) {
  if (tokens.shape().size() != 2 || tokens.dim(1) > config_.block_size || tokens.dim(1) == 0)
    shape_error(tokens, "expects tokens [batch, seq] with 1 <= seq <= block_size " +
                            std::to_string(config_.block_size));
  const std::int64_t batch = tokens.dim(0), seq = tokens.dim(1);
  if (!positions_.defined() || positions_.shape() != tokens.shape() ||
      !(positions_.device() == tokens.device())) {
    std::vector<std::int64_t> pos(static_cast<std::size_t>(batch * seq));
    for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int64_t>(i) % seq;
    positions_ =
        core::Tensor::from_vector(pos, {batch, seq}, DType::i64).to(tokens.device(), ctx.stream);
  }
  core::Tensor x;
  {
    core::trace::Span span;  // Note [module spans]: the parts around the blocks
    span.open("forward", "embeddings", "module", &ctx.stream);
    x = wte_->forward(tokens, ctx);
    // The positions are built above, each below seq <= block_size, wpe's
    // vocabulary: nothing to check (Note [embedding index check]).
    core::ops::add(x, wpe_->forward_in_range(positions_, ctx), x, ctx.stream);
    x = drop_->forward(x, ctx);
  }
  x = blocks_->forward(x, ctx);
  core::trace::Span span;
  span.open("forward", "ln_f and lm_head", "module", &ctx.stream);
  return lm_head_->forward(ln_f_->forward(x, ctx), ctx);
}

core::Tensor GPT::backward(const core::Tensor& dlogits, Context& ctx) {
  core::Tensor g;
  {
    core::trace::Span span;  // Note [module spans]
    span.open("backward", "ln_f and lm_head", "module", &ctx.stream);
    g = lm_head_->backward(dlogits, ctx);
    lm_head_->report_ready(ctx);
    g = ln_f_->backward(g, ctx);
    ln_f_->report_ready(ctx);
  }
  g = blocks_->backward(g, ctx);
  blocks_->report_ready(ctx);
  g = drop_->backward(g, ctx);
  drop_->report_ready(ctx);
  core::trace::Span span;
  span.open("backward", "embeddings", "module", &ctx.stream);
  const core::Tensor g32 = g.dtype() == DType::f32 ? g : g.cast(DType::f32, ctx.stream);
  wpe_->backward(g32, ctx);
  wpe_->report_ready(ctx);
  wte_->backward(g32, ctx);  // after lm_head's: Note [tied weights]
  wte_->report_ready(ctx);
  return core::Tensor();
}

std::vector<std::int32_t> generate_greedy(GPT& model, std::vector<std::int32_t> prompt,
                                          std::int64_t count, core::Device device,
                                          const core::Stream& stream) {
  if (prompt.empty()) throw InvalidArgument("generate_greedy: the prompt is empty");
  const bool was_training = model.training();
  model.eval();
  Context ctx;
  ctx.stream = stream;
  const std::int64_t vocab = model.config().vocab, window = model.config().block_size;
  for (std::int64_t n = 0; n < count; ++n) {
    const auto len = std::min<std::int64_t>(window, static_cast<std::int64_t>(prompt.size()));
    const std::vector<std::int32_t> context(prompt.end() - len, prompt.end());
    const core::Tensor tokens =
        core::Tensor::from_vector(context, {1, len}, DType::i32).to(device, stream);
    const core::Tensor logits = model.forward(tokens, ctx);
    const core::Tensor last = logits.view((len - 1) * vocab, {vocab});
    const auto v = (last.dtype() == DType::f32 ? last : last.cast(DType::f32, stream))
                       .to_vector<float>(stream);
    prompt.push_back(static_cast<std::int32_t>(std::max_element(v.begin(), v.end()) - v.begin()));
  }
  model.train(was_training);
  return prompt;
}

}  // namespace lockstep::engine
