// Losses and the accuracy metric. A loss is not a Module: it takes the
// model's output and the targets, returns the loss as a one-element f32
// tensor on the output's device (no host synchronisation), and its backward
// takes the gradient of the final objective with respect to that loss
// (1, or the loss scale, or 1/K for K accumulation micro-batches).
// Losses compute in f32 whatever the output dtype (autocast keeps them there).
#pragma once

#include <cstdint>

#include "engine/nn/module.h"

namespace lockstep::engine {

// Softmax cross-entropy over logits [rows, classes] and integer labels [rows]
// (i64 or i32): the mean over rows whose label is not ignore_index. Logits
// [d0, ..., classes] with labels [d0, ...] count every position as a row (a
// language model's mean over batch x sequence).
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(std::int64_t ignore_index = -100) : ignore_index_(ignore_index) {}
  core::Tensor forward(const core::Tensor& logits, const core::Tensor& labels, Context& ctx);
  // dlogits, in the logits' dtype.
  core::Tensor backward(float dloss, Context& ctx);
  // Rows counted by the last forward (one-element f32 on the logits' device).
  const core::Tensor& counted_rows() const { return count_; }

 private:
  std::int64_t ignore_index_;
  core::Tensor probs_, labels_, count_;
  core::Shape logits_shape_;
  DType logits_dtype_ = DType::f32;
};

// Mean squared error over all elements: mean((prediction - target)^2).
class MSELoss {
 public:
  core::Tensor forward(const core::Tensor& prediction, const core::Tensor& target, Context& ctx);
  core::Tensor backward(float dloss, Context& ctx);

 private:
  core::Tensor diff_;  // prediction - target, f32
  DType prediction_dtype_ = DType::f32;
};

// Rows whose largest logit (the first on ties) is the label (shapes as for
// CrossEntropyLoss), ignoring rows labelled ignore_index: a one-element f32
// count on the logits' device.
core::Tensor count_correct(const core::Tensor& logits, const core::Tensor& labels,
                           const core::Stream& stream, std::int64_t ignore_index = -100);

}  // namespace lockstep::engine
