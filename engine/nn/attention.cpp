// CausalSelfAttention (engine/nn/attention.h), with its CPU head products
// blocked by query rows so that they skip the masked upper triangle (Note
// [blocked causal attention]) and run on q, k, v where c_attn wrote them
// (Note [heads in place]); on CUDA, cuDNN's fused attention where it applies
// (Note [fused attention]).
#include "engine/nn/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/log.h"
#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "engine/kernel_paths.h"
#include "kernels/attention.h"
#include "kernels/conv.h"
#include "kernels/fusion.h"
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

core::Tensor as_type(const core::Tensor& t, DType type, const core::Stream& stream) {
  return t.dtype() == type ? t : t.cast(type, stream);
}

// One operand of the head products: B * H matrices of T rows, head (b, h)'s
// row 0 at element at + b * sample + h * head of t, its rows ld apart. On
// CUDA t is the [B * H, T, cols] tensor itself (at = 0), what batched_matmul
// takes.
struct HeadOperand {
  core::Tensor t;
  std::int64_t at = 0, ld = 0, head = 0, sample = 0;  // in elements

  // The sub-matrix from (row, col) of each head's matrix.
  HeadOperand from(std::int64_t row, std::int64_t col) const {
    HeadOperand shifted = *this;
    shifted.at += row * ld + col;
    return shifted;
  }
  void* data(std::int64_t sample_index) const {
    return static_cast<char*>(t.data()) + (at + sample_index * sample) * dtype_size(t.dtype());
  }
};

// Note [heads in place]: on the CPU the head products read q, k, v where
// c_attn wrote them, in the rows [B, T, 3, H, D], and write O, dq, dk and dv
// into rows too, through the GEMM's leading dimension (3C or C instead of
// D) and a batch of H heads side by side in a row (kernels/gemm.h): no
// split_heads and merge_heads copies, which read and wrote 16 MB per layer
// and step at gpt-tiny b16 (q, k, v and O forward, dO and dq, dk, dv
// backward). Measured with Note [blocked causal attention]'s timing loop:
// 10.45 ms per layer with the moves, 9.97 in place. CUDA keeps the moves to
// [P, B * H, T, D], so that each product stays one strided batch of cuBLASLt.
struct HeadShape {
  std::int64_t batch, seq, heads, head_dim;
  DType type;
  core::Device device;

  bool moved() const { return device.is_cuda(); }
  kernels::AttentionShape attention(std::int64_t parts) const {
    return {batch, seq, heads, head_dim, parts, type};
  }
  // The layout the products take `parts` [B, T, C] tensors in: Linear's rows
  // on the CPU, [parts, B * H, T, D] on CUDA.
  core::Shape layout(std::int64_t parts) const {
    if (moved()) return {parts, batch * heads, seq, head_dim};
    return {batch, seq, parts * heads * head_dim};
  }
  core::Tensor from_rows(const core::Tensor& rows, std::int64_t parts,
                         const core::Stream& stream) const {
    if (!moved()) return rows;
    core::Tensor moved_heads = core::Tensor::empty(layout(parts), type, device, stream);
    split_heads(attention(parts), rows, moved_heads, stream);
    return moved_heads;
  }
  core::Tensor to_rows(const core::Tensor& t, std::int64_t parts,
                       const core::Stream& stream) const {
    if (!moved()) return t;
    core::Tensor rows =
        core::Tensor::empty({batch, seq, parts * heads * head_dim}, type, device, stream);
    merge_heads(attention(parts), t, rows, stream);
    return rows;
  }
  // Part p of t (in layout(parts)): q, k, v for p = 0, 1, 2.
  HeadOperand operand(const core::Tensor& t, std::int64_t parts, std::int64_t p) const {
    if (moved()) {
      const core::Shape one{batch * heads, seq, head_dim};
      return {t.view(p * core::shape_numel(one), one), 0, head_dim, seq * head_dim,
              heads * seq * head_dim};
    }
    const std::int64_t width = parts * heads * head_dim;
    return {t, p * heads * head_dim, width, head_dim, seq * width};
  }
  // The scores S, P, dP or dS, [B * H, T, T].
  HeadOperand scores(const core::Tensor& t) const {
    return {t, 0, seq, seq * seq, heads * seq * seq};
  }
};

// Note [blocked causal attention]: on the CPU the six head products run per
// block of kCausalQueryBlock query rows [start, end), over keys [0, end) only: the
// scores' entries right of the diagonal block are never computed, read or
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
// The GEMM of a block is one call per sample, a strided batch over its H
// heads, which the CPU GEMM runs as one call per head (kernels/cpu/gemm.cpp):
// a head's bits depend on T, D and the block only, never on how many samples
// the micro-batch has (the rank-invariant mode's requirement). CUDA keeps the
// full products, one strided batch each.
// Measured on the 2-vCPU Intel Xeon VM (family 6, model 167; oneDNN 2.6, one
// thread, load 0.6-0.9): one layer at gpt-tiny's shapes (B 16, T 128, C 128,
// H 4, D 32; c_attn, the core and c_proj), forward plus backward, the median
// of 7 interleaved rounds of 9 x 20 calls: 10.83 ms unblocked (before), 10.45
// blocked, 9.97 blocked with Note [heads in place], 10.11 in place unblocked.
// The block size, in one set of 5 rounds: 64 10.11 ms, 128 (no blocking at T
// = 128) 10.16, 32 10.30. The saving is smaller than the FLOPs' (a quarter of
// the six products at T = 128) because the smaller GEMMs run slower: over
// 64 heads, S = QK^T took 0.57 ms blocked against 0.53 full, O = PV 0.42
// against 0.53, dV = P^T dO 0.48 against 0.52; inside the step these
// products ran at 56-105 GF/s against 136-180 for the Linears'. At gpt2's T
// = 1024 the blocks skip 15/32 of the products' work.

// Calls f(start, rows) for each block of query rows.
template <typename F>
void for_each_block(std::int64_t seq, F&& f) {
  for (std::int64_t start = 0; start < seq; start += kCausalQueryBlock)
    f(start, std::min(kCausalQueryBlock, seq - start));
}

// C = op(A) op(B) for every head of every sample, on the CPU.
void head_gemm(const HeadShape& hs, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
               std::int64_t k, const HeadOperand& a, const HeadOperand& b, const HeadOperand& c) {
  kernels::GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = a.ld;
  g.ldb = b.ld;
  g.ldc = c.ld;
  g.ab_type = a.t.dtype();
  g.c_type = c.t.dtype();
  g.batch = hs.heads;
  g.stride_a = a.head;
  g.stride_b = b.head;
  g.stride_c = c.head;
  for (std::int64_t sample = 0; sample < hs.batch; ++sample) {
    g.a = a.data(sample);
    g.b = b.data(sample);
    g.c = c.data(sample);
    kernels::cpu::gemm(g);
  }
}

// s = a b^T over the causal blocks, a and b [T, D] per head: S = Q K^T, dP = dO V^T.
void causal_scores(const HeadShape& hs, const HeadOperand& a, const HeadOperand& b,
                   const HeadOperand& s, const core::Stream& stream) {
  if (hs.moved()) {
    core::Tensor out = s.t;
    core::ops::batched_matmul(a.t, b.t, out, {.trans_b = true}, stream);
    return;
  }
  for_each_block(hs.seq, [&](std::int64_t start, std::int64_t rows) {
    head_gemm(hs, false, true, rows, start + rows, hs.head_dim, a.from(start, 0), b,
              s.from(start, 0));
  });
}

// out = w x for lower-triangular w [T, T] per head: O = P V, dQ = dS K.
void causal_rows(const HeadShape& hs, const HeadOperand& w, const HeadOperand& x,
                 const HeadOperand& out, const core::Stream& stream) {
  if (hs.moved()) {
    core::Tensor c = out.t;
    core::ops::batched_matmul(w.t, x.t, c, {}, stream);
    return;
  }
  for_each_block(hs.seq, [&](std::int64_t start, std::int64_t rows) {
    head_gemm(hs, false, false, rows, hs.head_dim, start + rows, w.from(start, 0), x,
              out.from(start, 0));
  });
}

// out = w^T x for lower-triangular w: dV = P^T dO, dK = dS^T Q.
void causal_columns(const HeadShape& hs, const HeadOperand& w, const HeadOperand& x,
                    const HeadOperand& out, const core::Stream& stream) {
  if (hs.moved()) {
    core::Tensor c = out.t;
    core::ops::batched_matmul(w.t, x.t, c, {.trans_a = true}, stream);
    return;
  }
  for_each_block(hs.seq, [&](std::int64_t start, std::int64_t keys) {
    head_gemm(hs, true, false, keys, hs.head_dim, hs.seq - start, w.from(start, start),
              x.from(start, 0), out.from(start, 0));
  });
}

// Note [fused attention]: on CUDA the attention core (scores, causal
// softmax, PV and their backward) is cuDNN's fused SDPA (kernels/sdpa.h)
// when all of these hold, checked in this order by fused_attention_refusal
// and choose_fused:
//   - the device is CUDA and the compute type bf16 or f16 (autocast);
//   - attention dropout does nothing (p = 0, or not training): cuDNN's
//     dropout would draw other bits than Note [dropout keys];
//   - this build has cudnn-frontend (kernels::sdpa_built()) and the fused
//     path is not turned off (kernels::set_fused_kernels);
//   - the shape passes the host rules (kernels::sdpa_shape_refusal: D a
//     multiple of 8 up to 128) and c_attn's output is 16-byte aligned;
//   - cuDNN has a plan for the forward and, when the forward keeps for
//     backward, for the backward, deterministic under kernels::deterministic()
//     (--deterministic, --rank-invariant).
// Otherwise the unfused path runs, as it does for f32 and on the CPU. The
// fused forward reads q, k, v in c_attn's rows and writes O as rows (Note
// [sdpa layouts]): no head moves, no [B * H, T, T] scores. It keeps qkv, O
// (c_proj's input, which c_proj keeps anyway) and the f32 log-sum-exp
// [B, H, T]: at gpt2's shapes 604 MB less per block than probs_ and
// weights_. Which path ran: a trace has the span "attention" with detail
// "cudnn sdpa" or "unfused" (CUDA only), and the first choice of each kind
// is logged once at info, a refusal with its reason.
// The two paths agree within a few low-type ulps, not in bits: cuDNN
// rescales its online softmax per key block, rounds P to the low type per
// block, and takes the backward's row term from O (low type) rather than
// sum P dP in f32 (tests/engine/gpu/test_sdpa_gpu.cpp). Its default
// backward adds dQ's parts with atomics, so it is deterministic only with
// the deterministic algorithm.

void log_choice_once(bool fused, const std::string& text) {
  static std::atomic<bool> fused_logged{false}, unfused_logged{false};
  std::atomic<bool>& logged = fused ? fused_logged : unfused_logged;
  if (!logged.exchange(true)) core::log_info("CausalSelfAttention: {}", text);
}

[[noreturn]] void fused_on_cpu() {
  throw InvalidArgument("CausalSelfAttention: the fused attention runs on CUDA only");
}

}  // namespace

std::string fused_attention_refusal(core::Device device, bool dropout_active,
                                    const kernels::SdpaShape& s) {
  if (!device.is_cuda()) return "not on CUDA";
  if (s.type != DType::bf16 && s.type != DType::f16)
    return std::string("compute type ") + dtype_name(s.type) + " (autocast bf16 or f16 fuses)";
  if (dropout_active) return "attention dropout is active";
  if (!kernels::sdpa_built()) return "built without cudnn-frontend (scripts/install-deps.sh)";
  if (!kernels::fused_kernels()) return "turned off (kernels::set_fused_kernels)";
  return kernels::sdpa_shape_refusal(s);
}

bool CausalSelfAttention::choose_fused(const kernels::SdpaShape& s, const core::Tensor& qkv,
                                       bool backward_too, bool deterministic) const {
  const bool dropout_active = attn_dropout_p_ > 0.0f && attn_dropout_->training();
  std::string why = fused_attention_refusal(qkv.device(), dropout_active, s);
  if (why.empty() && reinterpret_cast<std::uintptr_t>(qkv.data()) % 16 != 0)
    why = "c_attn's output is not 16-byte aligned";
  if (why.empty()) {
    core::set_current_device(qkv.device());  // the plans are per device
    if (kernels::cuda::sdpa_supported(s, kernels::SdpaPass::forward, false, &why) && backward_too)
      kernels::cuda::sdpa_supported(s, kernels::SdpaPass::backward, deterministic, &why);
  }
  if (qkv.device().is_cuda())
    note_kernel_path("attention", why.empty() ? "cudnn sdpa" : "unfused", why);
  // Refusals an f32 or CPU run always has are not news; the others are.
  if (!why.empty()) {
    if (qkv.device().is_cuda() && (s.type == DType::bf16 || s.type == DType::f16))
      log_choice_once(false, "unfused attention on CUDA (" + why + ")");
    return false;
  }
  log_choice_once(true, "cuDNN fused attention (cudnn-frontend " +
                            kernels::sdpa_frontend_version() + ", cuDNN " +
                            std::to_string(kernels::cuda::cudnn_runtime_version()) +
                            "), first at " + dtype_name(s.type) + " B " + std::to_string(s.batch) +
                            " H " + std::to_string(s.heads) + " T " + std::to_string(s.seq) +
                            " D " + std::to_string(s.head_dim));
  return true;
}

core::Tensor CausalSelfAttention::forward_fused(const core::Tensor& qkv,
                                                const kernels::SdpaShape& s, bool deterministic,
                                                Context& ctx) {
  const core::Device device = qkv.device();
  const core::Tensor y =
      core::Tensor::empty({s.batch, s.seq, s.width()}, s.type, device, ctx.stream);
  const core::Tensor stats =
      core::Tensor::empty({s.batch, s.heads, s.seq}, DType::f32, device, ctx.stream);
  {
    core::trace::Span span;
    span.open("attention", "cudnn sdpa", "module", &ctx.stream);
    core::dispatch_stream(device, ctx.stream, fused_on_cpu, [&](const core::Stream& stream) {
      const std::size_t bytes =
          kernels::cuda::sdpa_workspace_bytes(s, kernels::SdpaPass::forward, false);
      const core::Tensor workspace =
          core::Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::u8, device, stream);
      kernels::cuda::sdpa_forward(s, qkv.data(), y.data(), stats.data_as<float>(), workspace.data(),
                                  bytes, stream.handle());
    });
  }
  core::Tensor out = resid_dropout_->forward(c_proj_->forward(y, ctx), ctx);
  if (keeps_for_backward(ctx)) {
    qkv_heads_ = qkv;
    out_ = y;
    stats_ = stats;
    fused_ = true;
    deterministic_ = deterministic;
    batch_ = s.batch;
    seq_ = s.seq;
  } else {
    qkv_heads_ = out_ = stats_ = probs_ = weights_ = core::Tensor();
  }
  return out;
}

core::Tensor CausalSelfAttention::backward_fused(const core::Tensor& dy, Context& ctx) {
  const DType type = qkv_heads_.dtype();
  const core::Device device = qkv_heads_.device();
  const kernels::SdpaShape s{batch_, num_heads_, seq_, head_dim_, type};
  core::Tensor g = c_proj_->backward(resid_dropout_->backward(dy, ctx), ctx);
  c_proj_->report_ready(ctx);
  const core::Tensor dout = as_type(g, type, ctx.stream);
  const core::Tensor dqkv =
      core::Tensor::empty({batch_, seq_, 3 * embed_dim_}, type, device, ctx.stream);
  {
    core::trace::Span span;
    span.open("attention", "cudnn sdpa", "module", &ctx.stream);
    core::dispatch_stream(device, ctx.stream, fused_on_cpu, [&](const core::Stream& stream) {
      const std::size_t bytes =
          kernels::cuda::sdpa_workspace_bytes(s, kernels::SdpaPass::backward, deterministic_);
      const core::Tensor workspace =
          core::Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::u8, device, stream);
      kernels::cuda::sdpa_backward(s, deterministic_, qkv_heads_.data(), out_.data(), dout.data(),
                                   stats_.data_as<float>(), dqkv.data(), workspace.data(), bytes,
                                   stream.handle());
    });
  }
  qkv_heads_ = out_ = stats_ = core::Tensor();
  fused_ = false;
  core::Tensor dx = c_attn_->backward(dqkv, ctx);
  c_attn_->report_ready(ctx);
  return dx;
}

CausalSelfAttention::CausalSelfAttention(std::int64_t embed_dim, std::int64_t heads, float dropout)
    : Module("CausalSelfAttention"),
      embed_dim_(embed_dim),
      num_heads_(heads),
      attn_dropout_p_(dropout) {
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
  const kernels::SdpaShape sdpa{batch, num_heads_, seq, head_dim_, type};
  const bool deterministic = kernels::deterministic();
  if (choose_fused(sdpa, qkv, keeps_for_backward(ctx), deterministic))
    return forward_fused(qkv, sdpa, deterministic, ctx);  // Note [fused attention]
  std::optional<core::trace::Span> span;                  // reset where the core ends
  if (device.is_cuda()) span.emplace().open("attention", "unfused", "module", &ctx.stream);
  const HeadShape hs{batch, seq, num_heads_, head_dim_, type, device};
  const core::Tensor heads = hs.from_rows(qkv, 3, ctx.stream);  // Note [heads in place]

  core::Tensor scores = core::Tensor::empty({bh, seq, seq}, DType::f32, device, ctx.stream);
  causal_scores(hs, hs.operand(heads, 3, 0), hs.operand(heads, 3, 1), hs.scores(scores),
                ctx.stream);
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

  const core::Tensor y_heads = core::Tensor::empty(hs.layout(1), type, device, ctx.stream);
  causal_rows(hs, hs.scores(weights), hs.operand(heads, 3, 2), hs.operand(y_heads, 1, 0),
              ctx.stream);
  const core::Tensor y = hs.to_rows(y_heads, 1, ctx.stream);
  span.reset();
  core::Tensor out = resid_dropout_->forward(c_proj_->forward(y, ctx), ctx);

  fused_ = false;
  out_ = stats_ = core::Tensor();
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
  if (fused_) return backward_fused(dy, ctx);  // Note [fused attention]
  const std::int64_t bh = batch_ * num_heads_, seq = seq_;
  const DType type = qkv_heads_.dtype();
  const core::Device device = qkv_heads_.device();
  const HeadShape hs{batch_, seq, num_heads_, head_dim_, type, device};
  core::Tensor g = c_proj_->backward(resid_dropout_->backward(dy, ctx), ctx);
  c_proj_->report_ready(ctx);

  const core::Tensor dy_heads = hs.from_rows(as_type(g, type, ctx.stream), 1, ctx.stream);
  const core::Tensor dheads = core::Tensor::empty(hs.layout(3), type, device, ctx.stream);
  causal_columns(hs, hs.scores(weights_), hs.operand(dy_heads, 1, 0), hs.operand(dheads, 3, 2),
                 ctx.stream);
  core::Tensor dweights = core::Tensor::empty({bh, seq, seq}, DType::f32, device, ctx.stream);
  causal_scores(hs, hs.operand(dy_heads, 1, 0), hs.operand(qkv_heads_, 3, 2), hs.scores(dweights),
                ctx.stream);
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
  causal_rows(hs, hs.scores(ds), hs.operand(qkv_heads_, 3, 1), hs.operand(dheads, 3, 0),
              ctx.stream);
  causal_columns(hs, hs.scores(ds), hs.operand(qkv_heads_, 3, 0), hs.operand(dheads, 3, 1),
                 ctx.stream);
  const core::Tensor dqkv = hs.to_rows(dheads, 3, ctx.stream);
  qkv_heads_ = probs_ = weights_ = core::Tensor();
  core::Tensor dx = c_attn_->backward(dqkv, ctx);
  c_attn_->report_ready(ctx);
  return dx;
}

}  // namespace lockstep::engine
