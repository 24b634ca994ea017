// CausalSelfAttention (engine/nn/attention.h), with its CPU head products
// blocked by query rows so that they skip the masked upper triangle (Note
// [blocked causal attention]).
#include "engine/nn/attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"

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

// Note [blocked causal attention]: on the CPU the six head products run per
// block of kQueryBlock query rows [start, end), over keys [0, end) only: the
// scores' entries above the diagonal block are never computed, read or
// written, and the [B * H, T, T] layout of S, P and dP stays as it is (their
// row stride is T; the softmax kernels and the saved P are unchanged).
// The forward: S[rows, 0:end] = Q[rows] K[0:end]^T, O[rows] = P[rows, 0:end]
// V[0:end]. The backward: dP[rows, 0:end] = dO[rows] V[0:end]^T, dQ[rows] =
// dS[rows, 0:end] K[0:end], and per key block, each written once, dV[keys] =
// P[start:T, keys]^T dO[start:T] and dK[keys] = dS[start:T, keys]^T Q[start:T].
// What is left out is exact zeros of P and dS, so only the GEMM library's
// rounding of a shorter sum changes. Inside the diagonal block the products
// do compute the entries above the diagonal: the softmax reads S and dP at
// j <= i only, and writes P and dS as 0 there (kernels/attention.h), which
// is what the next products read. The entries right of the diagonal block
// stay as the allocator left them in S and dP (P and dS get the softmax's
// zeros), and dropout's and the casts' copies of them are read by nothing.
// Each GEMM is one strided batch over the B * H heads, which the CPU GEMM
// runs as one call per head (kernels/cpu/gemm.cpp): a head's bits do not
// depend on how many heads or samples share the call (the rank-invariant
// mode's requirement). CUDA keeps the full products: cuBLASLt's strided
// batches are one launch each, and there the softmax's mask costs little.
// Measured (bench_step gpt-tiny b16, 1 thread, T = 128, D = 32): see
// docs/benchmarks.md, "gpt-tiny".
constexpr std::int64_t kQueryBlock = 64;

// Calls f(start, rows) for each block of query rows.
template <typename F>
void for_each_block(std::int64_t seq, F&& f) {
  for (std::int64_t start = 0; start < seq; start += kQueryBlock)
    f(start, std::min(kQueryBlock, seq - start));
}

// One strided batch over the heads of C = op(A) op(B) on sub-matrices: a, b
// and c are [B * H, rows, cols] tensors, and *_at is the element in each
// head's matrix where the operand starts (its row stride stays cols).
void head_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               const core::Tensor& a, std::int64_t a_at, const core::Tensor& b, std::int64_t b_at,
               const core::Tensor& c, std::int64_t c_at) {
  auto at = [](const core::Tensor& t, std::int64_t element) {
    return static_cast<char*>(t.data()) + element * dtype_size(t.dtype());
  };
  kernels::GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = at(a, a_at);
  g.lda = a.dim(2);
  g.b = at(b, b_at);
  g.ldb = b.dim(2);
  g.c = at(c, c_at);
  g.ldc = c.dim(2);
  g.ab_type = a.dtype();
  g.c_type = c.dtype();
  g.batch = a.dim(0);
  g.stride_a = a.dim(1) * a.dim(2);
  g.stride_b = b.dim(1) * b.dim(2);
  g.stride_c = c.dim(1) * c.dim(2);
  kernels::cpu::gemm(g);
}

// s [B * H, T, T] = a b^T for a, b [B * H, T, D]: S = Q K^T and dP = dO V^T.
void causal_scores(const core::Tensor& a, const core::Tensor& b, core::Tensor& s,
                   const core::Stream& stream) {
  if (s.device().is_cuda()) {
    core::ops::batched_matmul(a, b, s, {.trans_b = true}, stream);
    return;
  }
  const std::int64_t seq = s.dim(1), d = a.dim(2);
  for_each_block(seq, [&](std::int64_t start, std::int64_t rows) {
    head_gemm(false, true, rows, start + rows, d, a, start * d, b, 0, s, start * seq);
  });
}

// out [B * H, T, D] = w x for lower-triangular w [B * H, T, T]: O = P V and dQ = dS K.
void causal_rows(const core::Tensor& w, const core::Tensor& x, core::Tensor& out,
                 const core::Stream& stream) {
  if (out.device().is_cuda()) {
    core::ops::batched_matmul(w, x, out, {}, stream);
    return;
  }
  const std::int64_t seq = w.dim(1), d = x.dim(2);
  for_each_block(seq, [&](std::int64_t start, std::int64_t rows) {
    head_gemm(false, false, rows, d, start + rows, w, start * seq, x, 0, out, start * d);
  });
}

// out [B * H, T, D] = w^T x for lower-triangular w: dV = P^T dO and dK = dS^T Q.
void causal_columns(const core::Tensor& w, const core::Tensor& x, core::Tensor& out,
                    const core::Stream& stream) {
  if (out.device().is_cuda()) {
    core::ops::batched_matmul(w, x, out, {.trans_a = true}, stream);
    return;
  }
  const std::int64_t seq = w.dim(1), d = x.dim(2);
  for_each_block(seq, [&](std::int64_t start, std::int64_t keys) {
    head_gemm(true, false, keys, d, seq - start, w, start * seq + start, x, start * d, out,
              start * d);
  });
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
  causal_scores(part(heads, 0), part(heads, 1), scores, ctx.stream);
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
  causal_rows(weights, part(heads, 2), y_heads, ctx.stream);
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
  causal_columns(weights_, dy_heads, dv, ctx.stream);
  core::Tensor dweights = core::Tensor::empty({bh, seq, seq}, DType::f32, device, ctx.stream);
  causal_scores(dy_heads, part(qkv_heads_, 2), dweights, ctx.stream);
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
  causal_rows(ds, part(qkv_heads_, 1), dq, ctx.stream);
  causal_columns(ds, part(qkv_heads_, 0), dk, ctx.stream);
  core::Tensor dqkv = core::Tensor::empty({batch_, seq, 3 * embed_dim_}, type, device, ctx.stream);
  merge_heads(kernels::AttentionShape{batch_, seq, num_heads_, head_dim_, 3, type}, dheads, dqkv,
              ctx.stream);
  qkv_heads_ = probs_ = weights_ = core::Tensor();
  core::Tensor dx = c_attn_->backward(dqkv, ctx);
  c_attn_->report_ready(ctx);
  return dx;
}

}  // namespace lockstep::engine
