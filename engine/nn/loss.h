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
#include <optional>
#include <string>
#include <vector>

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
  // Note [gradient in the forward]: a promise from the caller about the next
  // forward only: backward(dloss) with this dloss follows it, and the caller
  // reads the output it passes to it no more (the data-parallel step makes
  // it; evaluation does not). A loss may then compute its gradient in that
  // forward, over the output's memory when nothing else holds it
  // (CrossEntropyLoss over f16/bf16 logits on CUDA, Note [fused
  // cross-entropy]). By default it is ignored.
  virtual void expect_backward(float /*dloss*/) {}
  // Withdraws an announcement that no forward took (a throw between the two):
  // the promise is for the step's forward only, and a later forward (an
  // evaluation's) must not compute a gradient over its output. A loss that
  // overrides expect_backward overrides this too; ExpectedBackward calls it.
  virtual void cancel_expected_backward() {}
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

  // Several outputs and targets (Note [several inputs and outputs]), as the
  // data-parallel step and the Trainer call a loss: `outputs` are the
  // model's (Module::forward_named), `batch` the micro-batch's tensors. By
  // default forward(outputs["output"], batch["targets"]); backward_named
  // returns the gradient of each output it read, by name.
  virtual core::Tensor forward_named(const core::NamedTensors& outputs,
                                     const core::NamedTensors& batch, Context& ctx);
  virtual core::NamedTensors backward_named(float dloss, Context& ctx);
  virtual core::Tensor count_correct_named(const core::NamedTensors& outputs,
                                           const core::NamedTensors& batch,
                                           const core::Stream& stream);
};

// Note [announcement scope]: expect_backward for the forward in this scope
// alone. The destructor withdraws the announcement however the scope ends (a
// forward that took it has consumed it already), so that a throw between the
// announcement and the loss's forward (a missing output, a term before it
// that refused its input) leaves nothing pending for the next forward: an
// evaluation's would otherwise take the fused cross-entropy and overwrite its
// logits. The data-parallel step announces through it.
class ExpectedBackward {
 public:
  ExpectedBackward(Loss& loss, float dloss) : loss_(loss) { loss.expect_backward(dloss); }
  ~ExpectedBackward() { loss_.cancel_expected_backward(); }
  ExpectedBackward(const ExpectedBackward&) = delete;
  ExpectedBackward& operator=(const ExpectedBackward&) = delete;

 private:
  Loss& loss_;
};

// Note [loss of several terms]: WeightedLosses is sum_i weight_i * term_i,
// each term a Loss of one named output against one named tensor of the batch
// (a two-head model's cross-entropy on "logits" against "targets" plus MSE on
// "value" against "value_targets"). Each term is its own mean over its own
// counted rows, so the sum is what the same objective is in PyTorch. Its
// counted rows are the first term's: the step weighs a micro-batch's sum by
// them (Note [loss rows]), which is the mean over the global batch when
// every term counts the same rows (put first a term that counts every row,
// or the one whose rows you mean). Its metric (count_correct) is the first
// term's that has one, over that term's rows: evaluation's accuracy is then
// of the rows the first term counts, so put the classification term first.
// Two terms may read the same output: their gradients are summed.
class WeightedLosses final : public Loss {
 public:
  struct Term {
    std::shared_ptr<Loss> loss;
    std::string output;  // the model's output it reads
    std::string target;  // the batch's tensor it reads
    float weight = 1.0f;
  };
  // Throws InvalidArgument for no terms, a null loss or a non-finite weight.
  explicit WeightedLosses(std::vector<Term> terms);
  // "1*cross-entropy ...(logits, targets) + 0.5*mse(value, value_targets)".
  std::string describe() const override;
  // The one-tensor forms throw: the terms read named outputs (forward_named).
  core::Tensor forward(const core::Tensor& output, const core::Tensor& targets,
                       Context& ctx) override;
  core::Tensor backward(float dloss, Context& ctx) override;
  // Passes dloss * weight on to each term whose output no other term reads
  // (a term that overwrote a shared output would change the other's input).
  void expect_backward(float dloss) override;
  void cancel_expected_backward() override;  // every term's
  const core::Tensor& counted_rows() const override;
  core::Tensor forward_named(const core::NamedTensors& outputs, const core::NamedTensors& batch,
                             Context& ctx) override;
  core::NamedTensors backward_named(float dloss, Context& ctx) override;
  core::Tensor count_correct_named(const core::NamedTensors& outputs,
                                   const core::NamedTensors& batch,
                                   const core::Stream& stream) override;
  const std::vector<Term>& terms() const { return terms_; }
  // Each term's mean loss in the last forward, unweighted (one-element f32
  // tensors on the output's device): what each head has learnt.
  const std::vector<core::Tensor>& term_losses() const { return term_losses_; }

 private:
  std::vector<Term> terms_;
  std::vector<core::Tensor> term_losses_;
};

// Softmax cross-entropy over logits [rows, classes] and integer labels [rows]
// (i64 or i32): the mean over rows whose label is not ignore_index. Logits
// [d0, ..., classes] with labels [d0, ...] count every position as a row (a
// language model's mean over batch x sequence). label_smoothing e in [0, 1]
// trains towards (1 - e) onehot + e / classes, as PyTorch's.
//
// Note [cross-entropy paths]: the forward after expect_backward(dloss), on
// CUDA, over f16 or bf16 logits (autocast's), is the fused one
// (kernels::cuda::softmax_xent_fused): loss, accuracy and the gradient for
// that dloss in one pass, written over the logits when the caller's tensor is
// the only holder of their memory (else into a new tensor of their dtype), and
// backward returns it. Every other forward (f32 logits, the CPU, a forward
// with no backward announced, as in evaluation) computes f32 probabilities
// from an f32 copy of the logits and backward the gradient from them, cast
// back to the logits' dtype. path() says which ran; a trace has an instant
// "cross-entropy fused ..." per fused forward, and a training forward on CUDA
// tells engine::collect_kernel_paths its path (Note [kernel paths]).
class CrossEntropyLoss final : public Loss {
 public:
  explicit CrossEntropyLoss(std::int64_t ignore_index = -100, float label_smoothing = 0.0f);
  std::string describe() const override;
  core::Tensor forward(const core::Tensor& logits, const core::Tensor& labels,
                       Context& ctx) override;
  // dlogits, in the logits' dtype. After a fused forward, dloss must be the
  // one expect_backward gave (InvalidArgument otherwise).
  core::Tensor backward(float dloss, Context& ctx) override;
  void expect_backward(float dloss) override { expected_dloss_ = dloss; }
  void cancel_expected_backward() override { expected_dloss_.reset(); }
  // Whether a backward is announced for the next forward (Note [announcement scope]).
  bool backward_expected() const { return expected_dloss_.has_value(); }
  const core::Tensor& counted_rows() const override { return count_; }
  // Rows whose largest logit is the label (engine::count_correct).
  core::Tensor count_correct(const core::Tensor& logits, const core::Tensor& labels,
                             const core::Stream& stream) override;
  // The last forward's path (Note [cross-entropy paths]): "fused in place",
  // "fused" (into a new tensor) or "f32"; "none" before any forward.
  const char* path() const { return path_; }
  // The counted rows whose first largest logit is the label, as the last
  // forward found them when it was fused (one-element f32 on the logits'
  // device; the logits may be overwritten since); undefined otherwise.
  const core::Tensor& fused_correct() const { return correct_; }

 private:
  core::Tensor fused_forward(const core::Tensor& logits, const core::Tensor& labels, bool in_place,
                             float dloss, Context& ctx);

  std::int64_t ignore_index_;
  float label_smoothing_;
  core::Tensor probs_, labels_, count_;
  core::Shape logits_shape_;
  DType logits_dtype_ = DType::f32;
  std::optional<float> expected_dloss_;  // for the next forward only
  core::Tensor dlogits_, correct_;       // a fused forward's
  float fused_dloss_ = 0.0f;             // the dloss dlogits_ is for
  const char* path_ = "none";
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
