// Cross-entropy, MSE and accuracy (engine/nn/loss.h).
#include "engine/nn/loss.h"

#include <string>
#include <utility>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "kernels/classification.h"

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
  return {logits.dim(0), logits.dim(1), ignore_index, labels.dtype()};
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

core::Tensor CrossEntropyLoss::forward(const core::Tensor& logits_in, const core::Tensor& labels_in,
                                       Context& ctx) {
  // Named tensors, not a structured binding: lambdas below capture them, which
  // clang 14 (the fuzz build) does not allow for bindings.
  const auto rows = as_rows(logits_in, labels_in);
  const core::Tensor& logits = rows.first;
  const core::Tensor& labels = rows.second;
  logits_shape_ = logits_in.shape();
  const auto s = classification_shape("CrossEntropyLoss", logits, labels, ignore_index_);
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

core::Tensor CrossEntropyLoss::backward(float dloss, Context& ctx) {
  if (!probs_.defined())
    throw InvalidArgument(
        "CrossEntropyLoss: backward without a forward (run forward once before each backward)");
  const auto s = classification_shape("CrossEntropyLoss", probs_, labels_, ignore_index_);
  core::Tensor dlogits =
      core::Tensor::empty(probs_.shape(), DType::f32, probs_.device(), ctx.stream);
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

core::Tensor MSELoss::forward(const core::Tensor& prediction, const core::Tensor& target,
                              Context& ctx) {
  if (prediction.shape() != target.shape())
    throw InvalidArgument("MSELoss: prediction " + core::shape_str(prediction.shape()) +
                          " and target " + core::shape_str(target.shape()) +
                          " differ in shape (give the target the prediction's shape)");
  prediction_dtype_ = prediction.dtype();
  diff_ = prediction.cast(DType::f32, ctx.stream);  // always a fresh tensor: axpy writes it
  core::ops::axpy(-1.0f, as_f32(target, ctx.stream), diff_, ctx.stream);
  core::Tensor loss = core::ops::sum_squares(diff_, ctx.stream);
  core::ops::scale(loss, 1.0f / static_cast<float>(std::max<std::int64_t>(1, diff_.numel())),
                   ctx.stream);
  return loss;
}

core::Tensor MSELoss::backward(float dloss, Context& ctx) {
  if (!diff_.defined())
    throw InvalidArgument(
        "MSELoss: backward without a forward (run forward once before each backward)");
  core::Tensor grad = diff_;  // d/dp mean((p - t)^2) = 2 (p - t) / n
  core::ops::scale(grad, 2.0f * dloss / static_cast<float>(std::max<std::int64_t>(1, grad.numel())),
                   ctx.stream);
  diff_ = core::Tensor();
  return prediction_dtype_ == DType::f32 ? grad : grad.cast(prediction_dtype_, ctx.stream);
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
