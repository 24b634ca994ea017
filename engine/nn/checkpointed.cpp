// Checkpointed (engine/nn/checkpointed.h): Note [activation checkpointing].
#include "engine/nn/checkpointed.h"

#include "kernels/error.h"

namespace lockstep::engine {

Checkpointed::Checkpointed(std::unique_ptr<Module> inner) : Module("Checkpointed") {
  if (!inner) throw InvalidArgument("Checkpointed: the module to checkpoint is null");
  inner_ = &add_child("", std::move(inner));
}

core::Tensor Checkpointed::forward(const core::Tensor& x, Context& ctx) {
  input_ = core::Tensor();
  // Eval, or inside another checkpoint's first pass: nothing to keep here either.
  if (!keeps_for_backward(ctx)) return inner_->forward(x, ctx);
  Context first = ctx;
  first.keep_for_backward = false;
  core::Tensor y = inner_->forward(x, first);
  input_ = x;
  forward_ctx_ = ctx;
  forward_ctx_.on_grad_ready = nullptr;
  return y;
}

core::Tensor Checkpointed::backward(const core::Tensor& dy, Context& ctx) {
  if (!input_.defined()) no_forward_error();
  Context again = forward_ctx_;
  again.stream = ctx.stream;
  again.recompute = true;
  inner_->forward(input_, again);  // the output is the first forward's, bit for bit
  input_ = core::Tensor();
  core::Tensor dx = inner_->backward(dy, ctx);
  inner_->report_ready(ctx);  // Note [grad-ready order]: the inner module's own parameters
  return dx;
}

void Checkpointed::set_input_grad(bool on) {
  Module::set_input_grad(on);
  inner_->set_input_grad(on);
}

}  // namespace lockstep::engine
