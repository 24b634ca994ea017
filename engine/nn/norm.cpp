// LayerNorm (engine/nn/norm.h).
#include "engine/nn/norm.h"

#include <string>

#include "engine/core/dispatch.h"
#include "kernels/layernorm.h"

namespace lockstep::engine {

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

core::Tensor LayerNorm::forward(const core::Tensor& x, Context& ctx) {
  if (x.shape().empty() || x.dim(-1) != features_)
    shape_error(x, "expects a last dimension of " + std::to_string(features_));
  input_dtype_ = x.dtype();
  const core::Tensor x32 = x.dtype() == DType::f32 ? x : x.cast(DType::f32, ctx.stream);
  const kernels::LayerNormShape s{x.numel() / features_, features_, eps_};
  core::Tensor y = core::Tensor::empty(x.shape(), DType::f32, x.device(), ctx.stream);
  core::Tensor mean = core::Tensor::empty({s.rows}, DType::f32, x.device(), ctx.stream);
  core::Tensor rstd = core::Tensor::empty({s.rows}, DType::f32, x.device(), ctx.stream);
  const float* gamma = weight_ ? weight_->value.data_as<float>() : nullptr;
  const float* beta = bias_ ? bias_->value.data_as<float>() : nullptr;
  const float* in = x32.data_as<float>();
  float *out = y.data_as<float>(), *pm = mean.data_as<float>(), *pr = rstd.data_as<float>();
  core::dispatch(
      x.device(), ctx.stream,
      [&] { kernels::cpu::layernorm_forward(s, in, gamma, beta, out, pm, pr); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::layernorm_forward(s, in, gamma, beta, out, pm, pr, stream);
      });
  if (keeps_for_backward(ctx)) {
    input_ = x32;
    mean_ = mean;
    rstd_ = rstd;
  }
  return y;
}

core::Tensor LayerNorm::backward(const core::Tensor& dy, Context& ctx) {
  if (!input_.defined()) no_forward_error();
  const core::Tensor g = dy.dtype() == DType::f32 ? dy : dy.cast(DType::f32, ctx.stream);
  const kernels::LayerNormShape s{input_.numel() / features_, features_, eps_};
  core::Tensor dx = core::Tensor::empty(input_.shape(), DType::f32, g.device(), ctx.stream);
  const float* gamma = weight_ ? weight_->value.data_as<float>() : nullptr;
  float* dgamma = weight_ && weight_->requires_grad ? grad_to_add(*weight_, ctx.stream) : nullptr;
  float* dbeta = bias_ && bias_->requires_grad ? grad_to_add(*bias_, ctx.stream) : nullptr;
  const float *pdy = g.data_as<float>(), *px = input_.data_as<float>();
  const float *pm = mean_.data_as<float>(), *pr = rstd_.data_as<float>();
  float* pdx = dx.data_as<float>();
  core::dispatch(
      g.device(), ctx.stream,
      [&] { kernels::cpu::layernorm_backward(s, pdy, px, pm, pr, gamma, pdx, dgamma, dbeta); },
      [&](kernels::CudaStream stream) {
        const auto bytes = static_cast<std::int64_t>(
            dgamma || dbeta ? kernels::cuda::layernorm_backward_workspace_bytes(s) : 0);
        core::Tensor workspace = core::Tensor::empty({bytes}, DType::u8, g.device(), ctx.stream);
        kernels::cuda::layernorm_backward(s, pdy, px, pm, pr, gamma, pdx, dgamma, dbeta,
                                          workspace.data(), stream);
      });
  input_ = mean_ = rstd_ = core::Tensor();
  return input_dtype_ == DType::f32 ? dx : dx.cast(input_dtype_, ctx.stream);
}

}  // namespace lockstep::engine
