// Embedding (engine/nn/embedding.h).
#include "engine/nn/embedding.h"

#include <string>

#include "engine/core/dispatch.h"
#include "kernels/embedding.h"

namespace lockstep::engine {

Embedding::Embedding(std::int64_t vocab, std::int64_t dim)
    : Module("Embedding"), vocab_(vocab), dim_(dim) {
  if (vocab <= 0 || dim <= 0)
    throw InvalidArgument("Embedding(" + std::to_string(vocab) + ", " + std::to_string(dim) +
                          "): sizes must be positive");
  weight_ = &add_parameter("weight", {vocab, dim}, ParamRole::weight);
}

void Embedding::reset_parameters(core::Generator& rng) { rng.normal(weight_->value); }

core::Tensor Embedding::forward(const core::Tensor& indices, Context& ctx) {
  if (indices.dtype() != DType::i64 && indices.dtype() != DType::i32)
    throw InvalidArgument(describe() + ": indices are " + dtype_name(indices.dtype()) +
                          ", expected i64 or i32");
  const kernels::EmbeddingShape s{indices.numel(), vocab_, dim_, indices.dtype()};
  core::Shape out_shape = indices.shape();
  out_shape.push_back(dim_);
  core::Tensor y = core::Tensor::empty(out_shape, DType::f32, indices.device(), ctx.stream);
  const float* w = weight_->value.data_as<float>();
  float* out = y.data_as<float>();
  core::dispatch(
      indices.device(), ctx.stream,
      [&] { kernels::cpu::embedding_forward(s, w, indices.data(), out); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::embedding_forward(s, w, indices.data(), out, stream);
      });
  indices_ = training() ? indices : core::Tensor();
  return y;
}

core::Tensor Embedding::backward(const core::Tensor& dy, Context& ctx) {
  if (!indices_.defined()) no_forward_error();
  if (weight_->requires_grad) {
    const core::Tensor g = dy.dtype() == DType::f32 ? dy : dy.cast(DType::f32, ctx.stream);
    const kernels::EmbeddingShape s{indices_.numel(), vocab_, dim_, indices_.dtype()};
    const float* pg = g.data_as<float>();
    float* dw = grad_to_add(*weight_, ctx.stream);
    core::dispatch(
        g.device(), ctx.stream,
        [&] { kernels::cpu::embedding_backward(s, pg, indices_.data(), dw); },
        [&](kernels::CudaStream stream) {
          kernels::cuda::embedding_backward(s, pg, indices_.data(), dw, stream);
        });
  }
  indices_ = core::Tensor();
  return core::Tensor();
}

}  // namespace lockstep::engine
