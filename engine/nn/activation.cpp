// ReLU, GELU, Dropout and Flatten (engine/nn/activation.h).
#include "engine/nn/activation.h"

#include <fmt/format.h>

#include <string>

#include "engine/core/dispatch.h"
#include "kernels/dropout.h"
#include "kernels/philox.h"

namespace lockstep::engine {

void activation_forward(kernels::Activation kind, const core::Tensor& x, core::Tensor& y,
                        const core::Stream& stream) {
  core::dispatch(
      x.device(), stream,
      [&] { kernels::cpu::activation_forward(kind, x.data(), y.data(), x.dtype(), x.numel()); },
      [&](kernels::CudaStream s) {
        kernels::cuda::activation_forward(kind, x.data(), y.data(), x.dtype(), x.numel(), s);
      });
}

core::Tensor Activation::forward(const core::Tensor& x, Context& ctx) {
  core::Tensor y = core::Tensor::empty(x.shape(), x.dtype(), x.device(), ctx.stream);
  activation_forward(kind_, x, y, ctx.stream);
  input_ = keeps_for_backward(ctx) ? x : core::Tensor();
  return y;
}

core::Tensor Activation::backward(const core::Tensor& dy, Context& ctx) {
  if (!input_.defined()) no_forward_error();
  check_gradient(dy, input_.shape(), input_.device());
  const core::Tensor g = dy.dtype() == input_.dtype() ? dy : dy.cast(input_.dtype(), ctx.stream);
  core::Tensor dx = core::Tensor::empty(g.shape(), g.dtype(), g.device(), ctx.stream);
  core::dispatch(
      g.device(), ctx.stream,
      [&] {
        kernels::cpu::activation_backward(kind_, g.data(), input_.data(), dx.data(), g.dtype(),
                                          g.numel());
      },
      [&](kernels::CudaStream s) {
        kernels::cuda::activation_backward(kind_, g.data(), input_.data(), dx.data(), g.dtype(),
                                           g.numel(), s);
      });
  input_ = core::Tensor();
  return dx;
}

namespace {
// FNV-1a over the layer's path and the step: the Philox stream id of a
// dropout layer's masks at one step (Note [dropout keys]).
std::uint64_t dropout_stream(const std::string& path, std::uint64_t step) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::uint8_t byte) { h = (h ^ byte) * 0x100000001b3ull; };
  for (char c : path) mix(static_cast<std::uint8_t>(c));
  for (int i = 0; i < 8; ++i) mix(static_cast<std::uint8_t>(step >> (8 * i)));
  return h;
}
}  // namespace

Dropout::Dropout(float p) : Module("Dropout"), p_(p) {
  if (!(p >= 0.0f && p < 1.0f))
    throw InvalidArgument("Dropout(p=" + std::to_string(p) + "): p must be in [0, 1)");
}

core::Tensor Dropout::forward(const core::Tensor& x, Context& ctx) {
  if (!training() || p_ == 0.0f) return x;
  if (x.shape().empty()) shape_error(x, "expects [batch, ...]");
  if (ctx.graph_capture)
    throw InvalidArgument(fmt::format(
        "{}: dropout p={} draws its masks from the step number, which a replayed CUDA graph "
        "cannot change (Note [step graph]); set dropout to 0 or turn the CUDA graph step off",
        describe(), p_));
  const std::int64_t per_sample = x.numel() / std::max<std::int64_t>(1, x.dim(0));
  const kernels::PhiloxKey key{ctx.seed, dropout_stream(path(), ctx.step)};
  const auto offset = static_cast<std::uint64_t>(ctx.first_sample * per_sample);
  // A checkpoint's first pass draws the mask and drops it; its recompute
  // draws the same bits again from the same keys (Note [activation checkpointing]).
  core::Tensor mask_tensor = core::Tensor::empty(x.shape(), DType::u8, x.device(), ctx.stream);
  mask_ = keeps_for_backward(ctx) ? mask_tensor : core::Tensor();
  core::Tensor y = core::Tensor::empty(x.shape(), x.dtype(), x.device(), ctx.stream);
  const float keep = 1.0f - p_, scale = 1.0f / keep;
  auto* mask = mask_tensor.data_as<std::uint8_t>();
  core::dispatch(
      x.device(), ctx.stream,
      [&] {
        kernels::cpu::bernoulli_mask(key, offset, mask, x.numel(), keep);
        kernels::cpu::apply_mask(x.data(), mask, y.data(), x.dtype(), x.numel(), scale);
      },
      [&](kernels::CudaStream s) {
        kernels::cuda::bernoulli_mask(key, offset, mask, x.numel(), keep, s);
        kernels::cuda::apply_mask(x.data(), mask, y.data(), x.dtype(), x.numel(), scale, s);
      });
  return y;
}

core::Tensor Dropout::backward(const core::Tensor& dy, Context& ctx) {
  if (p_ == 0.0f) return dy;
  if (!mask_.defined()) no_forward_error();
  check_gradient(dy, mask_.shape(), mask_.device());
  core::Tensor dx = core::Tensor::empty(dy.shape(), dy.dtype(), dy.device(), ctx.stream);
  const auto* mask = mask_.data_as<std::uint8_t>();
  const float scale = 1.0f / (1.0f - p_);
  core::dispatch(
      dy.device(), ctx.stream,
      [&] { kernels::cpu::apply_mask(dy.data(), mask, dx.data(), dy.dtype(), dy.numel(), scale); },
      [&](kernels::CudaStream s) {
        kernels::cuda::apply_mask(dy.data(), mask, dx.data(), dy.dtype(), dy.numel(), scale, s);
      });
  mask_ = core::Tensor();
  return dx;
}

core::Tensor Flatten::forward(const core::Tensor& x, Context& /*ctx*/) {
  if (x.shape().empty()) shape_error(x, "expects [batch, ...]");
  input_shape_ = x.shape();
  return x.reshape({x.dim(0), x.numel() / std::max<std::int64_t>(1, x.dim(0))});
}

core::Tensor Flatten::backward(const core::Tensor& dy, Context& /*ctx*/) {
  return dy.reshape(input_shape_);
}

}  // namespace lockstep::engine
