// Embedding (engine/nn/embedding.h).
#include "engine/nn/embedding.h"

#include <string>
#include <vector>

#include "engine/core/dispatch.h"
#include "engine/step_readback.h"
#include "kernels/embedding.h"

namespace lockstep::engine {
namespace {

// Note [embedding index check]: a CUDA kernel cannot throw, so the lookup
// records a bad index in a device word (Note [index report word],
// kernels/embedding.h) and reads it back later, where it throws the error the
// CPU loop gives at once (embedding_index_error). Inside a data-parallel step
// the word is a slot of the step's readback, read with the loss, and the step
// is refused there (Note [deferred index check], engine/step_readback.h): no
// wait of its own. Outside one (Context::index_checks null: evaluation,
// generation, a program's own loop) the lookup reads its word at once, one
// copy and a wait on the stream, and throws before its output is used.
// Indices the caller built in range (forward_in_range) are not checked on
// CUDA; a bad index there would read no row and give zeros.
template <typename Launch>
void check_indices_after(const Module& module, const core::Tensor& indices, std::int64_t vocab,
                         const core::Stream& stream, Launch&& launch) {
  core::Tensor word = core::Tensor::zeros({1}, DType::i64, indices.device(), stream);
  launch(kernels::IndexReport{static_cast<std::uint64_t*>(word.data()), 0});
  const auto recorded = static_cast<std::uint64_t>(word.to_vector<std::int64_t>(stream)[0]);
  if (!kernels::index_report_bad(recorded)) return;
  const std::int64_t position = kernels::index_report_position(recorded);
  const std::int64_t index =
      indices.view(position, {1}).cast(DType::i64, stream).to_vector<std::int64_t>(stream)[0];
  throw InvalidArgument(embedding_index_error(module.describe(), index, position, vocab));
}

// The first index outside [0, vocab) of host `indices`, as the CPU kernel meets it.
[[noreturn]] void throw_first_bad_index(const Module& module, const core::Tensor& indices,
                                        std::int64_t vocab) {
  const std::vector<std::int64_t> values = indices.dtype() == DType::i64
                                               ? indices.to_vector<std::int64_t>()
                                               : indices.cast(DType::i64).to_vector<std::int64_t>();
  for (std::size_t n = 0; n < values.size(); ++n)
    if (values[n] < 0 || values[n] >= vocab)
      throw InvalidArgument(
          embedding_index_error(module.describe(), values[n], static_cast<std::int64_t>(n), vocab));
  throw InvalidArgument(module.describe() + ": the embedding lookup failed on in-range indices");
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
  return lookup(indices, ctx, true);
}

core::Tensor Embedding::forward_in_range(const core::Tensor& indices, Context& ctx) {
  return lookup(indices, ctx, false);
}

core::Tensor Embedding::lookup(const core::Tensor& indices, Context& ctx, bool check) {
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
      [&] {
        try {
          kernels::cpu::embedding_forward(s, w, indices.data(), out);
        } catch (const InvalidArgument&) {
          throw_first_bad_index(*this, indices, vocab_);
        }
      },
      [&](kernels::CudaStream stream) {
        const auto launch = [&](kernels::IndexReport report) {
          kernels::cuda::embedding_forward(s, w, indices.data(), out, report, stream);
        };
        if (!check) return launch({});
        const kernels::IndexReport deferred =
            ctx.index_checks ? ctx.index_checks->add(describe(), indices, vocab_)
                             : kernels::IndexReport{};
        if (deferred.word) return launch(deferred);
        check_indices_after(*this, indices, vocab_, ctx.stream, launch);
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
