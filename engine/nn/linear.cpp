// Linear (engine/nn/linear.h).
#include "engine/nn/linear.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "kernels/bias.h"
#include "kernels/gemm.h"

namespace lockstep::engine {
namespace {

// c[m, n] = op(a) op(b) + beta c for 2-D tensors of one device, as
// core::ops::matmul sets it up; the caller adds the epilogue.
kernels::GemmArgs gemm_args(const core::Tensor& a, const core::Tensor& b, core::Tensor& c,
                            bool trans_a, bool trans_b, float beta) {
  kernels::GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = trans_a ? a.dim(1) : a.dim(0);
  g.k = trans_a ? a.dim(0) : a.dim(1);
  g.n = trans_b ? b.dim(0) : b.dim(1);
  g.beta = beta;
  g.a = a.data();
  g.lda = std::max<std::int64_t>(1, a.dim(1));
  g.b = b.data();
  g.ldb = std::max<std::int64_t>(1, b.dim(1));
  g.c = c.data();
  g.ldc = std::max<std::int64_t>(1, c.dim(1));
  g.ab_type = a.dtype();
  g.c_type = c.dtype();
  return g;
}

void run_gemm(const kernels::GemmArgs& g, core::Device device, const core::Stream& stream) {
  core::dispatch_stream(
      device, stream, [&] { kernels::cpu::gemm(g); },
      [&](const core::Stream& s) {
        kernels::cuda::gemm(g, s.gemm_workspace(), kernels::cuda::kGemmWorkspaceBytes, s.handle());
      });
}

}  // namespace

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

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias,
               kernels::Activation fused_activation)
    : Linear(in_features, out_features, bias) {
  if (fused_activation != kernels::Activation::gelu_tanh || !bias)
    throw InvalidArgument("Linear(" + std::to_string(in_features) + ", " +
                          std::to_string(out_features) +
                          "): a fused activation must be GELU(tanh) after a bias (Note [fused "
                          "activation]); add the activation as its own layer instead");
  activation_ = fused_activation;
}

void Linear::take_gelu_gradient_from(Linear& previous) {
  if (!previous.activation_ || previous.out_features_ != in_features_)
    throw InvalidArgument("Linear(" + std::to_string(in_features_) + ", " +
                          std::to_string(out_features_) +
                          ").take_gelu_gradient_from: the previous layer must be a Linear with a "
                          "fused GELU giving " +
                          std::to_string(in_features_) + " features, it gives " +
                          std::to_string(previous.out_features_) +
                          (previous.activation_ ? "" : " without a fused activation"));
  gelu_producer_ = &previous;
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
  const core::Tensor weight = low_weight_.get(*weight_, type, ctx.stream);
  kernels::GemmArgs g = gemm_args(input, weight, y, false, true, 0.0f);
  core::Tensor pre_activation;
  if (bias_) {  // Note [gemm epilogues]: the CPU adds it after the product, as before
    g.epilogue = kernels::GemmEpilogue::bias;
    g.bias = bias_->value.data_as<float>();
  }
  if (activation_) {  // Note [fused activation]
    pre_activation = core::Tensor::empty(y.shape(), type, x.device(), ctx.stream);
    g.epilogue = kernels::GemmEpilogue::bias_gelu_aux;
    g.aux = pre_activation.data();
  }
  run_gemm(g, x.device(), ctx.stream);
  pre_activation_ = keeps_for_backward(ctx) ? pre_activation : core::Tensor();
  gradient_at_pre_activation_ = false;
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
  core::Tensor g = dy.dtype() == type ? dy_rows : dy_rows.cast(type, ctx.stream);
  // Note [gelu gradient from the next layer]: dy is already the gradient at
  // the pre-activation, and the bias gradient is summed.
  const bool from_next = gradient_at_pre_activation_;
  gradient_at_pre_activation_ = false;
  if (from_next) pre_activation_ = core::Tensor();
  if (activation_ && !from_next) {  // Note [fused activation]: GELU's backward, as GELU ran it
    if (!pre_activation_.defined()) no_forward_error();
    core::Tensor d_pre = core::Tensor::empty(g.shape(), type, g.device(), ctx.stream);
    core::dispatch(
        g.device(), ctx.stream,
        [&] {
          kernels::cpu::activation_backward(*activation_, g.data(), pre_activation_.data(),
                                            d_pre.data(), type, g.numel());
        },
        [&](kernels::CudaStream s) {
          kernels::cuda::activation_backward(*activation_, g.data(), pre_activation_.data(),
                                             d_pre.data(), type, g.numel(), s);
        });
    pre_activation_ = core::Tensor();
    g = d_pre;
  }
  const bool bias_grad = bias_ && bias_->requires_grad && !from_next;
  if (weight_->requires_grad) {  // dW (+)= dy^T x, straight into the f32 gradient
    const float beta = accumulate_grad(*weight_) ? 1.0f : 0.0f;  // Note [lazy zero_grad]
    kernels::GemmArgs dw = gemm_args(g, input_, weight_->grad, true, false, beta);
    if (bias_grad) {  // db from the dy the GEMM reads anyway (Note [gemm epilogues])
      dw.epilogue = kernels::GemmEpilogue::bgrad_a;
      dw.bias_grad_accumulate = accumulate_grad(*bias_);
      dw.bias_grad = bias_->grad.data_as<float>();
    }
    run_gemm(dw, g.device(), ctx.stream);
  } else if (bias_grad) {
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
    const core::Tensor weight = low_weight_.get(*weight_, type, ctx.stream);
    kernels::GemmArgs gx = gemm_args(g, weight, dx, false, false, 0.0f);
    Linear* previous = gelu_producer_;
    if (previous && previous->pre_activation_.defined() &&
        previous->pre_activation_.shape() == dx.shape() &&
        previous->pre_activation_.dtype() == dx.dtype() &&
        previous->bias_->requires_grad) {  // Note [gelu gradient from the next layer]
      gx.epilogue = kernels::GemmEpilogue::dgelu_bgrad;
      gx.aux = previous->pre_activation_.data();
      gx.bias_grad_accumulate = accumulate_grad(*previous->bias_);
      gx.bias_grad = previous->bias_->grad.data_as<float>();
      previous->gradient_at_pre_activation_ = true;
    }
    run_gemm(gx, g.device(), ctx.stream);
  }
  input_ = core::Tensor();
  if (!dx.defined()) return dx;
  dx = dx.reshape(input_shape_);
  return dx.dtype() == input_dtype_ ? dx : dx.cast(input_dtype_, ctx.stream);
}

}  // namespace lockstep::engine
