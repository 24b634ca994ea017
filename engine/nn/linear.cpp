// Linear (engine/nn/linear.h).
#include "engine/nn/linear.h"

#include <cmath>
#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "kernels/bias.h"

namespace lockstep::engine {

void init_uniform(core::Tensor& value, core::Generator& rng, float bound) {
  if (value.device().is_cuda())
    throw InvalidArgument("init_uniform: initialise parameters before moving them to a GPU");
  rng.uniform(value);
  float* v = value.data_as<float>();
  for (std::int64_t i = 0; i < value.numel(); ++i) v[i] = (2.0f * v[i] - 1.0f) * bound;
}

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  if (in_features <= 0 || out_features <= 0)
    throw InvalidArgument("Linear(" + std::to_string(in_features) + ", " +
                          std::to_string(out_features) + "): sizes must be positive");
  weight_ = &add_parameter("weight", {out_features, in_features}, ParamRole::weight);
  weight_->lazy_zero_grad = true;  // Note [lazy zero_grad]
  if (bias) bias_ = &add_parameter("bias", {out_features}, ParamRole::bias);
  initialize_when_built();  // Note [initialised when built]
}

Linear::Linear(Parameter& tied_weight, bool bias)
    : Module("Linear"), weight_(&tied_weight), tied_(true) {
  if (tied_weight.value.shape().size() != 2)
    throw InvalidArgument("Linear: tied weight '" + tied_weight.name + "' has shape " +
                          core::shape_str(tied_weight.value.shape()) + ", expected [out, in]");
  out_features_ = tied_weight.value.dim(0);
  in_features_ = tied_weight.value.dim(1);
  if (bias) bias_ = &add_parameter("bias", {out_features_}, ParamRole::bias);
  initialize_when_built();  // the bias only: the tied weight is its owner's
}

void Linear::reset_parameters(core::Generator& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features_));
  if (!tied_) init_uniform(weight_->value, rng, bound);
  if (bias_) init_uniform(bias_->value, rng, bound);
}

core::Tensor Linear::forward(const core::Tensor& x, Context& ctx) {
  if (x.shape().size() < 2 || x.shape().back() != in_features_)
    shape_error(x, "expects [batch, " + std::to_string(in_features_) +
                       "] (check the previous layer's output size)");
  const DType type = ctx.autocast.value_or(DType::f32);
  const core::Tensor rows = x.reshape({x.numel() / in_features_, in_features_});
  const core::Tensor input = x.dtype() == type ? rows : rows.cast(type, ctx.stream);
  core::Tensor y = core::Tensor::empty({input.dim(0), out_features_}, type, x.device(), ctx.stream);
  core::ops::matmul(input, low_weight_.get(*weight_, type, ctx.stream), y, {.trans_b = true},
                    ctx.stream);
  if (bias_) {
    const float* b = bias_->value.data_as<float>();
    const std::int64_t rows = y.dim(0);
    core::dispatch(
        y.device(), ctx.stream,
        [&] { kernels::cpu::add_bias(y.data(), type, b, rows, out_features_); },
        [&](kernels::CudaStream s) {
          kernels::cuda::add_bias(y.data(), type, b, rows, out_features_, s);
        });
  }
  input_ = keeps_for_backward(ctx) ? input : core::Tensor();
  input_dtype_ = x.dtype();
  input_shape_ = x.shape();
  core::Shape out_shape = x.shape();
  out_shape.back() = out_features_;
  return y.reshape(out_shape);
}

core::Tensor Linear::backward(const core::Tensor& dy, Context& ctx) {
  if (!input_.defined()) no_forward_error();
  core::Shape out_shape = input_shape_;
  out_shape.back() = out_features_;
  check_gradient(dy, out_shape, input_.device());
  const DType type = input_.dtype();
  const core::Tensor dy_rows = dy.reshape({input_.dim(0), out_features_});
  const core::Tensor g = dy.dtype() == type ? dy_rows : dy_rows.cast(type, ctx.stream);
  if (weight_->requires_grad) {  // dW (+)= dy^T x, straight into the f32 gradient
    const float beta = accumulate_grad(*weight_) ? 1.0f : 0.0f;  // Note [lazy zero_grad]
    core::ops::matmul(g, input_, weight_->grad, {.trans_a = true, .beta = beta}, ctx.stream);
  }
  if (bias_ && bias_->requires_grad) {
    float* db = grad_to_add(*bias_, ctx.stream);
    const std::int64_t rows = g.dim(0);
    core::dispatch(
        g.device(), ctx.stream,
        [&] { kernels::cpu::bias_grad(g.data(), type, rows, out_features_, db); },
        [&](kernels::CudaStream s) {
          const auto bytes = static_cast<std::int64_t>(
              kernels::cuda::bias_grad_workspace_bytes(rows, out_features_));
          core::Tensor workspace = core::Tensor::empty({bytes}, DType::u8, g.device(), ctx.stream);
          kernels::cuda::bias_grad(g.data(), type, rows, out_features_, db, workspace.data(), s);
        });
  }
  core::Tensor dx;
  if (input_grad()) {
    dx = core::Tensor::empty(input_.shape(), type, g.device(), ctx.stream);
    core::ops::matmul(g, low_weight_.get(*weight_, type, ctx.stream), dx, {}, ctx.stream);
  }
  input_ = core::Tensor();
  if (!dx.defined()) return dx;
  dx = dx.reshape(input_shape_);
  return dx.dtype() == input_dtype_ ? dx : dx.cast(input_dtype_, ctx.stream);
}

}  // namespace lockstep::engine
