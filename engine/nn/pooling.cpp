// MaxPool2d, AvgPool2d and GlobalAvgPool2d (engine/nn/pooling.h).
#include "engine/nn/pooling.h"

#include <algorithm>
#include <string>

#include "engine/core/dispatch.h"

namespace lockstep::engine {
namespace {

kernels::Pool2dShape make_config(const std::string& layer, Size2 kernel, Size2 stride,
                                 Size2 padding) {
  kernels::Pool2dShape s;
  s.kernel_h = kernel.h;
  s.kernel_w = kernel.w;
  s.stride_h = stride.h;
  s.stride_w = stride.w;
  s.pad_h = padding.h;
  s.pad_w = padding.w;
  if (s.kernel_h <= 0 || s.kernel_w <= 0 || s.stride_h <= 0 || s.stride_w <= 0)
    throw InvalidArgument(layer + ": kernel size " + std::to_string(s.kernel_h) + "x" +
                          std::to_string(s.kernel_w) + " and stride " + std::to_string(s.stride_h) +
                          "x" + std::to_string(s.stride_w) + " must be positive");
  if (s.pad_h < 0 || s.pad_w < 0 || 2 * s.pad_h > s.kernel_h || 2 * s.pad_w > s.kernel_w)
    throw InvalidArgument(layer + ": padding " + std::to_string(s.pad_h) + "x" +
                          std::to_string(s.pad_w) + " must be at most half the kernel " +
                          std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w));
  return s;
}

// Smallest input sizes that give one output.
std::int64_t min_h(const kernels::Pool2dShape& s) {
  return std::max<std::int64_t>(1, s.kernel_h - 2 * s.pad_h);
}
std::int64_t min_w(const kernels::Pool2dShape& s) {
  return std::max<std::int64_t>(1, s.kernel_w - 2 * s.pad_w);
}

// Note [channels-last layers]: the layout is the layer's setting (s.channels_last).
int channel_axis(const kernels::Pool2dShape& s) { return s.channels_last ? 3 : 1; }
int height_axis(const kernels::Pool2dShape& s) { return s.channels_last ? 1 : 2; }

bool fits(const core::Tensor& x, const kernels::Pool2dShape& s) {
  const int h = height_axis(s);
  return x.shape().size() == 4 && x.dim(0) >= 1 && x.dim(channel_axis(s)) >= 1 &&
         x.dim(h) >= min_h(s) && x.dim(h + 1) >= min_w(s);
}

std::string layout_str(bool channels_last) {
  return channels_last ? "channels-last (NHWC) [batch, H, W, channels]"
                       : "NCHW [batch, channels, H, W]";
}

std::string expectation(const kernels::Pool2dShape& s) {
  return "expects " + layout_str(s.channels_last) + " with H >= " + std::to_string(min_h(s)) +
         " and W >= " + std::to_string(min_w(s));
}

kernels::Pool2dShape with_input(kernels::Pool2dShape s, const core::Tensor& x) {
  s.batch = x.dim(0);
  s.channels = x.dim(channel_axis(s));
  s.in_h = x.dim(height_axis(s));
  s.in_w = x.dim(height_axis(s) + 1);
  return s;
}

// The output gradient in the input's dtype, after checking its shape and device.
core::Tensor gradient_in(const Module& m, const core::Tensor& dy, const core::Shape& expected,
                         const PoolRecord& input, const core::Stream& stream) {
  m.check_gradient(dy, expected, input.device);
  m.require_float(dy, "gradient");
  return dy.dtype() == input.dtype ? dy : dy.cast(input.dtype, stream);
}

core::Shape input_shape(const kernels::Pool2dShape& s) {
  if (s.channels_last) return {s.batch, s.in_h, s.in_w, s.channels};
  return {s.batch, s.channels, s.in_h, s.in_w};
}

core::Shape output_shape(const kernels::Pool2dShape& s) {
  if (s.channels_last) return {s.batch, s.out_h(), s.out_w(), s.channels};
  return {s.batch, s.channels, s.out_h(), s.out_w()};
}

std::optional<PoolRecord> record(bool training, const kernels::Pool2dShape& s,
                                 const core::Tensor& x) {
  if (!training) return std::nullopt;
  return PoolRecord{s, x.dtype(), x.device()};
}

}  // namespace

MaxPool2d::MaxPool2d(Size2 kernel_size, Size2 stride, Size2 padding)
    : Module("MaxPool2d"), config_(make_config("MaxPool2d", kernel_size, stride, padding)) {}

core::Tensor MaxPool2d::forward(const core::Tensor& x, Context& ctx) {
  if (!fits(x, config_)) shape_error(x, expectation(config_));
  require_float(x, "input");
  const kernels::Pool2dShape s = with_input(config_, x);
  core::Tensor y = core::Tensor::empty(output_shape(s), x.dtype(), x.device(), ctx.stream);
  core::Tensor argmax;
  const bool keep = keeps_for_backward(ctx);
  if (keep) argmax = core::Tensor::empty(output_shape(s), DType::i32, x.device(), ctx.stream);
  std::int32_t* indices = keep ? argmax.data_as<std::int32_t>() : nullptr;
  core::dispatch(
      x.device(), ctx.stream,
      [&] { kernels::cpu::max_pool2d_forward(s, x.dtype(), x.data(), y.data(), indices); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::max_pool2d_forward(s, x.dtype(), x.data(), y.data(), indices, stream);
      });
  argmax_ = argmax;
  pending_ = record(keep, s, x);
  return y;
}

core::Tensor MaxPool2d::backward(const core::Tensor& dy, Context& ctx) {
  if (!pending_) no_forward_error();
  const kernels::Pool2dShape s = pending_->shape;
  const DType type = pending_->dtype;
  const core::Tensor g = gradient_in(*this, dy, output_shape(s), *pending_, ctx.stream);
  core::Tensor dx = core::Tensor::empty(input_shape(s), type, g.device(), ctx.stream);
  const std::int32_t* indices = argmax_.data_as<std::int32_t>();
  core::dispatch(
      g.device(), ctx.stream,
      [&] { kernels::cpu::max_pool2d_backward(s, type, g.data(), indices, dx.data()); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::max_pool2d_backward(s, type, g.data(), indices, dx.data(), stream);
      });
  pending_.reset();
  argmax_ = core::Tensor();
  return dx;
}

AvgPool2d::AvgPool2d(Size2 kernel_size, Size2 stride, Size2 padding, bool count_include_pad)
    : Module("AvgPool2d"),
      config_(make_config("AvgPool2d", kernel_size, stride, padding)),
      count_include_pad_(count_include_pad) {}

core::Tensor AvgPool2d::forward(const core::Tensor& x, Context& ctx) {
  if (!fits(x, config_)) shape_error(x, expectation(config_));
  require_float(x, "input");
  const kernels::Pool2dShape s = with_input(config_, x);
  core::Tensor y = core::Tensor::empty(output_shape(s), x.dtype(), x.device(), ctx.stream);
  core::dispatch(
      x.device(), ctx.stream,
      [&] {
        kernels::cpu::avg_pool2d_forward(s, x.dtype(), count_include_pad_, x.data(), y.data());
      },
      [&](kernels::CudaStream stream) {
        kernels::cuda::avg_pool2d_forward(s, x.dtype(), count_include_pad_, x.data(), y.data(),
                                          stream);
      });
  pending_ = record(keeps_for_backward(ctx), s, x);
  return y;
}

core::Tensor AvgPool2d::backward(const core::Tensor& dy, Context& ctx) {
  if (!pending_) no_forward_error();
  const kernels::Pool2dShape s = pending_->shape;
  const DType type = pending_->dtype;
  const core::Tensor g = gradient_in(*this, dy, output_shape(s), *pending_, ctx.stream);
  core::Tensor dx = core::Tensor::empty(input_shape(s), type, g.device(), ctx.stream);
  core::dispatch(
      g.device(), ctx.stream,
      [&] { kernels::cpu::avg_pool2d_backward(s, type, count_include_pad_, g.data(), dx.data()); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::avg_pool2d_backward(s, type, count_include_pad_, g.data(), dx.data(),
                                           stream);
      });
  pending_.reset();
  return dx;
}

// Channels-last: x is [batch, spatial, channels] to the NHWC kernels, whose
// y [batch, channels] is [batch, channels, 1, 1] (Note [channels-last pooling]
// in kernels/pooling.h: the same bits as the plane form).
core::Tensor GlobalAvgPool2d::forward(const core::Tensor& x, Context& ctx) {
  if (x.shape().size() != 4 || x.numel() == 0)
    shape_error(x, "expects " + layout_str(channels_last_));
  require_float(x, "input");
  kernels::Pool2dShape config;
  config.channels_last = channels_last_;
  const kernels::Pool2dShape s = with_input(config, x);
  const std::int64_t planes = s.batch * s.channels, spatial = s.in_h * s.in_w;
  core::Tensor y =
      core::Tensor::empty({s.batch, s.channels, 1, 1}, x.dtype(), x.device(), ctx.stream);
  core::dispatch(
      x.device(), ctx.stream,
      [&] {
        if (s.channels_last)
          kernels::cpu::global_avg_pool_nhwc_forward(x.dtype(), s.batch, spatial, s.channels,
                                                     x.data(), y.data());
        else
          kernels::cpu::global_avg_pool_forward(x.dtype(), planes, spatial, x.data(), y.data());
      },
      [&](kernels::CudaStream stream) {
        if (s.channels_last)
          kernels::cuda::global_avg_pool_nhwc_forward(x.dtype(), s.batch, spatial, s.channels,
                                                      x.data(), y.data(), stream);
        else
          kernels::cuda::global_avg_pool_forward(x.dtype(), planes, spatial, x.data(), y.data(),
                                                 stream);
      });
  pending_ = record(keeps_for_backward(ctx), s, x);
  return y;
}

core::Tensor GlobalAvgPool2d::backward(const core::Tensor& dy, Context& ctx) {
  if (!pending_) no_forward_error();
  const kernels::Pool2dShape s = pending_->shape;
  const DType type = pending_->dtype;
  const core::Tensor g = gradient_in(*this, dy, {s.batch, s.channels, 1, 1}, *pending_, ctx.stream);
  const std::int64_t planes = s.batch * s.channels, spatial = s.in_h * s.in_w;
  core::Tensor dx = core::Tensor::empty(input_shape(s), type, g.device(), ctx.stream);
  core::dispatch(
      g.device(), ctx.stream,
      [&] {
        if (s.channels_last)
          kernels::cpu::global_avg_pool_nhwc_backward(type, s.batch, spatial, s.channels, g.data(),
                                                      dx.data());
        else
          kernels::cpu::global_avg_pool_backward(type, planes, spatial, g.data(), dx.data());
      },
      [&](kernels::CudaStream stream) {
        if (s.channels_last)
          kernels::cuda::global_avg_pool_nhwc_backward(type, s.batch, spatial, s.channels, g.data(),
                                                       dx.data(), stream);
        else
          kernels::cuda::global_avg_pool_backward(type, planes, spatial, g.data(), dx.data(),
                                                  stream);
      });
  pending_.reset();
  return dx;
}

}  // namespace lockstep::engine
