// Embedding (engine/nn/embedding.h).
#include "engine/nn/embedding.h"

#include <string>

#include "engine/core/dispatch.h"
#include "kernels/embedding.h"

namespace lockstep::engine {
namespace {

// Note [embedding index check]: a CUDA kernel cannot throw, so the lookup
// records the first position whose index is outside the vocabulary in a
// device word, and this reads it back at once (one copy and a wait on the
// step's stream) and throws the CPU kernel's error. Reading it later, where a
// step already waits, would leave a wrong zero row flowing through the model
// and report the error far from its cause; the wait here comes at the start
// of a forward, when the stream holds little more than the batch's copy and
// the lookup itself.
template <typename Launch>
void check_indices_after(const core::Tensor& indices, std::int64_t vocab,
                         const core::Stream& stream, Launch&& launch) {
  core::Tensor first_bad = core::Tensor::empty({1}, DType::i64, indices.device(), stream);
  launch(first_bad.data_as<std::int64_t>());
  const std::int64_t position = first_bad.to_vector<std::int64_t>(stream)[0];
  if (position < 0) return;
  const std::int64_t index =
      indices.view(position, {1}).cast(DType::i64, stream).to_vector<std::int64_t>(stream)[0];
  throw InvalidArgument("embedding: index " + std::to_string(index) + " at position " +
                        std::to_string(position) + " is outside the vocabulary [0, " +
                        std::to_string(vocab) + ")");
}

}  // namespace

Embedding::Embedding(std::int64_t vocab, std::int64_t dim)
    : Module("Embedding"), vocab_(vocab), dim_(dim) {
  if (vocab <= 0 || dim <= 0)
    throw InvalidArgument("Embedding(" + std::to_string(vocab) + ", " + std::to_string(dim) +
                          "): sizes must be positive");
  weight_ = &add_parameter("weight", {vocab, dim}, ParamRole::weight);
  initialize_when_built();  // Note [initialised when built]
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
        check_indices_after(indices, vocab_, ctx.stream, [&](std::int64_t* first_bad) {
          kernels::cuda::embedding_forward(s, w, indices.data(), out, first_bad, stream);
        });
      });
  indices_ = keeps_for_backward(ctx) ? indices : core::Tensor();
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
          const auto bytes =
              static_cast<std::int64_t>(kernels::cuda::embedding_backward_workspace_bytes(s));
          core::Tensor workspace = core::Tensor::empty({bytes}, DType::u8, g.device(), ctx.stream);
          kernels::cuda::embedding_backward(s, pg, indices_.data(), dw, workspace.data(), stream);
        });
  }
  indices_ = core::Tensor();
  return core::Tensor();
}

}  // namespace lockstep::engine
