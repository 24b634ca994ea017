// Embedding: a lookup table weight [vocab, dim] (init normal(0, 1), as
// PyTorch) indexed by integer tensors (i64 or i32) of any shape; the output
// is f32 [..., dim]. Its backward returns no input gradient (indices have none).
// An index outside [0, vocab) is an InvalidArgument naming the layer (Note
// [embedding index check]).
#pragma once

#include <cstdint>

#include "engine/nn/module.h"

namespace lockstep::engine {

class Embedding : public Module {
 public:
  Embedding(std::int64_t vocab, std::int64_t dim);
  core::Tensor forward(const core::Tensor& indices, Context& ctx) override;
  // forward for indices the caller built in range itself (GPT's positions):
  // on CUDA nothing is checked or recorded; the CPU loop checks as ever.
  core::Tensor forward_in_range(const core::Tensor& indices, Context& ctx);
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  Parameter& weight() { return *weight_; }
  std::int64_t vocab() const { return vocab_; }
  std::int64_t dim() const { return dim_; }
  void reset_parameters(core::Generator& rng) override;

 private:
  core::Tensor lookup(const core::Tensor& indices, Context& ctx, bool check);

  std::int64_t vocab_, dim_;
  Parameter* weight_;
  core::Tensor indices_;
};

}  // namespace lockstep::engine
