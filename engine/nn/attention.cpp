// CausalSelfAttention (engine/nn/attention.h).
#include "engine/nn/attention.h"

#include <cmath>
#include <memory>
#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "kernels/attention.h"

namespace lockstep::engine {
namespace {

void split_heads(const kernels::AttentionShape& s, const core::Tensor& rows, core::Tensor& heads,
                 const core::Stream& stream) {
  core::dispatch(
      rows.device(), stream, [&] { kernels::cpu::split_heads(s, rows.data(), heads.data()); },
      [&](kernels::CudaStream cs) {
        kernels::cuda::split_heads(s, rows.data(), heads.data(), cs);
      });
}

void merge_heads(const kernels::AttentionShape& s, const core::Tensor& heads, core::Tensor& rows,
                 const core::Stream& stream) {
  core::dispatch(
      rows.device(), stream, [&] { kernels::cpu::merge_heads(s, heads.data(), rows.data()); },
      [&](kernels::CudaStream cs) {
        kernels::cuda::merge_heads(s, heads.data(), rows.data(), cs);
      });
}

// The t-th of the three [B * H, T, D] blocks of `heads` ([3, B * H, T, D]).
core::Tensor part(const core::Tensor& heads, std::int64_t t) {
  const core::Shape one{heads.dim(1), heads.dim(2), heads.dim(3)};
  return heads.view(t * core::shape_numel(one), one);
}

core::Tensor as_type(const core::Tensor& t, DType type, const core::Stream& stream) {
  return t.dtype() == type ? t : t.cast(type, stream);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(std::int64_t embed_dim, std::int64_t heads, float dropout)
    : Module("CausalSelfAttention"), embed_dim_(embed_dim), num_heads_(heads) {
  if (embed_dim <= 0 || heads <= 0 || embed_dim % heads != 0)
    throw InvalidArgument("CausalSelfAttention(embed_dim=" + std::to_string(embed_dim) +
                          ", heads=" + std::to_string(heads) +
                          "): embed_dim must be a positive multiple of heads");
  head_dim_ = embed_dim / heads;
  c_attn_ = &static_cast<Linear&>(
      add_child("c_attn", std::make_unique<Linear>(embed_dim, 3 * embed_dim)));
  attn_dropout_ =
      &static_cast<Dropout&>(add_child("attn_dropout", std::make_unique<Dropout>(dropout)));
  c_proj_ =
      &static_cast<Linear&>(add_child("c_proj", std::make_unique<Linear>(embed_dim, embed_dim)));
  resid_dropout_ =
      &static_cast<Dropout&>(add_child("resid_dropout", std::make_unique<Dropout>(dropout)));
}

core::Tensor CausalSelfAttention::forward(const core::Tensor& x, Context& ctx) {
  if (x.shape().size() != 3 || x.dim(2) != embed_dim_)
    shape_error(x, "expects [batch, seq, " + std::to_string(embed_dim_) + "]");
  const std::int64_t batch = x.dim(0), seq = x.dim(1), bh = batch * num_heads_;
  const core::Tensor qkv = c_attn_->forward(x, ctx);  // [B, T, 3C] in the compute type
  const DType type = qkv.dtype();
  const core::Device device = x.device();
  core::Tensor heads = core::Tensor::empty({3, bh, seq, head_dim_}, type, device, ctx.stream);
  split_heads(kernels::AttentionShape{batch, seq, num_heads_, head_dim_, 3, type}, qkv, heads,
              ctx.stream);

  core::Tensor scores = core::Tensor::empty({bh, seq, seq}, DType::f32, device, ctx.stream);
  core::ops::batched_matmul(part(heads, 0), part(heads, 1), scores, {.trans_b = true}, ctx.stream);
  core::Tensor probs = scores;  // the softmax runs in place (kernels/attention.h)
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  core::dispatch(
      device, ctx.stream,
      [&] {
        kernels::cpu::causal_softmax_forward(bh, seq, scale, scores.data_as<float>(),
                                             probs.data_as<float>());
      },
      [&](kernels::CudaStream cs) {
        kernels::cuda::causal_softmax_forward(bh, seq, scale, scores.data_as<float>(),
                                              probs.data_as<float>(), cs);
      });
  // Dropout keys by sample (Note [dropout keys]): one row per sample.
  const core::Tensor dropped =
      attn_dropout_->forward(probs.reshape({batch, num_heads_ * seq * seq}), ctx);
  const core::Tensor weights = as_type(dropped, type, ctx.stream).reshape({bh, seq, seq});

  core::Tensor y_heads = core::Tensor::empty({bh, seq, head_dim_}, type, device, ctx.stream);
  core::ops::batched_matmul(weights, part(heads, 2), y_heads, {}, ctx.stream);
  core::Tensor y = core::Tensor::empty({batch, seq, embed_dim_}, type, device, ctx.stream);
  merge_heads(kernels::AttentionShape{batch, seq, num_heads_, head_dim_, 1, type}, y_heads, y,
              ctx.stream);
  core::Tensor out = resid_dropout_->forward(c_proj_->forward(y, ctx), ctx);

  if (keeps_for_backward(ctx)) {
    qkv_heads_ = heads;
    probs_ = probs;
    weights_ = weights;
    batch_ = batch;
    seq_ = seq;
  } else {
    qkv_heads_ = probs_ = weights_ = core::Tensor();
  }
  return out;
}

core::Tensor CausalSelfAttention::backward(const core::Tensor& dy, Context& ctx) {
  if (!qkv_heads_.defined()) no_forward_error();
  check_gradient(dy, {batch_, seq_, embed_dim_}, qkv_heads_.device());
  const std::int64_t bh = batch_ * num_heads_, seq = seq_;
  const DType type = qkv_heads_.dtype();
  const core::Device device = qkv_heads_.device();
  core::Tensor g = c_proj_->backward(resid_dropout_->backward(dy, ctx), ctx);
  c_proj_->report_ready(ctx);

  const core::Tensor dy_rows = as_type(g, type, ctx.stream);
  core::Tensor dy_heads = core::Tensor::empty({bh, seq, head_dim_}, type, device, ctx.stream);
  split_heads(kernels::AttentionShape{batch_, seq, num_heads_, head_dim_, 1, type}, dy_rows,
              dy_heads, ctx.stream);
  core::Tensor dheads = core::Tensor::empty(qkv_heads_.shape(), type, device, ctx.stream);
  core::Tensor dv = part(dheads, 2);
  core::ops::batched_matmul(weights_, dy_heads, dv, {.trans_a = true}, ctx.stream);
  core::Tensor dweights = core::Tensor::empty({bh, seq, seq}, DType::f32, device, ctx.stream);
  core::ops::batched_matmul(dy_heads, part(qkv_heads_, 2), dweights, {.trans_b = true}, ctx.stream);
  const core::Tensor dprobs =
      attn_dropout_->backward(dweights.reshape({batch_, num_heads_ * seq * seq}), ctx);

  core::Tensor dscores = dweights;  // in place: dprobs is dweights or a copy of it
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  core::dispatch(
      device, ctx.stream,
      [&] {
        kernels::cpu::causal_softmax_backward(bh, seq, scale, probs_.data_as<float>(),
                                              dprobs.data_as<float>(), dscores.data_as<float>());
      },
      [&](kernels::CudaStream cs) {
        kernels::cuda::causal_softmax_backward(bh, seq, scale, probs_.data_as<float>(),
                                               dprobs.data_as<float>(), dscores.data_as<float>(),
                                               cs);
      });
  const core::Tensor ds = as_type(dscores, type, ctx.stream);
  core::Tensor dq = part(dheads, 0), dk = part(dheads, 1);
  core::ops::batched_matmul(ds, part(qkv_heads_, 1), dq, {}, ctx.stream);
  core::ops::batched_matmul(ds, part(qkv_heads_, 0), dk, {.trans_a = true}, ctx.stream);
  core::Tensor dqkv = core::Tensor::empty({batch_, seq, 3 * embed_dim_}, type, device, ctx.stream);
  merge_heads(kernels::AttentionShape{batch_, seq, num_heads_, head_dim_, 3, type}, dheads, dqkv,
              ctx.stream);
  qkv_heads_ = probs_ = weights_ = core::Tensor();
  core::Tensor dx = c_attn_->backward(dqkv, ctx);
  c_attn_->report_ready(ctx);
  return dx;
}

}  // namespace lockstep::engine
