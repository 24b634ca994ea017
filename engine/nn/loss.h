// Losses: the interface the data-parallel step and the Trainer train through
// (Loss), its built-ins (cross-entropy over class indices, and the
// elementwise MSE, L1, Huber and binary cross-entropy with logits), and the
// accuracy metric. A loss is not a Module: it takes the model's output and the
// batch's targets, returns the loss as a one-element f32 tensor on the
// output's device (no host synchronisation), and its backward takes the
// gradient of the final objective with respect to that loss (1, or the loss
// scale, or 1/K for K accumulation micro-batches). Losses compute in f32
// whatever the output dtype (autocast keeps them there).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/nn/module.h"
#include "kernels/elementwise_loss.h"

namespace lockstep::engine {

// Note [loss rows]: a loss's forward returns the mean over the rows it counts
// and says how many it counted (counted_rows, on the device). The step weighs
// each micro-batch's mean by its rows, so the loss it reports is the mean over
// the global batch's counted rows; each micro-batch's gradient is its own mean
// (PyTorch DDP's). A row is a sample, or a position of a sequence for token
// targets; cross-entropy does not count rows labelled ignore_index.
class Loss {
 public:
  virtual ~Loss() = default;
  // What the loss is, with its settings: the ranks compare it before training,
  // and programs print it ("cross-entropy label_smoothing=0.1").
  virtual std::string describe() const = 0;
  // The mean loss over the rows it counts; keeps what backward needs.
  virtual core::Tensor forward(const core::Tensor& output, const core::Tensor& targets,
                               Context& ctx) = 0;
  // The output's gradient, in the output's dtype and shape, given dloss: the
  // gradient of the objective with respect to the last forward's loss.
  virtual core::Tensor backward(float dloss, Context& ctx) = 0;
  // Rows the last forward counted: one-element f32 on the output's device.
  virtual const core::Tensor& counted_rows() const = 0;
  // Evaluation's metric: the counted rows whose prediction is right (one-element
  // f32 on the output's device), or an undefined tensor for a loss without
  // one (regression). Keeps nothing for backward.
  virtual core::Tensor count_correct(const core::Tensor& /*output*/,
                                     const core::Tensor& /*targets*/,
                                     const core::Stream& /*stream*/) {
    return {};
  }
};

// Softmax cross-entropy over logits [rows, classes] and integer labels [rows]
// (i64 or i32): the mean over rows whose label is not ignore_index. Logits
// [d0, ..., classes] with labels [d0, ...] count every position as a row (a
// language model's mean over batch x sequence). label_smoothing e in [0, 1]
// trains towards (1 - e) onehot + e / classes, as PyTorch's.
class CrossEntropyLoss final : public Loss {
 public:
  explicit CrossEntropyLoss(std::int64_t ignore_index = -100, float label_smoothing = 0.0f);
  std::string describe() const override;
  core::Tensor forward(const core::Tensor& logits, const core::Tensor& labels,
                       Context& ctx) override;
  // dlogits, in the logits' dtype.
  core::Tensor backward(float dloss, Context& ctx) override;
  const core::Tensor& counted_rows() const override { return count_; }
  // Rows whose largest logit is the label (engine::count_correct).
  core::Tensor count_correct(const core::Tensor& logits, const core::Tensor& labels,
                             const core::Stream& stream) override;

 private:
  std::int64_t ignore_index_;
  float label_smoothing_;
  core::Tensor probs_, labels_, count_;
  core::Shape logits_shape_;
  DType logits_dtype_ = DType::f32;
};

// A loss of each element of the prediction against the target of the same
// shape, averaged over all elements (PyTorch's reduction 'mean'); targets of
// any float dtype, computed in f32. Its rows are the prediction's first
// dimension (Note [loss rows]).
class ElementwiseLoss : public Loss {
 public:
  explicit ElementwiseLoss(kernels::ElementwiseLossKind kind, float huber_delta = 1.0f);
  std::string describe() const override;
  core::Tensor forward(const core::Tensor& prediction, const core::Tensor& target,
                       Context& ctx) override;
  core::Tensor backward(float dloss, Context& ctx) override;
  const core::Tensor& counted_rows() const override { return rows_; }

 private:
  kernels::ElementwiseLossShape shape_;
  core::Tensor prediction_, target_, rows_;  // f32 copies kept for backward
  DType prediction_dtype_ = DType::f32;
};

// mean((prediction - target)^2).
class MSELoss final : public ElementwiseLoss {
 public:
  MSELoss() : ElementwiseLoss(kernels::ElementwiseLossKind::mse) {}
};
// mean(|prediction - target|).
class L1Loss final : public ElementwiseLoss {
 public:
  L1Loss() : ElementwiseLoss(kernels::ElementwiseLossKind::l1) {}
};
// Quadratic for |prediction - target| <= delta, linear beyond (PyTorch's HuberLoss).
class HuberLoss final : public ElementwiseLoss {
 public:
  explicit HuberLoss(float delta = 1.0f)
      : ElementwiseLoss(kernels::ElementwiseLossKind::huber, delta) {}
};
// Binary cross-entropy of sigmoid(logits) against targets in [0, 1], one
// independent label per element (multi-label): PyTorch's BCEWithLogitsLoss.
class BCEWithLogitsLoss final : public ElementwiseLoss {
 public:
  BCEWithLogitsLoss() : ElementwiseLoss(kernels::ElementwiseLossKind::bce_with_logits) {}
};

// A built-in loss by its program name: cross-entropy, mse, l1, huber, bce.
// Throws InvalidArgument naming the choices for any other.
std::unique_ptr<Loss> make_loss(const std::string& name);

// Rows whose largest logit (the first on ties) is the label (shapes as for
// CrossEntropyLoss), ignoring rows labelled ignore_index: a one-element f32
// count on the logits' device.
core::Tensor count_correct(const core::Tensor& logits, const core::Tensor& labels,
                           const core::Stream& stream, std::int64_t ignore_index = -100);

}  // namespace lockstep::engine
