// GptBlock (engine/nn/gpt_block.h): Note [fused block].
#include "engine/nn/gpt_block.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/core/dispatch.h"
#include "engine/core/trace.h"
#include "engine/kernel_paths.h"
#include "kernels/fusion.h"
#include "kernels/layernorm.h"

namespace lockstep::engine {
namespace {

// The LayerNorm a branch starts with, and the module after it.
std::pair<LayerNorm*, Module*> norm_then_module(Sequential& branch, const char* which) {
  const std::vector<Module*> children = branch.children();
  auto* norm = children.size() == 2 ? dynamic_cast<LayerNorm*>(children[0]) : nullptr;
  if (!norm)
    throw InvalidArgument(std::string("GptBlock: the ") + which + " branch has " +
                          std::to_string(children.size()) +
                          " children; it must be [LayerNorm, module] (ln_1 then attn, ln_2 "
                          "then mlp)");
  return {norm, children[1]};
}

}  // namespace

GptBlock::GptBlock(std::unique_ptr<Sequential> attn_branch,
                   std::unique_ptr<Sequential> mlp_branch) {
  if (!attn_branch || !mlp_branch) throw InvalidArgument("GptBlock: a branch is null");
  std::tie(ln_1_, attn_) = norm_then_module(*attn_branch, "attention");
  std::tie(ln_2_, mlp_) = norm_then_module(*mlp_branch, "MLP");
  ln_1_->set_autocast_output(true);
  ln_2_->set_autocast_output(true);
  auto attn_residual = std::make_unique<Residual>(std::move(attn_branch), nullptr);
  auto mlp_residual = std::make_unique<Residual>(std::move(mlp_branch), nullptr);
  attn_residual_ = attn_residual.get();
  mlp_residual_ = mlp_residual.get();
  add("", std::move(attn_residual));
  add("", std::move(mlp_residual));
}

bool GptBlock::fuses(const core::Tensor& x, const Context& ctx) const {
  if (fusion_ == Fusion::never || x.dtype() != DType::f32) return false;
  if (fusion_ == Fusion::always) return true;
  return x.device().is_cuda() && kernels::fused_kernels() && ctx.autocast &&
         (*ctx.autocast == DType::f16 || *ctx.autocast == DType::bf16);
}

// The same Context::on_module signals as the Sequentials and Residuals of the
// unfused path, in the same order, so that ZeRO-3 gathers whichever of them
// is a unit; ready reports likewise (Note [grad-ready order]).
core::Tensor GptBlock::forward(const core::Tensor& x, Context& ctx) {
  fused_forward_ = fuses(x, ctx);
  if (x.device().is_cuda())
    note_kernel_path("gpt block", fused_forward_ ? "fused add+layernorm" : "unfused");
  if (!fused_forward_) return Sequential::forward(x, ctx);
  auto signal = [&](Module& m, ModulePhase phase) {
    if (ctx.on_module) ctx.on_module(m, phase);
  };
  auto run = [&](Module& m, const core::Tensor& in) {
    signal(m, ModulePhase::before_forward);
    core::Tensor out = m.forward(in, ctx);
    signal(m, ModulePhase::after_forward);
    return out;
  };
  signal(*attn_residual_, ModulePhase::before_forward);
  const core::Tensor a = run(*attn_, run(*ln_1_, x));
  signal(*attn_residual_, ModulePhase::after_forward);

  signal(*mlp_residual_, ModulePhase::before_forward);
  LayerNorm::AddOutput h;
  {
    core::trace::Span span;
    span.open("fused add+layernorm", ln_2_->path(), "module");
    signal(*ln_2_, ModulePhase::before_forward);
    h = ln_2_->forward_add(x, a, ctx);
    signal(*ln_2_, ModulePhase::after_forward);
  }
  const core::Tensor m = run(*mlp_, h.y);
  if (m.shape() != h.sum.shape())
    throw InvalidArgument(describe() + ": the MLP gives " + core::shape_str(m.shape()) +
                          " but the residual stream is " + core::shape_str(h.sum.shape()));
  core::Tensor y = core::Tensor::empty(m.shape(), DType::f32, m.device(), ctx.stream);
  core::dispatch(
      y.device(), ctx.stream,
      [&] {
        kernels::cpu::residual_add(y.numel(), h.sum.data_as<float>(), m.data(), m.dtype(),
                                   y.data_as<float>());
      },
      [&](kernels::CudaStream s) {
        kernels::cuda::residual_add(y.numel(), h.sum.data_as<float>(), m.data(), m.dtype(),
                                    y.data_as<float>(), s);
      });
  signal(*mlp_residual_, ModulePhase::after_forward);
  return y;
}

core::Tensor GptBlock::backward(const core::Tensor& dy, Context& ctx) {
  if (!fused_forward_) return Sequential::backward(dy, ctx);
  auto signal = [&](Module& m, ModulePhase phase) {
    if (ctx.on_module) ctx.on_module(m, phase);
  };
  // Residual::backward adds the stream's gradient in the branch's dx type, f32.
  const core::Tensor g = dy.dtype() == DType::f32 ? dy : dy.cast(DType::f32, ctx.stream);

  signal(*mlp_residual_, ModulePhase::before_backward);
  signal(*mlp_, ModulePhase::before_backward);
  const core::Tensor dh2 = mlp_->backward(g, ctx);
  mlp_->report_ready(ctx);
  signal(*mlp_, ModulePhase::after_backward);
  if (!dh2.defined())
    throw InvalidArgument(describe() + ": the MLP returned no input gradient (ln_2 needs one)");
  core::Tensor dx1;
  {
    core::trace::Span span;
    span.open("fused add+ln backward", ln_2_->path(), "module");
    signal(*ln_2_, ModulePhase::before_backward);
    dx1 = ln_2_->backward_add(dh2, g, ctx);
    ln_2_->report_ready(ctx);
    signal(*ln_2_, ModulePhase::after_backward);
  }
  mlp_residual_->report_ready(ctx);
  signal(*mlp_residual_, ModulePhase::after_backward);

  signal(*attn_residual_, ModulePhase::before_backward);
  signal(*attn_, ModulePhase::before_backward);
  const core::Tensor dh1 = attn_->backward(dx1, ctx);
  attn_->report_ready(ctx);
  signal(*attn_, ModulePhase::after_backward);
  core::Tensor dx;
  if (dh1.defined()) {  // undefined: ln_1 has no parameters and no dx is wanted
    core::trace::Span span;
    span.open("fused add+ln backward", ln_1_->path(), "module");
    signal(*ln_1_, ModulePhase::before_backward);
    if (input_grad()) {
      dx = ln_1_->backward_add(dh1, dx1, ctx);
    } else {
      ln_1_->backward(dh1, ctx);  // its parameters' gradients only
    }
    ln_1_->report_ready(ctx);
    signal(*ln_1_, ModulePhase::after_backward);
  }
  attn_residual_->report_ready(ctx);
  signal(*attn_residual_, ModulePhase::after_backward);
  return dx;
}

}  // namespace lockstep::engine
