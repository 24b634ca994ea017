// BatchNorm2d (engine/nn/batchnorm.h).
#include "engine/nn/batchnorm.h"

#include <string>

#include "engine/core/dispatch.h"
#include "kernels/batchnorm.h"

namespace lockstep::engine {

BatchNorm2d::BatchNorm2d(std::int64_t num_features, double eps, double momentum, bool affine,
                         bool track_running_stats)
    : Module("BatchNorm2d"), num_features_(num_features), eps_(eps), momentum_(momentum) {
  const std::string call = "BatchNorm2d(" + std::to_string(num_features) + ")";
  if (num_features <= 0) throw InvalidArgument(call + ": num_features must be positive");
  if (!(eps > 0.0)) throw InvalidArgument(call + ": eps must be positive");
  if (!(momentum >= 0.0 && momentum <= 1.0))
    throw InvalidArgument(call + ": momentum " + std::to_string(momentum) +
                          " must be within [0, 1]");
  if (affine) {
    weight_ = &add_parameter("weight", {num_features}, ParamRole::norm);
    bias_ = &add_parameter("bias", {num_features}, ParamRole::norm);
    weight_->value.fill_(1.0);
  }
  if (track_running_stats) {
    running_mean_ = &add_buffer("running_mean", core::Tensor::zeros({num_features}, DType::f32));
    running_var_ = &add_buffer("running_var", core::Tensor::zeros({num_features}, DType::f32));
    running_var_->value.fill_(1.0);
    // A 0-dim tensor, as PyTorch stores it.
    num_batches_tracked_ = &add_buffer("num_batches_tracked", core::Tensor::zeros({}, DType::i64));
  }
}

void BatchNorm2d::reset_parameters(core::Generator& /*rng*/) {
  if (weight_) weight_->value.fill_(1.0);
  if (bias_) bias_->value.fill_(0.0);
  if (running_mean_) {
    running_mean_->value.fill_(0.0);
    running_var_->value.fill_(1.0);
    num_batches_tracked_->value.fill_(0.0);
  }
}

const core::Tensor& BatchNorm2d::affine_or(Parameter* p, core::Tensor& constant, double fill,
                                           const core::Tensor& x, const core::Stream& stream) {
  if (p) return p->value;
  if (!constant.defined() || !(constant.device() == x.device())) {
    constant = core::Tensor::empty({num_features_}, DType::f32, x.device(), stream);
    constant.fill_(fill, stream);
  }
  return constant;
}

void BatchNorm2d::check_devices(const core::Tensor& x) const {
  const Parameter* p = weight_;
  const Buffer* b = running_mean_;
  const core::Tensor* state = p ? &p->value : b ? &b->value : nullptr;
  if (state && !(state->device() == x.device()))
    throw InvalidArgument(describe() + ": input on " + x.device().str() + " but its state on " +
                          state->device().str() + " (move the module's parameters and buffers)");
}

core::Tensor BatchNorm2d::forward(const core::Tensor& x, Context& ctx) {
  if (x.shape().size() != 4 || x.dim(1) != num_features_ || x.numel() == 0)
    shape_error(x, "expects [batch, " + std::to_string(num_features_) + ", H, W]");
  require_float(x, "input");
  check_devices(x);
  input_ = save_mean_ = save_rstd_ = core::Tensor();  // eval keeps nothing
  const bool batch_stats = training() || !running_mean_;
  const kernels::BatchNormShape s{x.dim(0), num_features_, x.dim(2) * x.dim(3), eps_};
  if (batch_stats && s.batch * s.spatial < 2)
    shape_error(x,
                "needs more than one value per channel to take batch statistics "
                "(use a larger batch, or eval mode)");
  const core::Tensor x32 = x.dtype() == DType::f32 ? x : x.cast(DType::f32, ctx.stream);
  core::Tensor y = core::Tensor::empty(x.shape(), DType::f32, x.device(), ctx.stream);
  const float* w = affine_or(weight_, ones_, 1.0, x, ctx.stream).data_as<float>();
  const float* b = affine_or(bias_, zeros_, 0.0, x, ctx.stream).data_as<float>();
  const float* in = x32.data_as<float>();
  float* out = y.data_as<float>();
  if (!batch_stats) {
    const float* mean = running_mean_->value.data_as<float>();
    const float* var = running_var_->value.data_as<float>();
    core::dispatch(
        x.device(), ctx.stream,
        [&] { kernels::cpu::batchnorm_forward_inference(s, in, w, b, mean, var, out); },
        [&](kernels::CudaStream stream) {
          kernels::cuda::batchnorm_forward_inference(s, in, w, b, mean, var, out, stream);
        });
    return y;
  }
  core::Tensor save_mean = core::Tensor::empty({num_features_}, DType::f32, x.device(), ctx.stream);
  core::Tensor save_rstd = core::Tensor::empty({num_features_}, DType::f32, x.device(), ctx.stream);
  float *mean = save_mean.data_as<float>(), *rstd = save_rstd.data_as<float>();
  // Running statistics move only in training (eval without them uses the
  // batch's), and once per batch: not in a checkpoint's recompute, which sees
  // the same batch again (Note [activation checkpointing]).
  const bool update = training() && running_mean_ && !ctx.recompute;
  float* running_mean = update ? running_mean_->value.data_as<float>() : nullptr;
  float* running_var = update ? running_var_->value.data_as<float>() : nullptr;
  std::int64_t* count = update ? num_batches_tracked_->value.data_as<std::int64_t>() : nullptr;
  core::dispatch(
      x.device(), ctx.stream,
      [&] {
        kernels::cpu::batchnorm_forward_training(s, in, w, b, out, mean, rstd, momentum_,
                                                 running_mean, running_var);
        if (count) kernels::cpu::count_batch(count);
      },
      [&](kernels::CudaStream stream) {
        kernels::cuda::batchnorm_forward_training(s, in, w, b, out, mean, rstd, momentum_,
                                                  running_mean, running_var, stream);
        if (count) kernels::cuda::count_batch(count, stream);
      });
  if (keeps_for_backward(ctx)) {
    input_ = x32;
    save_mean_ = save_mean;
    save_rstd_ = save_rstd;
    input_dtype_ = x.dtype();
  }
  return y;
}

core::Tensor BatchNorm2d::backward(const core::Tensor& dy, Context& ctx) {
  if (!input_.defined()) no_forward_error();
  check_gradient(dy, input_.shape(), input_.device());
  const core::Tensor g = dy.dtype() == DType::f32 ? dy : dy.cast(DType::f32, ctx.stream);
  const kernels::BatchNormShape s{input_.dim(0), num_features_, input_.dim(2) * input_.dim(3),
                                  eps_};
  core::Tensor dx = core::Tensor::empty(input_.shape(), DType::f32, g.device(), ctx.stream);
  // cuDNN always writes both parameter gradients: frozen or absent ones go to scratch.
  auto grad_or_scratch = [&](Parameter* p) {
    if (p && p->requires_grad) grad_to_add(*p, ctx.stream);
    return p && p->requires_grad
               ? p->grad
               : core::Tensor::zeros({num_features_}, DType::f32, g.device(), ctx.stream);
  };
  const core::Tensor dweight = grad_or_scratch(weight_), dbias = grad_or_scratch(bias_);
  const float* w = affine_or(weight_, ones_, 1.0, input_, ctx.stream).data_as<float>();
  const float *in = input_.data_as<float>(), *grad = g.data_as<float>();
  const float *mean = save_mean_.data_as<float>(), *rstd = save_rstd_.data_as<float>();
  float *out = dx.data_as<float>(), *dw = dweight.data_as<float>(), *db = dbias.data_as<float>();
  core::dispatch(
      g.device(), ctx.stream,
      [&] { kernels::cpu::batchnorm_backward(s, in, grad, w, mean, rstd, out, dw, db); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::batchnorm_backward(s, in, grad, w, mean, rstd, out, dw, db, stream);
      });
  input_ = save_mean_ = save_rstd_ = core::Tensor();
  return input_dtype_ == DType::f32 ? dx : dx.cast(input_dtype_, ctx.stream);
}

}  // namespace lockstep::engine
