// BatchNorm2d (engine/nn/batchnorm.h).
#include "engine/nn/batchnorm.h"

#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "engine/kernel_paths.h"
#include "engine/nn/activation.h"
#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/fusion.h"

namespace lockstep::engine {

BatchNorm2d::BatchNorm2d(std::int64_t num_features, double eps, double momentum, bool affine,
                         bool track_running_stats, BatchNormActivation activation)
    : Module("BatchNorm2d"),
      num_features_(num_features),
      eps_(eps),
      momentum_(momentum),
      activation_(activation) {
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

// NCHW [N, C, H, W] is BatchNormShape{N, C, H * W}. NHWC [N, H, W, C] is a
// [N * H * W, C] matrix, which is BatchNormShape{N * H * W, C, 1} in the same
// indexing: every path below (the CPU's, cuDNN's, the fused kernels) takes it
// unchanged, and the CPU's f64 sums visit a channel's values in the same
// order as NCHW's, so the CPU's NHWC results equal its NCHW ones bit for bit.
kernels::BatchNormShape BatchNorm2d::shape_of(const core::Tensor& x) const {
  const int c_axis = channels_last_ ? 3 : 1;
  if (x.shape().size() != 4 || x.dim(c_axis) != num_features_ || x.numel() == 0) {
    const std::string c = std::to_string(num_features_);
    shape_error(x, channels_last_ ? "expects channels-last (NHWC) [batch, H, W, " + c +
                                        "] (in channels-last mode ChannelsLast gives the layers "
                                        "NHWC activations)"
                                  : "expects NCHW [batch, " + c + ", H, W]");
  }
  if (channels_last_) return {x.dim(0) * x.dim(1) * x.dim(2), num_features_, 1, eps_};
  return {x.dim(0), num_features_, x.dim(2) * x.dim(3), eps_};
}

// Note [batchnorm paths]: where BatchNorm2d (and its fused epilogues) runs.
// - CPU: the f32 path (a 16-bit input cast to f32, kernels::cpu::batchnorm_*,
//   an f32 output), then the epilogue as the separate ReLU module and
//   Residual's add ran it (f32, add then ReLU): the CPU keeps its bits.
// - CUDA, an f32 input and no epilogue: cuDNN's legacy calls, as before.
// - CUDA otherwise (an f16 or bf16 input, or a ReLU or add + ReLU epilogue):
//   the fused kernels (Note [fused batchnorm] in kernels/batchnorm.h) in the
//   input's type, with f32 statistics and parameters; the output keeps the
//   input's type, as PyTorch AMP's. A trace names their kernels
//   (stats_partial_kernel, apply_kernel), cuDNN's path its own.
core::Tensor BatchNorm2d::forward(const core::Tensor& x, Context& ctx) {
  return run_forward(x, nullptr, ctx);
}

core::Tensor BatchNorm2d::forward_add_relu(const core::Tensor& x, const core::Tensor& identity,
                                           Context& ctx) {
  if (activation_ != BatchNormActivation::none)
    throw InvalidArgument(describe() +
                          ": forward_add_relu needs a layer without its own activation (build it "
                          "with BatchNormActivation::none)");
  if (identity.shape() != x.shape() || !(identity.device() == x.device()))
    throw InvalidArgument(describe() + ": the identity is " + core::shape_str(identity.shape()) +
                          " on " + identity.device().str() + ", the input " +
                          core::shape_str(x.shape()) + " on " + x.device().str() +
                          " (give a shortcut of the input's shape and device)");
  return run_forward(x, &identity, ctx);
}

core::Tensor BatchNorm2d::unfused_epilogue(core::Tensor y, const core::Tensor* identity,
                                           Context& ctx) {
  if (identity) {
    // Residual's add: an f32 branch output promotes the identity to f32.
    core::Tensor sum = core::Tensor::empty(y.shape(), y.dtype(), y.device(), ctx.stream);
    core::ops::add(
        y, identity->dtype() == y.dtype() ? *identity : identity->cast(y.dtype(), ctx.stream), sum,
        ctx.stream);
    y = sum;
  }
  if (identity || activation_ == BatchNormActivation::relu)
    activation_forward(kernels::Activation::relu, y, y, ctx.stream);
  return y;
}

core::Tensor BatchNorm2d::run_forward(const core::Tensor& x, const core::Tensor* identity,
                                      Context& ctx) {
  const kernels::BatchNormShape s = shape_of(x);
  require_float(x, "input");
  check_devices(x);
  input_ = save_mean_ = save_rstd_ = output_ = core::Tensor();  // eval keeps nothing
  const bool batch_stats = training() || !running_mean_;
  if (batch_stats && s.batch * s.spatial < 2)
    shape_error(x,
                "needs more than one value per channel to take batch statistics "
                "(use a larger batch, or eval mode)");
  using kernels::BatchNormEpilogue;
  const BatchNormEpilogue epi = identity ? BatchNormEpilogue::add_relu
                                : activation_ == BatchNormActivation::relu
                                    ? BatchNormEpilogue::relu
                                    : BatchNormEpilogue::none;
  // Note [batchnorm paths]
  const bool fused = x.device().is_cuda() && kernels::fused_kernels() &&
                     (x.dtype() != DType::f32 || epi != BatchNormEpilogue::none);
  if (x.device().is_cuda())  // Note [kernel paths]
    note_kernel_path("batchnorm", fused ? (identity ? "fused add+relu" : "fused") : "cudnn",
                     fused || kernels::fused_kernels() ? "" : "turned off");
  if (fused && identity && identity->dtype() != x.dtype())
    throw InvalidArgument(describe() + ": the identity is " + dtype_name(identity->dtype()) +
                          " but the input " + dtype_name(x.dtype()) +
                          " (cast the shortcut to the input's type)");
  const float* w = affine_or(weight_, ones_, 1.0, x, ctx.stream).data_as<float>();
  const float* b = affine_or(bias_, zeros_, 0.0, x, ctx.stream).data_as<float>();
  const core::Tensor x_in = fused || x.dtype() == DType::f32 ? x : x.cast(DType::f32, ctx.stream);
  core::Tensor y =
      core::Tensor::empty(x.shape(), fused ? x.dtype() : DType::f32, x.device(), ctx.stream);
  const void* id = identity ? identity->data() : nullptr;
  auto workspace = [&] {
    return core::Tensor::empty(
        {static_cast<std::int64_t>(kernels::batchnorm_fused_workspace_bytes(s))}, DType::u8,
        x.device(), ctx.stream);
  };
  const float* in = fused ? nullptr : x_in.data_as<float>();
  float* out = fused ? nullptr : y.data_as<float>();
  if (!batch_stats) {
    const float* mean = running_mean_->value.data_as<float>();
    const float* var = running_var_->value.data_as<float>();
    core::dispatch(
        x.device(), ctx.stream,
        [&] { kernels::cpu::batchnorm_forward_inference(s, in, w, b, mean, var, out); },
        [&](kernels::CudaStream stream) {
          if (!fused) {
            kernels::cuda::batchnorm_forward_inference(s, in, w, b, mean, var, out, stream);
            return;
          }
          core::Tensor scratch = workspace();
          kernels::cuda::batchnorm_fused_forward_inference(
              s, x.dtype(), epi, x.data(), id, w, b, mean, var, y.data(), scratch.data(), stream);
        });
    return fused ? y : unfused_epilogue(y, identity, ctx);
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
        if (fused) {
          core::Tensor scratch = workspace();
          kernels::cuda::batchnorm_fused_forward_training(
              s, x.dtype(), epi, x.data(), id, w, b, y.data(), mean, rstd, momentum_, running_mean,
              running_var, scratch.data(), stream);
        } else {
          kernels::cuda::batchnorm_forward_training(s, in, w, b, out, mean, rstd, momentum_,
                                                    running_mean, running_var, stream);
        }
        if (count) kernels::cuda::count_batch(count, stream);
      });
  if (!fused) y = unfused_epilogue(y, identity, ctx);
  if (keeps_for_backward(ctx)) {
    input_ = x_in;
    save_mean_ = save_mean;
    save_rstd_ = save_rstd;
    output_ = epi == BatchNormEpilogue::none ? core::Tensor() : y;
    input_dtype_ = x.dtype();
    epilogue_ = epi;
    fused_ = fused;
  }
  return y;
}

core::Tensor BatchNorm2d::backward(const core::Tensor& dy, Context& ctx) {
  if (input_.defined() && epilogue_ == kernels::BatchNormEpilogue::add_relu)
    throw InvalidArgument(describe() +
                          ": forward_add_relu ran, so backward_add_relu must take its gradient");
  return run_backward(dy, ctx, nullptr);
}

core::Tensor BatchNorm2d::backward_add_relu(const core::Tensor& dy, Context& ctx,
                                            core::Tensor& d_identity) {
  if (input_.defined() && epilogue_ != kernels::BatchNormEpilogue::add_relu)
    throw InvalidArgument(describe() +
                          ": backward_add_relu needs a forward_add_relu before it (use backward)");
  return run_backward(dy, ctx, &d_identity);
}

core::Tensor BatchNorm2d::run_backward(const core::Tensor& dy, Context& ctx,
                                       core::Tensor* d_identity) {
  if (!input_.defined()) no_forward_error();
  check_gradient(dy, input_.shape(), input_.device());
  const kernels::BatchNormShape s = shape_of(input_);
  const float* w = affine_or(weight_, ones_, 1.0, input_, ctx.stream).data_as<float>();
  const float *mean = save_mean_.data_as<float>(), *rstd = save_rstd_.data_as<float>();
  core::Tensor dx;
  if (fused_) {  // Note [batchnorm paths]
    const core::Tensor g = dy.dtype() == input_dtype_ ? dy : dy.cast(input_dtype_, ctx.stream);
    dx = core::Tensor::empty(input_.shape(), input_dtype_, g.device(), ctx.stream);
    if (d_identity)
      *d_identity = core::Tensor::empty(input_.shape(), input_dtype_, g.device(), ctx.stream);
    float* dw = weight_ && weight_->requires_grad ? grad_to_add(*weight_, ctx.stream) : nullptr;
    float* db = bias_ && bias_->requires_grad ? grad_to_add(*bias_, ctx.stream) : nullptr;
    core::Tensor scratch = core::Tensor::empty(
        {static_cast<std::int64_t>(kernels::batchnorm_fused_workspace_bytes(s))}, DType::u8,
        g.device(), ctx.stream);
    const void* out = output_.defined() ? output_.data() : nullptr;
    void* d_id = d_identity ? d_identity->data() : nullptr;
    core::dispatch(
        g.device(), ctx.stream,
        [&] {
          kernels::cpu::batchnorm_fused_backward(s, input_dtype_, epilogue_, input_.data(), out,
                                                 g.data(), w, mean, rstd, dx.data(), d_id, dw, db);
        },
        [&](kernels::CudaStream stream) {
          kernels::cuda::batchnorm_fused_backward(s, input_dtype_, epilogue_, input_.data(), out,
                                                  g.data(), w, mean, rstd, dx.data(), d_id, dw, db,
                                                  scratch.data(), stream);
        });
    input_ = save_mean_ = save_rstd_ = output_ = core::Tensor();
    return dx;
  }
  core::Tensor g = dy.dtype() == DType::f32 ? dy : dy.cast(DType::f32, ctx.stream);
  if (epilogue_ != kernels::BatchNormEpilogue::none) {
    // The separate ReLU's backward (its mask: the output > 0, as the input > 0).
    core::Tensor masked = core::Tensor::empty(g.shape(), DType::f32, g.device(), ctx.stream);
    core::dispatch(
        g.device(), ctx.stream,
        [&] {
          kernels::cpu::activation_backward(kernels::Activation::relu, g.data(), output_.data(),
                                            masked.data(), DType::f32, g.numel());
        },
        [&](kernels::CudaStream stream) {
          kernels::cuda::activation_backward(kernels::Activation::relu, g.data(), output_.data(),
                                             masked.data(), DType::f32, g.numel(), stream);
        });
    g = masked;
    if (d_identity) *d_identity = g;
  }
  dx = core::Tensor::empty(input_.shape(), DType::f32, g.device(), ctx.stream);
  // cuDNN always writes both parameter gradients: frozen or absent ones go to scratch.
  auto grad_or_scratch = [&](Parameter* p) {
    if (p && p->requires_grad) grad_to_add(*p, ctx.stream);
    return p && p->requires_grad
               ? p->grad
               : core::Tensor::zeros({num_features_}, DType::f32, g.device(), ctx.stream);
  };
  const core::Tensor dweight = grad_or_scratch(weight_), dbias = grad_or_scratch(bias_);
  const float *in = input_.data_as<float>(), *grad = g.data_as<float>();
  float *out = dx.data_as<float>(), *dw = dweight.data_as<float>(), *db = dbias.data_as<float>();
  core::dispatch(
      g.device(), ctx.stream,
      [&] { kernels::cpu::batchnorm_backward(s, in, grad, w, mean, rstd, out, dw, db); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::batchnorm_backward(s, in, grad, w, mean, rstd, out, dw, db, stream);
      });
  input_ = save_mean_ = save_rstd_ = output_ = core::Tensor();
  return input_dtype_ == DType::f32 ? dx : dx.cast(input_dtype_, ctx.stream);
}

}  // namespace lockstep::engine
