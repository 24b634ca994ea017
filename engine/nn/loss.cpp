// The built-in losses and the accuracy metric (engine/nn/loss.h).
#include "engine/nn/loss.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "engine/kernel_paths.h"
#include "kernels/classification.h"
#include "kernels/elementwise_loss.h"
#include "kernels/fusion.h"

namespace lockstep::engine {
namespace {

kernels::ClassificationShape classification_shape(const char* who, const core::Tensor& logits,
                                                  const core::Tensor& labels,
                                                  std::int64_t ignore_index) {
  if (logits.shape().size() != 2)
    throw InvalidArgument(std::string(who) + ": logits have shape " +
                          core::shape_str(logits.shape()) + ", expected [rows, classes]");
  if (labels.shape() != core::Shape{logits.dim(0)} ||
      (labels.dtype() != DType::i64 && labels.dtype() != DType::i32))
    throw InvalidArgument(std::string(who) + ": labels are " + core::shape_str(labels.shape()) +
                          " " + dtype_name(labels.dtype()) + ", expected [" +
                          std::to_string(logits.dim(0)) + "] i64 or i32");
  if (!(labels.device() == logits.device()))
    throw InvalidArgument(std::string(who) + ": labels on " + labels.device().str() +
                          ", logits on " + logits.device().str());
  return {logits.dim(0), logits.dim(1), ignore_index, labels.dtype(), 0.0f};
}

// Logits [d0, ..., classes] with labels [d0, ...] (a language model's
// [batch, seq, vocab] and [batch, seq]) as the [rows, classes] and [rows] the
// kernels take; anything else is left for classification_shape to reject.
std::pair<core::Tensor, core::Tensor> as_rows(const core::Tensor& logits,
                                              const core::Tensor& labels) {
  const core::Shape& ls = logits.shape();
  if (ls.size() <= 2 || labels.shape() != core::Shape(ls.begin(), ls.end() - 1))
    return {logits, labels};
  return {logits.reshape({labels.numel(), ls.back()}), labels.reshape({labels.numel()})};
}

core::Tensor as_f32(const core::Tensor& t, const core::Stream& stream) {
  return t.dtype() == DType::f32 ? t : t.cast(DType::f32, stream);
}

}  // namespace

CrossEntropyLoss::CrossEntropyLoss(std::int64_t ignore_index, float label_smoothing)
    : ignore_index_(ignore_index), label_smoothing_(label_smoothing) {
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
    throw InvalidArgument(
        fmt::format("CrossEntropyLoss: label_smoothing is {}; it must lie in [0, 1] (0: none)",
                    label_smoothing));
}

std::string CrossEntropyLoss::describe() const {
  return fmt::format("cross-entropy ignore_index={} label_smoothing={}", ignore_index_,
                     label_smoothing_);
}

core::Tensor CrossEntropyLoss::forward(const core::Tensor& logits_in, const core::Tensor& labels_in,
                                       Context& ctx) {
  const std::optional<float> dloss = std::exchange(expected_dloss_, std::nullopt);
  // Counted before as_rows adds holders of its own: 1 is the caller's tensor
  // alone, which Note [gradient in the forward] lets the loss overwrite.
  const bool only_holder = logits_in.defined() && logits_in.storage().use_count() == 1;
  probs_ = labels_ = dlogits_ = correct_ = core::Tensor();
  // Named tensors, not a structured binding: lambdas below capture them, which
  // clang 14 (the fuzz build) does not allow for bindings.
  const auto rows = as_rows(logits_in, labels_in);
  const core::Tensor& logits = rows.first;
  const core::Tensor& labels = rows.second;
  logits_shape_ = logits_in.shape();
  // Note [cross-entropy paths]: fused on CUDA for f16/bf16 with a backward announced.
  const bool low = logits.dtype() == DType::bf16 || logits.dtype() == DType::f16;
  if (dloss && logits.device().is_cuda() && kernels::fused_kernels() && low)
    return fused_forward(logits, labels, only_holder, *dloss, ctx);
  path_ = "f32";
  if (dloss && logits.device().is_cuda())  // Note [kernel paths]: a training forward's
    note_kernel_path(
        "cross-entropy", path_,
        low ? "turned off (kernels::set_fused_kernels)" : "f32 logits (autocast f16/bf16 fuses)");
  auto s = classification_shape("CrossEntropyLoss", logits, labels, ignore_index_);
  s.label_smoothing = label_smoothing_;
  const core::Tensor x = as_f32(logits, ctx.stream);
  const core::Device device = x.device();
  probs_ = core::Tensor::empty(x.shape(), DType::f32, device, ctx.stream);
  count_ = core::Tensor::empty({1}, DType::f32, device, ctx.stream);
  core::Tensor loss = core::Tensor::empty({1}, DType::f32, device, ctx.stream);
  const float* in = x.data_as<float>();
  float *probs = probs_.data_as<float>(), *out = loss.data_as<float>(),
        *count = count_.data_as<float>();
  core::dispatch(
      device, ctx.stream,
      [&] { kernels::cpu::softmax_xent_forward(s, in, labels.data(), probs, out, count); },
      [&](kernels::CudaStream stream) {
        core::Tensor workspace = core::Tensor::empty({2 * s.rows}, DType::f32, device, ctx.stream);
        kernels::cuda::softmax_xent_forward(s, in, labels.data(), probs, out, count,
                                            workspace.data(), stream);
      });
  labels_ = labels;
  logits_dtype_ = logits.dtype();
  return loss;
}

core::Tensor CrossEntropyLoss::fused_forward(const core::Tensor& logits, const core::Tensor& labels,
                                             bool in_place, float dloss, Context& ctx) {
  auto s = classification_shape("CrossEntropyLoss", logits, labels, ignore_index_);
  s.label_smoothing = label_smoothing_;
  const core::Device device = logits.device();
  // In place, a gpt2 step keeps one bf16 [rows, classes] tensor here (824 MB
  // at 8192 x 50304) where the f32 path kept the logits, an f32 copy and the
  // f32 probabilities (4.1 GB).
  dlogits_ =
      in_place ? logits : core::Tensor::empty(logits.shape(), logits.dtype(), device, ctx.stream);
  count_ = core::Tensor::empty({1}, DType::f32, device, ctx.stream);
  correct_ = core::Tensor::empty({1}, DType::f32, device, ctx.stream);
  core::Tensor loss = core::Tensor::empty({1}, DType::f32, device, ctx.stream);
  const DType type = logits.dtype();
  const void* in = logits.data();
  void* out = dlogits_.data();
  float *loss_out = loss.data_as<float>(), *count = count_.data_as<float>(),
        *correct = correct_.data_as<float>();
  core::dispatch(
      device, ctx.stream,
      [&] {
        kernels::cpu::softmax_xent_fused(s, type, in, labels.data(), dloss, out, loss_out, count,
                                         correct);
      },
      [&](kernels::CudaStream stream) {
        const auto words =
            static_cast<std::int64_t>((kernels::cuda::fused_xent_workspace_bytes(s.rows) + 3) / 4);
        core::Tensor workspace = core::Tensor::empty({words}, DType::f32, device, ctx.stream);
        kernels::cuda::softmax_xent_fused(s, type, in, labels.data(), dloss, out, loss_out, count,
                                          correct, workspace.data(), stream);
      });
  fused_dloss_ = dloss;
  logits_dtype_ = type;
  path_ = in_place ? "fused in place" : "fused";
  if (device.is_cuda())
    note_kernel_path("cross-entropy", path_, in_place ? "" : "the logits have another holder");
  core::trace::instant(in_place ? "cross-entropy fused in place" : "cross-entropy fused", "loss");
  return loss;
}

core::Tensor CrossEntropyLoss::backward(float dloss, Context& ctx) {
  if (dlogits_.defined()) {  // Note [cross-entropy paths]: the fused forward's gradient
    if (dloss != fused_dloss_)
      throw InvalidArgument(fmt::format(
          "CrossEntropyLoss: backward(dloss={}) after a forward that computed the gradient for "
          "dloss={} (expect_backward's); announce the dloss that backward will be given",
          dloss, fused_dloss_));
    core::Tensor dlogits = dlogits_.reshape(logits_shape_);
    dlogits_ = core::Tensor();
    return dlogits;
  }
  if (!probs_.defined())
    throw InvalidArgument(
        "CrossEntropyLoss: backward without a forward (run forward once before each backward)");
  auto s = classification_shape("CrossEntropyLoss", probs_, labels_, ignore_index_);
  s.label_smoothing = label_smoothing_;
  // In place: the probabilities become dlogits, so a step keeps one f32
  // [rows, classes] tensor here, not two (3.3 GB each for gpt2 at 16K rows).
  core::Tensor dlogits = probs_;
  const float *probs = probs_.data_as<float>(), *count = count_.data_as<float>();
  float* out = dlogits.data_as<float>();
  core::dispatch(
      probs_.device(), ctx.stream,
      [&] { kernels::cpu::softmax_xent_backward(s, probs, labels_.data(), count, dloss, out); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::softmax_xent_backward(s, probs, labels_.data(), count, dloss, out, stream);
      });
  probs_ = labels_ = core::Tensor();
  dlogits = dlogits.reshape(logits_shape_);
  return logits_dtype_ == DType::f32 ? dlogits : dlogits.cast(logits_dtype_, ctx.stream);
}

core::Tensor CrossEntropyLoss::count_correct(const core::Tensor& logits, const core::Tensor& labels,
                                             const core::Stream& stream) {
  return engine::count_correct(logits, labels, stream, ignore_index_);
}

namespace {

const char* elementwise_loss_name(kernels::ElementwiseLossKind kind) {
  switch (kind) {
    case kernels::ElementwiseLossKind::mse:
      return "mse";
    case kernels::ElementwiseLossKind::l1:
      return "l1";
    case kernels::ElementwiseLossKind::huber:
      return "huber";
    case kernels::ElementwiseLossKind::bce_with_logits:
      return "bce";
  }
  return "?";
}

}  // namespace

ElementwiseLoss::ElementwiseLoss(kernels::ElementwiseLossKind kind, float huber_delta) {
  shape_.kind = kind;
  shape_.huber_delta = huber_delta;
  if (kind == kernels::ElementwiseLossKind::huber && !(huber_delta > 0.0f))
    throw InvalidArgument(fmt::format(
        "HuberLoss: delta is {}; it must be positive (1 is PyTorch's default)", huber_delta));
}

std::string ElementwiseLoss::describe() const {
  return shape_.kind == kernels::ElementwiseLossKind::huber
             ? fmt::format("huber delta={}", shape_.huber_delta)
             : elementwise_loss_name(shape_.kind);
}

core::Tensor ElementwiseLoss::forward(const core::Tensor& prediction, const core::Tensor& target,
                                      Context& ctx) {
  const std::string who = describe() + " loss";
  if (prediction.shape().empty() || prediction.shape() != target.shape())
    throw InvalidArgument(fmt::format(
        "{}: prediction {} and target {} differ in shape (targets [rows, ...] of the model "
        "output's shape; a class index per row needs --loss cross-entropy)",
        who, core::shape_str(prediction.shape()), core::shape_str(target.shape())));
  if (!is_floating(target.dtype()) || !is_floating(prediction.dtype()))
    throw InvalidArgument(fmt::format(
        "{}: prediction is {} and target {}; both must be f32, f16 or bf16 (give float targets)",
        who, dtype_name(prediction.dtype()), dtype_name(target.dtype())));
  if (!(prediction.device() == target.device()))
    throw InvalidArgument(fmt::format("{}: target on {}, prediction on {}", who,
                                      target.device().str(), prediction.device().str()));
  prediction_dtype_ = prediction.dtype();
  prediction_ = as_f32(prediction, ctx.stream);
  target_ = as_f32(target, ctx.stream);
  kernels::ElementwiseLossShape s = shape_;
  s.n = prediction_.numel();
  const core::Device device = prediction_.device();
  core::Tensor loss = core::Tensor::empty({1}, DType::f32, device, ctx.stream);
  rows_ = core::Tensor::empty({1}, DType::f32, device, ctx.stream);
  rows_.fill_(static_cast<double>(prediction.dim(0)), ctx.stream);
  const float *p = prediction_.data_as<float>(), *t = target_.data_as<float>();
  float* out = loss.data_as<float>();
  core::dispatch(
      device, ctx.stream, [&] { kernels::cpu::elementwise_loss_forward(s, p, t, out); },
      [&](kernels::CudaStream stream) {
        const auto words = static_cast<std::int64_t>(
            (kernels::cuda::elementwise_loss_workspace_bytes(s.n) + 3) / 4);
        core::Tensor workspace = core::Tensor::empty({words}, DType::f32, device, ctx.stream);
        kernels::cuda::elementwise_loss_forward(s, p, t, out, workspace.data(), stream);
      });
  return loss;
}

core::Tensor ElementwiseLoss::backward(float dloss, Context& ctx) {
  if (!prediction_.defined())
    throw InvalidArgument(describe() +
                          " loss: backward without a forward (run forward once before each "
                          "backward)");
  kernels::ElementwiseLossShape s = shape_;
  s.n = prediction_.numel();
  core::Tensor grad =
      core::Tensor::empty(prediction_.shape(), DType::f32, prediction_.device(), ctx.stream);
  const float *p = prediction_.data_as<float>(), *t = target_.data_as<float>();
  float* out = grad.data_as<float>();
  core::dispatch(
      prediction_.device(), ctx.stream,
      [&] { kernels::cpu::elementwise_loss_backward(s, p, t, dloss, out); },
      [&](kernels::CudaStream stream) {
        kernels::cuda::elementwise_loss_backward(s, p, t, dloss, out, stream);
      });
  prediction_ = target_ = core::Tensor();
  return prediction_dtype_ == DType::f32 ? grad : grad.cast(prediction_dtype_, ctx.stream);
}

core::Tensor Loss::forward_named(const core::NamedTensors& outputs, const core::NamedTensors& batch,
                                 Context& ctx) {
  const std::string who = "loss '" + describe() + "'";
  return forward(outputs.at("output", who + " reads the model's output"),
                 batch.at("targets", who + " reads the batch's targets"), ctx);
}

core::NamedTensors Loss::backward_named(float dloss, Context& ctx) {
  return {{"output", backward(dloss, ctx)}};
}

core::Tensor Loss::count_correct_named(const core::NamedTensors& outputs,
                                       const core::NamedTensors& batch,
                                       const core::Stream& stream) {
  const std::string who = "loss '" + describe() + "'";
  return count_correct(outputs.at("output", who + " reads the model's output"),
                       batch.at("targets", who + " reads the batch's targets"), stream);
}

WeightedLosses::WeightedLosses(std::vector<Term> terms) : terms_(std::move(terms)) {
  if (terms_.empty())
    throw InvalidArgument("WeightedLosses: no terms (give at least one {loss, output, target})");
  for (std::size_t i = 0; i < terms_.size(); ++i) {
    if (!terms_[i].loss)
      throw InvalidArgument(fmt::format("WeightedLosses: term {} ('{}' against '{}') has no loss",
                                        i, terms_[i].output, terms_[i].target));
    if (!std::isfinite(terms_[i].weight))
      throw InvalidArgument(
          fmt::format("WeightedLosses: term {} ({}) has weight {}; give a finite "
                      "weight",
                      i, terms_[i].loss->describe(), terms_[i].weight));
  }
}

std::string WeightedLosses::describe() const {
  std::string out;
  for (const Term& t : terms_)
    out += fmt::format("{}{}*{}({}, {})", out.empty() ? "" : " + ", t.weight, t.loss->describe(),
                       t.output, t.target);
  return out;
}

core::Tensor WeightedLosses::forward(const core::Tensor&, const core::Tensor&, Context&) {
  throw InvalidArgument(
      "WeightedLosses: forward(output, targets) has no names to read; call "
      "forward_named(outputs, batch, ctx), as the step and the Trainer do");
}

core::Tensor WeightedLosses::backward(float, Context&) {
  throw InvalidArgument(
      "WeightedLosses: backward(dloss) gives one gradient per output; call "
      "backward_named(dloss, ctx), as the step and the Trainer do");
}

void WeightedLosses::expect_backward(float dloss) {
  for (const Term& t : terms_) {
    const auto readers = std::count_if(terms_.begin(), terms_.end(),
                                       [&](const Term& u) { return u.output == t.output; });
    if (readers == 1) t.loss->expect_backward(dloss * t.weight);
  }
}

void WeightedLosses::cancel_expected_backward() {
  for (const Term& t : terms_) t.loss->cancel_expected_backward();
}

const core::Tensor& WeightedLosses::counted_rows() const {
  return terms_.front().loss->counted_rows();
}

core::Tensor WeightedLosses::forward_named(const core::NamedTensors& outputs,
                                           const core::NamedTensors& batch, Context& ctx) {
  term_losses_.clear();
  core::Tensor total;
  for (std::size_t i = 0; i < terms_.size(); ++i) {
    const Term& t = terms_[i];
    const std::string who = fmt::format("WeightedLosses term {} ({})", i, t.loss->describe());
    core::Tensor loss = t.loss->forward(outputs.at(t.output, who + " reads the model's output"),
                                        batch.at(t.target, who + " reads the batch"), ctx);
    if (!total.defined()) {
      total = core::Tensor::empty({1}, DType::f32, loss.device(), ctx.stream);
      core::ops::fill(total, 0.0, ctx.stream);
    }
    core::ops::axpy(t.weight, loss, total, ctx.stream);
    term_losses_.push_back(std::move(loss));
  }
  return total;
}

core::NamedTensors WeightedLosses::backward_named(float dloss, Context& ctx) {
  core::NamedTensors grads;
  for (const Term& t : terms_) {
    core::Tensor g = t.loss->backward(dloss * t.weight, ctx);
    if (const core::Tensor* earlier = grads.find(t.output)) {
      core::Tensor sum = core::Tensor::empty(g.shape(), g.dtype(), g.device(), ctx.stream);
      core::ops::add(*earlier, g, sum, ctx.stream);
      g = sum;
    }
    grads.set(t.output, g);
  }
  return grads;
}

core::Tensor WeightedLosses::count_correct_named(const core::NamedTensors& outputs,
                                                 const core::NamedTensors& batch,
                                                 const core::Stream& stream) {
  for (const Term& t : terms_) {
    const std::string who = "WeightedLosses term " + t.loss->describe();
    core::Tensor correct =
        t.loss->count_correct(outputs.at(t.output, who), batch.at(t.target, who), stream);
    if (correct.defined()) return correct;
  }
  return {};
}

std::unique_ptr<Loss> make_loss(const std::string& name) {
  if (name == "cross-entropy") return std::make_unique<CrossEntropyLoss>();
  if (name == "mse") return std::make_unique<MSELoss>();
  if (name == "l1") return std::make_unique<L1Loss>();
  if (name == "huber") return std::make_unique<HuberLoss>();
  if (name == "bce") return std::make_unique<BCEWithLogitsLoss>();
  throw InvalidArgument("unknown loss '" + name +
                        "' (choose cross-entropy, mse, l1, huber or bce)");
}

core::Tensor count_correct(const core::Tensor& logits_in, const core::Tensor& labels_in,
                           const core::Stream& stream, std::int64_t ignore_index) {
  // Named tensors, not a structured binding: lambdas below capture them, which
  // clang 14 (the fuzz build) does not allow for bindings.
  const auto rows = as_rows(logits_in, labels_in);
  const core::Tensor& logits = rows.first;
  const core::Tensor& labels = rows.second;
  const auto s = classification_shape("count_correct", logits, labels, ignore_index);
  const core::Tensor x = as_f32(logits, stream);
  core::Tensor correct = core::Tensor::empty({1}, DType::f32, x.device(), stream);
  const float* in = x.data_as<float>();
  float* out = correct.data_as<float>();
  core::dispatch(
      x.device(), stream, [&] { kernels::cpu::count_correct(s, in, labels.data(), out); },
      [&](kernels::CudaStream cuda_stream) {
        core::Tensor workspace = core::Tensor::empty({2 * s.rows}, DType::f32, x.device(), stream);
        kernels::cuda::count_correct(s, in, labels.data(), out, workspace.data(), cuda_stream);
      });
  return correct;
}

}  // namespace lockstep::engine
