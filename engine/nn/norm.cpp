// LayerNorm (engine/nn/norm.h). Which kernel runs: Note [layernorm paths].
#include "engine/nn/norm.h"

#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "kernels/layernorm.h"

namespace lockstep::engine {

// Note [layernorm paths]: on the CPU every pass runs the f32 kernels on f32
// copies, and casts the results (y to the output type, dx to the input's
// type); forward_add and backward_add compose Residual's add with them. On
// CUDA the f32 kernels run when input and output are f32 (today's path, the
// same bits); otherwise the mixed-type kernels (Note [low-type LayerNorm] in
// kernels/layernorm.h) read each tensor in its own type, and forward_add and
// backward_add are one fused kernel each (plus the dgamma/dbeta sums). Both
// devices compute the same values to f32 rounding; the trace names the fused
// passes (GptBlock's spans).

LayerNorm::LayerNorm(std::int64_t features, float eps, bool affine)
    : Module("LayerNorm"), features_(features), eps_(eps) {
  if (features <= 0)
    throw InvalidArgument("LayerNorm(" + std::to_string(features) + "): features must be positive");
  if (affine) {
    weight_ = &add_parameter("weight", {features}, ParamRole::norm);
    bias_ = &add_parameter("bias", {features}, ParamRole::norm);
    weight_->value.fill_(1.0);
  }
}

void LayerNorm::reset_parameters(core::Generator& /*rng*/) {
  if (weight_) weight_->value.fill_(1.0);
  if (bias_) bias_->value.fill_(0.0);
}

DType LayerNorm::output_type(const Context& ctx) const {
  if (autocast_output_ && ctx.autocast &&
      (*ctx.autocast == DType::f16 || *ctx.autocast == DType::bf16))
    return *ctx.autocast;
  return DType::f32;
}

core::Tensor LayerNorm::forward(const core::Tensor& x, Context& ctx) {
  if (x.shape().empty() || x.dim(-1) != features_)
    shape_error(x, "expects a last dimension of " + std::to_string(features_));
  input_dtype_ = x.dtype();
  const DType out_type = output_type(ctx);
  // Note [layernorm paths]
  const bool mixed = x.device().is_cuda() && (x.dtype() != DType::f32 || out_type != DType::f32);
  const core::Tensor in = mixed || x.dtype() == DType::f32 ? x : x.cast(DType::f32, ctx.stream);
  const kernels::LayerNormShape s{x.numel() / features_, features_, eps_};
  core::Tensor y =
      core::Tensor::empty(x.shape(), mixed ? out_type : DType::f32, x.device(), ctx.stream);
  core::Tensor mean = core::Tensor::empty({s.rows}, DType::f32, x.device(), ctx.stream);
  core::Tensor rstd = core::Tensor::empty({s.rows}, DType::f32, x.device(), ctx.stream);
  const float* gamma = weight_ ? weight_->value.data_as<float>() : nullptr;
  const float* beta = bias_ ? bias_->value.data_as<float>() : nullptr;
  float *pm = mean.data_as<float>(), *pr = rstd.data_as<float>();
  core::dispatch(
      x.device(), ctx.stream,
      [&] {
        kernels::cpu::layernorm_forward(s, in.data_as<float>(), gamma, beta, y.data_as<float>(), pm,
                                        pr);
      },
      [&](kernels::CudaStream stream) {
        if (mixed) {
          kernels::cuda::layernorm_forward_mixed(s, in.data(), in.dtype(), gamma, beta, y.data(),
                                                 y.dtype(), pm, pr, stream);
        } else {
          kernels::cuda::layernorm_forward(s, in.data_as<float>(), gamma, beta, y.data_as<float>(),
                                           pm, pr, stream);
        }
      });
  if (keeps_for_backward(ctx)) {
    input_ = in;
    mean_ = mean;
    rstd_ = rstd;
  }
  return y.dtype() == out_type ? y : y.cast(out_type, ctx.stream);
}

core::Tensor LayerNorm::backward(const core::Tensor& dy, Context& ctx) {
  return input_grad_of(dy, core::Tensor(), ctx);
}

LayerNorm::AddOutput LayerNorm::forward_add(const core::Tensor& residual,
                                            const core::Tensor& branch, Context& ctx) {
  if (residual.dtype() != DType::f32)
    throw InvalidArgument(describe() + ": forward_add takes the residual stream in f32, not " +
                          dtype_name(residual.dtype()) + " (add in the stream's type first)");
  if (branch.shape() != residual.shape() || !(branch.device() == residual.device()))
    throw InvalidArgument(describe() + ": the branch gives " + core::shape_str(branch.shape()) +
                          " on " + branch.device().str() + " but the residual stream is " +
                          core::shape_str(residual.shape()) + " on " + residual.device().str() +
                          " (the branch must return its input's shape)");
  require_float(branch, "branch");
  if (!residual.device().is_cuda()) {
    // Note [layernorm paths]: Residual::forward's add, then forward.
    core::Tensor sum =
        core::Tensor::empty(residual.shape(), DType::f32, residual.device(), ctx.stream);
    core::ops::add(branch.dtype() == DType::f32 ? branch : branch.cast(DType::f32, ctx.stream),
                   residual, sum, ctx.stream);
    core::Tensor y = forward(sum, ctx);
    return {sum, y};
  }
  if (residual.shape().empty() || residual.dim(-1) != features_)
    shape_error(residual, "expects a last dimension of " + std::to_string(features_));
  input_dtype_ = DType::f32;
  const DType out_type = output_type(ctx);
  const kernels::LayerNormShape s{residual.numel() / features_, features_, eps_};
  const core::Device device = residual.device();
  core::Tensor sum = core::Tensor::empty(residual.shape(), DType::f32, device, ctx.stream);
  core::Tensor y = core::Tensor::empty(residual.shape(), out_type, device, ctx.stream);
  core::Tensor mean = core::Tensor::empty({s.rows}, DType::f32, device, ctx.stream);
  core::Tensor rstd = core::Tensor::empty({s.rows}, DType::f32, device, ctx.stream);
  const float* gamma = weight_ ? weight_->value.data_as<float>() : nullptr;
  const float* beta = bias_ ? bias_->value.data_as<float>() : nullptr;
  core::dispatch(
      device, ctx.stream, [] {},
      [&](kernels::CudaStream stream) {
        kernels::cuda::add_layernorm_forward(s, residual.data_as<float>(), branch.data(),
                                             branch.dtype(), gamma, beta, sum.data_as<float>(),
                                             y.data(), out_type, mean.data_as<float>(),
                                             rstd.data_as<float>(), stream);
      });
  if (keeps_for_backward(ctx)) {
    input_ = sum;
    mean_ = mean;
    rstd_ = rstd;
  }
  return {sum, y};
}

core::Tensor LayerNorm::backward_add(const core::Tensor& dy, const core::Tensor& dstream,
                                     Context& ctx) {
  if (!dstream.defined() || dstream.dtype() != DType::f32)
    throw InvalidArgument(describe() + ": backward_add takes the residual stream's gradient in " +
                          "f32 (the stream's type)");
  return input_grad_of(dy, dstream, ctx);
}

core::Tensor LayerNorm::input_grad_of(const core::Tensor& dy, const core::Tensor& dstream,
                                      Context& ctx) {
  if (!input_.defined()) no_forward_error();
  for (const core::Tensor* g : {&dy, &dstream})
    if (g->defined() && (g->numel() != input_.numel() || !(g->device() == input_.device())))
      check_gradient(*g, input_.shape(), input_.device());  // throws, naming both
  const kernels::LayerNormShape s{input_.numel() / features_, features_, eps_};
  const core::Device device = input_.device();
  const float* gamma = weight_ ? weight_->value.data_as<float>() : nullptr;
  float* dgamma = weight_ && weight_->requires_grad ? grad_to_add(*weight_, ctx.stream) : nullptr;
  float* dbeta = bias_ && bias_->requires_grad ? grad_to_add(*bias_, ctx.stream) : nullptr;
  const float *pm = mean_.data_as<float>(), *pr = rstd_.data_as<float>();
  // Note [layernorm paths]
  const bool mixed = device.is_cuda() && (dstream.defined() || dy.dtype() != DType::f32 ||
                                          input_.dtype() != DType::f32);
  core::Tensor dx;
  if (mixed) {
    dx = core::Tensor::empty(input_.shape(), input_.dtype(), device, ctx.stream);
    core::dispatch(
        device, ctx.stream, [] {},
        [&](kernels::CudaStream stream) {
          const auto bytes = static_cast<std::int64_t>(
              dgamma || dbeta ? kernels::cuda::layernorm_backward_workspace_bytes(s) : 0);
          core::Tensor workspace = core::Tensor::empty({bytes}, DType::u8, device, ctx.stream);
          kernels::cuda::layernorm_backward_mixed(
              s, dy.data(), dy.dtype(), input_.data(), input_.dtype(), pm, pr, gamma,
              dstream.defined() ? dstream.data_as<float>() : nullptr, dx.data(), dgamma, dbeta,
              workspace.data(), stream);
        });
  } else {
    const core::Tensor g = dy.dtype() == DType::f32 ? dy : dy.cast(DType::f32, ctx.stream);
    dx = core::Tensor::empty(input_.shape(), DType::f32, device, ctx.stream);
    const float *pdy = g.data_as<float>(), *px = input_.data_as<float>();
    float* pdx = dx.data_as<float>();
    core::dispatch(
        device, ctx.stream,
        [&] { kernels::cpu::layernorm_backward(s, pdy, px, pm, pr, gamma, pdx, dgamma, dbeta); },
        [&](kernels::CudaStream stream) {
          const auto bytes = static_cast<std::int64_t>(
              dgamma || dbeta ? kernels::cuda::layernorm_backward_workspace_bytes(s) : 0);
          core::Tensor workspace = core::Tensor::empty({bytes}, DType::u8, device, ctx.stream);
          kernels::cuda::layernorm_backward(s, pdy, px, pm, pr, gamma, pdx, dgamma, dbeta,
                                            workspace.data(), stream);
        });
    if (input_dtype_ != DType::f32) dx = dx.cast(input_dtype_, ctx.stream);
    if (dstream.defined()) {
      // Note [layernorm paths]: Residual::backward's add (the inner branch's dx first).
      core::Tensor sum = core::Tensor::empty(dx.shape(), DType::f32, device, ctx.stream);
      core::ops::add(dx, dstream, sum, ctx.stream);
      dx = sum;
    }
  }
  input_ = mean_ = rstd_ = core::Tensor();
  return dx;
}

}  // namespace lockstep::engine
