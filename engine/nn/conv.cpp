// Conv2d (engine/nn/conv.h). The CUDA workspace of each pass comes from the
// stream-ordered pool, allocated on the op's stream right before the call, so
// it is freed (and reusable) as soon as the pass has run. Each pass is planned
// on the op's stream, where a new shape's algorithms are timed outside
// deterministic runs (Note [conv algorithm choice] in kernels/cuda/conv.cu).
#include "engine/nn/conv.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/dispatch.h"
#include "engine/nn/linear.h"

namespace lockstep::engine {
namespace {

std::string pair_str(std::int64_t h, std::int64_t w) {
  return h == w ? std::to_string(h) : std::to_string(h) + "x" + std::to_string(w);
}

}  // namespace

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size, Size2 stride,
               Size2 padding, Size2 dilation, std::int64_t groups, bool bias)
    : Module("Conv2d") {
  const std::string call = "Conv2d(" + std::to_string(in_channels) + ", " +
                           std::to_string(out_channels) + ", " +
                           pair_str(kernel_size.h, kernel_size.w) + ")";
  if (in_channels <= 0 || out_channels <= 0 || kernel_size.h <= 0 || kernel_size.w <= 0)
    throw InvalidArgument(call + ": channels and kernel size must be positive");
  if (stride.h <= 0 || stride.w <= 0 || dilation.h <= 0 || dilation.w <= 0 || padding.h < 0 ||
      padding.w < 0)
    throw InvalidArgument(call + ": stride " + pair_str(stride.h, stride.w) + " and dilation " +
                          pair_str(dilation.h, dilation.w) + " must be positive, padding " +
                          pair_str(padding.h, padding.w) + " not negative");
  if (groups <= 0 || in_channels % groups != 0 || out_channels % groups != 0)
    throw InvalidArgument(call + ": groups " + std::to_string(groups) +
                          " must divide both channel counts");
  config_.in_channels = in_channels;
  config_.out_channels = out_channels;
  config_.kernel_h = kernel_size.h;
  config_.kernel_w = kernel_size.w;
  config_.stride_h = stride.h;
  config_.stride_w = stride.w;
  config_.pad_h = padding.h;
  config_.pad_w = padding.w;
  config_.dilation_h = dilation.h;
  config_.dilation_w = dilation.w;
  config_.groups = groups;
  weight_ =
      &add_parameter("weight", {out_channels, in_channels / groups, kernel_size.h, kernel_size.w},
                     ParamRole::weight);
  weight_->lazy_zero_grad = true;  // Note [lazy zero_grad]
  if (bias) bias_ = &add_parameter("bias", {out_channels}, ParamRole::bias);
  initialize_when_built();  // Note [initialised when built]
}

void Conv2d::reset_parameters(core::Generator& rng) {
  const std::int64_t fan_in =
      config_.in_channels / config_.groups * config_.kernel_h * config_.kernel_w;
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  init_uniform(weight_->value, rng, bound);
  if (bias_) init_uniform(bias_->value, rng, bound);
}

kernels::Conv2dShape Conv2d::shape_for(const core::Tensor& x) const {
  kernels::Conv2dShape s = config_;
  const std::int64_t min_h =
      std::max<std::int64_t>(1, s.dilation_h * (s.kernel_h - 1) + 1 - 2 * s.pad_h);
  const std::int64_t min_w =
      std::max<std::int64_t>(1, s.dilation_w * (s.kernel_w - 1) + 1 - 2 * s.pad_w);
  // Note [channels-last layers]: the layout is the layer's setting; the shape must agree.
  const int c_axis = s.channels_last ? 3 : 1, h_axis = s.channels_last ? 1 : 2;
  if (x.shape().size() != 4 || x.dim(c_axis) != s.in_channels || x.dim(0) < 1 ||
      x.dim(h_axis) < min_h || x.dim(h_axis + 1) < min_w) {
    const std::string c = std::to_string(s.in_channels);
    shape_error(x, "expects " +
                       (s.channels_last ? "channels-last (NHWC) [batch, H, W, " + c + "]"
                                        : "NCHW [batch, " + c + ", H, W]") +
                       " with H >= " + std::to_string(min_h) +
                       " and W >= " + std::to_string(min_w) +
                       (s.channels_last ? " (in channels-last mode ChannelsLast gives the layers "
                                          "NHWC activations; check the previous layer's output "
                                          "channels)"
                                        : " (check the previous layer's output channels)"));
  }
  require_float(x, "input");
  if (!(x.device() == weight_->value.device()))
    throw InvalidArgument(describe() + ": input on " + x.device().str() + " but weight on " +
                          weight_->value.device().str() + " (move one of them)");
  s.batch = x.dim(0);
  s.in_h = x.dim(h_axis);
  s.in_w = x.dim(h_axis + 1);
  return s;
}

core::Shape Conv2d::output_shape(const kernels::Conv2dShape& s) const {
  if (s.channels_last) return {s.batch, s.out_h(), s.out_w(), s.out_channels};
  return {s.batch, s.out_channels, s.out_h(), s.out_w()};
}

core::Tensor Conv2d::forward(const core::Tensor& x, Context& ctx) {
  const kernels::Conv2dShape s = shape_for(x);
  const DType type = ctx.autocast.value_or(DType::f32);
  const core::Tensor input = x.dtype() == type ? x : x.cast(type, ctx.stream);
  const core::Tensor& w = low_weight_.get(*weight_, type, ctx.stream);
  core::Tensor y = core::Tensor::empty(output_shape(s), type, x.device(), ctx.stream);
  const float* b = bias_ ? bias_->value.data_as<float>() : nullptr;
  core::dispatch(
      x.device(), ctx.stream,
      [&] { kernels::cpu::conv2d_forward(s, type, input.data(), w.data(), b, y.data()); },
      [&](kernels::CudaStream stream) {
        const std::size_t bytes = kernels::cuda::conv2d_workspace_bytes(
            s, type, kernels::cuda::ConvPass::forward, stream);
        const core::Tensor workspace = core::Tensor::empty({static_cast<std::int64_t>(bytes)},
                                                           DType::u8, x.device(), ctx.stream);
        kernels::cuda::conv2d_forward(s, type, input.data(), w.data(), b, y.data(),
                                      workspace.data(), bytes, stream);
      });
  input_ = keeps_for_backward(ctx) ? input : core::Tensor();
  input_dtype_ = x.dtype();
  return y;
}

core::Tensor Conv2d::backward(const core::Tensor& dy, Context& ctx) {
  if (!input_.defined()) no_forward_error();
  const kernels::Conv2dShape s = shape_for(input_);
  check_gradient(dy, output_shape(s), input_.device());
  const DType type = input_.dtype();
  const core::Tensor g = dy.dtype() == type ? dy : dy.cast(type, ctx.stream);
  const core::Tensor& w = low_weight_.get(*weight_, type, ctx.stream);
  const bool want_dx = input_grad();  // the first layer of a model needs no dx
  core::Tensor dx =
      want_dx ? core::Tensor::empty(input_.shape(), type, g.device(), ctx.stream) : core::Tensor();
  // accumulate_grad before the pointer is taken: under ZeRO-2 and ZeRO-3 it
  // gives the gradient its storage (Note [transient gradients]); until then
  // `grad` is undefined, with no data to point at.
  const bool accumulate =
      weight_->requires_grad && accumulate_grad(*weight_);  // Note [lazy zero_grad]
  float* dw = weight_->requires_grad ? weight_->grad.data_as<float>() : nullptr;
  float* db = bias_ && bias_->requires_grad ? grad_to_add(*bias_, ctx.stream) : nullptr;
  const std::int64_t spatial = s.out_h() * s.out_w();
  core::dispatch(
      g.device(), ctx.stream,
      [&] {
        if (dw)
          kernels::cpu::conv2d_backward_filter(s, type, input_.data(), g.data(), dw, accumulate);
        if (db && s.channels_last)
          kernels::cpu::channel_bias_grad_nhwc(g.data(), type, s.batch, spatial, s.out_channels,
                                               db);
        else if (db)
          kernels::cpu::channel_bias_grad(g.data(), type, s.batch, s.out_channels, spatial, db);
        if (want_dx) kernels::cpu::conv2d_backward_data(s, type, g.data(), w.data(), dx.data());
      },
      [&](kernels::CudaStream stream) {
        using kernels::cuda::ConvPass;
        if (dw) {
          const std::size_t bytes =
              kernels::cuda::conv2d_workspace_bytes(s, type, ConvPass::backward_filter, stream);
          const core::Tensor workspace = core::Tensor::empty({static_cast<std::int64_t>(bytes)},
                                                             DType::u8, g.device(), ctx.stream);
          kernels::cuda::conv2d_backward_filter(s, type, input_.data(), g.data(), dw, accumulate,
                                                workspace.data(), bytes, stream);
        }
        if (db && s.channels_last) {
          const std::size_t bytes = kernels::cuda::channel_bias_grad_nhwc_workspace_bytes(
              s.batch, spatial, s.out_channels);
          const core::Tensor workspace = core::Tensor::empty({static_cast<std::int64_t>(bytes)},
                                                             DType::u8, g.device(), ctx.stream);
          kernels::cuda::channel_bias_grad_nhwc(g.data(), type, s.batch, spatial, s.out_channels,
                                                db, workspace.data(), stream);
        } else if (db) {
          kernels::cuda::channel_bias_grad(g.data(), type, s.batch, s.out_channels, spatial, db,
                                           stream);
        }
        if (!want_dx) return;
        const std::size_t bytes =
            kernels::cuda::conv2d_workspace_bytes(s, type, ConvPass::backward_data, stream);
        const core::Tensor workspace = core::Tensor::empty({static_cast<std::int64_t>(bytes)},
                                                           DType::u8, g.device(), ctx.stream);
        kernels::cuda::conv2d_backward_data(s, type, g.data(), w.data(), dx.data(),
                                            workspace.data(), bytes, stream);
      });
  input_ = core::Tensor();
  if (!want_dx) return dx;
  return dx.dtype() == input_dtype_ ? dx : dx.cast(input_dtype_, ctx.stream);
}

}  // namespace lockstep::engine
