// Sequential and Residual (engine/nn/containers.h).
#include "engine/nn/containers.h"

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "kernels/activation.h"
#include "kernels/fusion.h"

namespace lockstep::engine {

Sequential& Sequential::add(std::unique_ptr<Module> child) {
  return add(std::to_string(unnamed_), std::move(child));
}

Sequential& Sequential::add(const std::string& name, std::unique_ptr<Module> child) {
  add_child(name, std::move(child));
  ++unnamed_;
  set_input_grad(input_grad());
  return *this;
}

// Child i must return dx when this container must, or when a child before it
// has trainable parameters (whose gradients need that dx).
void Sequential::set_input_grad(bool on) {
  Module::set_input_grad(on);
  bool needed = on;
  for (Module* child : children()) {
    child->set_input_grad(needed);
    needed = needed || !child->ready_order().empty();
  }
}

// Note [module spans]: a root Sequential's children are the model's
// top-level modules, so their forward and backward are timeline spans
// ("forward fc1"); deeper modules are not, to keep traces small, except the
// children of a Sequential told to trace_children() (GPT's blocks, whose
// parent is no Sequential; GPT spans its own parts and the step its loss). On
// a GPU the span times the host's launches, and its twin on the stream's
// track the kernels (trace::Span with a stream).
core::Tensor Sequential::forward(const core::Tensor& x, Context& ctx) {
  return forward_range(x, ctx, 0, children().size());
}

core::Tensor Sequential::forward_range(const core::Tensor& x, Context& ctx, std::size_t begin,
                                       std::size_t end) {
  core::Tensor h = x;
  const std::vector<Module*> chain = children();
  const bool spans = path().empty() || trace_children_;  // Note [module spans]
  for (std::size_t i = begin; i < end; ++i) {
    Module* child = chain[i];
    core::trace::Span span;
    if (spans) span.open("forward", child->path(), "module", &ctx.stream);
    if (ctx.on_module) ctx.on_module(*child, ModulePhase::before_forward);
    h = child->forward(h, ctx);
    if (ctx.on_module) ctx.on_module(*child, ModulePhase::after_forward);
  }
  return h;
}

core::Tensor Sequential::backward(const core::Tensor& dy, Context& ctx) {
  return backward_range(dy, ctx, 0, children().size());
}

core::Tensor Sequential::backward_range(const core::Tensor& dy, Context& ctx, std::size_t begin,
                                        std::size_t end) {
  core::Tensor g = dy;
  const std::vector<Module*> chain = children();
  const bool spans = path().empty() || trace_children_;  // Note [module spans]
  for (std::size_t i = end; i > begin; --i) {
    Module* child = chain[i - 1];
    core::trace::Span span;
    if (spans) span.open("backward", child->path(), "module", &ctx.stream);
    if (ctx.on_module) ctx.on_module(*child, ModulePhase::before_backward);
    g = child->backward(g, ctx);
    child->report_ready(ctx);
    if (ctx.on_module) ctx.on_module(*child, ModulePhase::after_backward);
    if (!g.defined()) break;  // the children before need no gradient (set_input_grad)
  }
  return g;
}

Residual::Residual(std::unique_ptr<Sequential> inner, std::unique_ptr<Module> shortcut,
                   const std::string& shortcut_name, bool relu_after_add)
    : Module("Residual"), relu_after_add_(relu_after_add) {
  inner_ = static_cast<Sequential*>(&add_child("", std::move(inner)));
  shortcut_ = shortcut ? &add_child(shortcut_name, std::move(shortcut)) : nullptr;
}

// Note [fused block end]: on CUDA a Residual with relu_after_add whose inner
// branch ends in a BatchNorm2d without activation (torchvision's bn2 of a
// BasicBlock, bn3 of a Bottleneck) runs that BatchNorm as forward_add_relu:
// y = relu(bn(h) + shortcut(x)) in one pass in h's type (Note [fused
// batchnorm] in kernels/batchnorm.h), with no separate add and ReLU passes and
// no f32 round trip; its backward gives the shortcut's gradient and the
// BatchNorm's input gradient in one pass. Taken when x is on a GPU and the
// shortcut's output has h's shape and type; otherwise the last BatchNorm runs
// alone and the unfused add and ReLU follow. The shortcut then runs before the
// last BatchNorm rather than after the whole branch: the two are independent,
// so the values are the same. The CPU takes the unfused path in the order it
// always had (its bits), and the module tree, names and state_dict are the
// same either way.
BatchNorm2d* Residual::block_end_batchnorm() const {
  if (!relu_after_add_) return nullptr;
  const std::vector<Module*> chain = inner_->children();
  auto* bn = chain.empty() ? nullptr : dynamic_cast<BatchNorm2d*>(chain.back());
  return bn && bn->activation() == BatchNormActivation::none ? bn : nullptr;
}

core::Tensor Residual::forward(const core::Tensor& x, Context& ctx) {
  fused_ = false;
  output_ = core::Tensor();
  BatchNorm2d* bn = block_end_batchnorm();
  if (!bn || !x.device().is_cuda() || !kernels::fused_kernels()) {
    core::Tensor a = inner_->forward(x, ctx);
    core::Tensor b = shortcut_ ? shortcut_->forward(x, ctx) : x;
    return add_and_relu(a, b, ctx);
  }
  const std::size_t last = inner_->children().size() - 1;
  core::Tensor h = inner_->forward_range(x, ctx, 0, last);
  core::Tensor b = shortcut_ ? shortcut_->forward(x, ctx) : x;
  if (h.shape() != b.shape() || h.dtype() != b.dtype())
    return add_and_relu(inner_->forward_range(h, ctx, last, last + 1), b, ctx);
  if (ctx.on_module) ctx.on_module(*bn, ModulePhase::before_forward);
  core::Tensor y = bn->forward_add_relu(h, b, ctx);
  if (ctx.on_module) ctx.on_module(*bn, ModulePhase::after_forward);
  fused_ = true;
  return y;
}

core::Tensor Residual::add_and_relu(const core::Tensor& a, const core::Tensor& b, Context& ctx) {
  if (a.shape() != b.shape())
    throw InvalidArgument(describe() + ": inner branch gives " + core::shape_str(a.shape()) +
                          " but the shortcut gives " + core::shape_str(b.shape()) +
                          " (give the shortcut a downsample that matches)");
  // Mixed dtypes (a low-type branch under autocast over an f32 stream) add in
  // f32, as PyTorch's type promotion does, so the residual stream stays f32.
  const DType type = a.dtype() == b.dtype() ? a.dtype() : DType::f32;
  core::Tensor y = core::Tensor::empty(a.shape(), type, a.device(), ctx.stream);
  core::ops::add(a.dtype() == type ? a : a.cast(type, ctx.stream),
                 b.dtype() == type ? b : b.cast(type, ctx.stream), y, ctx.stream);
  if (relu_after_add_) {
    activation_forward(kernels::Activation::relu, y, y, ctx.stream);
    if (keeps_for_backward(ctx)) output_ = y;
  }
  return y;
}

core::Tensor Residual::backward(const core::Tensor& dy, Context& ctx) {
  if (fused_) {  // Note [fused block end]
    BatchNorm2d* bn = block_end_batchnorm();
    const std::size_t last = inner_->children().size() - 1;
    if (ctx.on_module) ctx.on_module(*bn, ModulePhase::before_backward);
    core::Tensor d_identity;
    core::Tensor dh = bn->backward_add_relu(dy, ctx, d_identity);
    bn->report_ready(ctx);
    if (ctx.on_module) ctx.on_module(*bn, ModulePhase::after_backward);
    return backward_branches(inner_->backward_range(dh, ctx, 0, last), d_identity, ctx);
  }
  core::Tensor g = dy;
  if (relu_after_add_) {
    if (!output_.defined()) no_forward_error();
    const core::Tensor d =
        dy.dtype() == output_.dtype() ? dy : dy.cast(output_.dtype(), ctx.stream);
    g = core::Tensor::empty(d.shape(), d.dtype(), d.device(), ctx.stream);
    core::dispatch(
        g.device(), ctx.stream,
        [&] {
          kernels::cpu::activation_backward(kernels::Activation::relu, d.data(), output_.data(),
                                            g.data(), g.dtype(), g.numel());
        },
        [&](kernels::CudaStream s) {
          kernels::cuda::activation_backward(kernels::Activation::relu, d.data(), output_.data(),
                                             g.data(), g.dtype(), g.numel(), s);
        });
    output_ = core::Tensor();
  }
  return backward_branches(inner_->backward(g, ctx), g, ctx);
}

core::Tensor Residual::backward_branches(const core::Tensor& dx_inner, const core::Tensor& g_short,
                                         Context& ctx) {
  const core::Tensor& dx = dx_inner;
  inner_->report_ready(ctx);
  core::Tensor d_short = g_short;
  if (shortcut_) {
    d_short = shortcut_->backward(g_short, ctx);
    shortcut_->report_ready(ctx);
  }
  if (!input_grad()) return core::Tensor();
  core::Tensor sum = core::Tensor::empty(dx.shape(), dx.dtype(), dx.device(), ctx.stream);
  core::ops::add(dx, d_short.dtype() == dx.dtype() ? d_short : d_short.cast(dx.dtype(), ctx.stream),
                 sum, ctx.stream);
  return sum;
}

void Residual::set_input_grad(bool on) {
  Module::set_input_grad(on);
  inner_->set_input_grad(on);
  if (shortcut_) shortcut_->set_input_grad(on);
}

void Residual::append_ready_order(std::vector<Parameter*>& out) {
  inner_->append_ready_order(out);
  if (shortcut_) shortcut_->append_ready_order(out);
}

}  // namespace lockstep::engine
