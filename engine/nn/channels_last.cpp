// ChannelsLast (engine/nn/channels_last.h): Note [channels-last layers].
#include "engine/nn/channels_last.h"

#include <string>

#include "engine/core/dispatch.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/checkpointed.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/pooling.h"
#include "kernels/error.h"
#include "kernels/layout.h"

namespace lockstep::engine {
namespace {

// Sets the spatial layers of `m`'s subtree to channels-last, in forward
// order, and checks that everything before the first GlobalAvgPool2d knows
// the layout. `pooled`: a GlobalAvgPool2d came before (the activations are
// [batch, channels, 1, 1] from there on, the same in either layout).
void set_layers(Module& m, bool& pooled) {
  if (auto* conv = dynamic_cast<Conv2d*>(&m)) {
    conv->set_channels_last(true);
    return;
  }
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&m)) {
    bn->set_channels_last(true);
    return;
  }
  if (auto* pool = dynamic_cast<MaxPool2d*>(&m)) {
    pool->set_channels_last(true);
    return;
  }
  if (auto* pool = dynamic_cast<AvgPool2d*>(&m)) {
    pool->set_channels_last(true);
    return;
  }
  if (auto* pool = dynamic_cast<GlobalAvgPool2d*>(&m)) {
    pool->set_channels_last(true);
    pooled = true;
    return;
  }
  if (dynamic_cast<ChannelsLast*>(&m))
    throw InvalidArgument("ChannelsLast: " + m.describe() +
                          " is a ChannelsLast already (wrap the model once)");
  if (dynamic_cast<Sequential*>(&m) || dynamic_cast<Residual*>(&m) ||
      dynamic_cast<Checkpointed*>(&m)) {
    for (Module* child : m.children()) set_layers(*child, pooled);
    return;
  }
  if (pooled || dynamic_cast<Activation*>(&m)) return;  // pointwise, or past the spatial part
  throw InvalidArgument("ChannelsLast: " + m.describe() +
                        " comes before any GlobalAvgPool2d, where the activations are NHWC, and "
                        "does not know that layout (before the global pool channels-last takes "
                        "Conv2d, BatchNorm2d, MaxPool2d, AvgPool2d, activations and the "
                        "containers, as resnet and resnet50 have; build this model without "
                        "channels-last)");
}

// x [n, c, h, w] -> [n, h, w, c], or back (to_nhwc false: x [n, h, w, c]).
core::Tensor transposed(const core::Tensor& x, bool to_nhwc, const core::Stream& stream) {
  const std::int64_t n = x.dim(0), c = to_nhwc ? x.dim(1) : x.dim(3);
  const std::int64_t h = to_nhwc ? x.dim(2) : x.dim(1), w = to_nhwc ? x.dim(3) : x.dim(2);
  const core::Shape shape = to_nhwc ? core::Shape{n, h, w, c} : core::Shape{n, c, h, w};
  core::Tensor y = core::Tensor::empty(shape, x.dtype(), x.device(), stream);
  core::dispatch(
      x.device(), stream,
      [&] {
        if (to_nhwc)
          kernels::cpu::nchw_to_nhwc(x.dtype(), n, c, h, w, x.data(), y.data());
        else
          kernels::cpu::nhwc_to_nchw(x.dtype(), n, c, h, w, x.data(), y.data());
      },
      [&](kernels::CudaStream s) {
        if (to_nhwc)
          kernels::cuda::nchw_to_nhwc(x.dtype(), n, c, h, w, x.data(), y.data(), s);
        else
          kernels::cuda::nhwc_to_nchw(x.dtype(), n, c, h, w, x.data(), y.data(), s);
      });
  return y;
}

}  // namespace

ChannelsLast::ChannelsLast(std::unique_ptr<Module> inner) : Module("ChannelsLast") {
  if (!inner) throw InvalidArgument("ChannelsLast: the module to wrap is null");
  inner_ = &add_child("", std::move(inner));
  bool pooled = false;
  set_layers(*inner_, pooled);
  image_output_ = !pooled;
}

core::Tensor ChannelsLast::forward(const core::Tensor& x, Context& ctx) {
  if (x.shape().size() != 4 || x.numel() == 0)
    shape_error(x,
                "expects an NCHW image batch [batch, channels, H, W] (its layers then run "
                "on NHWC)");
  core::Tensor y = inner_->forward(transposed(x, true, ctx.stream), ctx);
  output_transposed_ = image_output_ && y.shape().size() == 4;
  return output_transposed_ ? transposed(y, false, ctx.stream) : y;
}

core::Tensor ChannelsLast::backward(const core::Tensor& dy, Context& ctx) {
  if (output_transposed_ && dy.shape().size() != 4)
    throw InvalidArgument(describe() + ": gradient has shape " + core::shape_str(dy.shape()) +
                          ", expected the NCHW shape of forward's output");
  const core::Tensor dx =
      inner_->backward(output_transposed_ ? transposed(dy, true, ctx.stream) : dy, ctx);
  inner_->report_ready(ctx);  // Note [grad-ready order]: the inner module's own parameters
  if (!input_grad() || !dx.defined()) return core::Tensor();
  return transposed(dx, false, ctx.stream);
}

void ChannelsLast::set_input_grad(bool on) {
  Module::set_input_grad(on);
  inner_->set_input_grad(on);
}

}  // namespace lockstep::engine
