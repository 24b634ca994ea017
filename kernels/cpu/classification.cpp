// CPU softmax cross-entropy and accuracy (kernels/classification.h). The
// softmax is kernels/detail/vector_softmax.h's, the attention's (vectorised
// f32 exponentials, f64 row sums; this file is built with -fno-trapping-math):
// libm's f64 exp per logit was the loss's whole cost at gpt2's 50,304 classes.
#include "kernels/classification.h"

#include <cmath>
#include <string>
#include <vector>

#include "kernels/detail/cpu_convert.h"
#include "kernels/detail/vector_softmax.h"
#include "kernels/error.h"

namespace lockstep::kernels::cpu {
namespace {

std::int64_t label_at(const ClassificationShape& s, const void* labels, std::int64_t i) {
  return s.label_type == DType::i32 ? static_cast<const std::int32_t*>(labels)[i]
                                    : static_cast<const std::int64_t*>(labels)[i];
}

// The label of row i, or -1 when the row is ignored; throws on out-of-range.
std::int64_t counted_label(const ClassificationShape& s, const void* labels, std::int64_t i) {
  const std::int64_t label = label_at(s, labels, i);
  if (label == s.ignore_index) return -1;
  if (label < 0 || label >= s.classes)
    throw InvalidArgument("cross-entropy: label " + std::to_string(label) + " of row " +
                          std::to_string(i) + " is outside [0, " + std::to_string(s.classes) +
                          ") (check the dataset's labels against the model's classes)");
  return label;
}

}  // namespace

// An AVX2 clone besides the baseline one, as the activations have (Note
// [vector tanh]): the same bits, 8 exponentials at a time.
namespace {

[[gnu::target_clones("avx2", "default")]] void softmax_xent_forward_clones(
    const ClassificationShape& s, const float* logits, const void* labels, float* probs,
    float* loss, float* count) {
  double total = 0.0;
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < s.rows; ++i) {
    const float* row = logits + i * s.classes;
    const detail::SoftmaxRow r = detail::softmax_row(row, 1.0f, s.classes, probs + i * s.classes);
    const std::int64_t label = counted_label(s, labels, i);
    if (label < 0) continue;
    // -log p_label, and with smoothing the mean over classes of -log p_c.
    const double lse = std::log(r.sum);
    double row_loss = lse - static_cast<double>(row[label] - r.max);
    if (s.label_smoothing > 0.0f) {
      double mean_shifted = 0.0;
      for (std::int64_t j = 0; j < s.classes; ++j) mean_shifted += row[j] - r.max;
      mean_shifted /= static_cast<double>(s.classes);
      row_loss = (1.0 - s.label_smoothing) * row_loss + s.label_smoothing * (lse - mean_shifted);
    }
    total += row_loss;
    ++counted;
  }
  *count = static_cast<float>(counted);
  *loss = counted ? static_cast<float>(total / static_cast<double>(counted)) : 0.0f;
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void softmax_xent_forward(const ClassificationShape& s, const float* logits, const void* labels,
                          float* probs, float* loss, float* count) {
  softmax_xent_forward_clones(s, logits, labels, probs, loss, count);
}

void softmax_xent_backward(const ClassificationShape& s, const float* probs, const void* labels,
                           const float* count, float dloss, float* dlogits) {
  const float scale = *count > 0 ? dloss / *count : 0.0f;
  const float off = s.label_smoothing / static_cast<float>(s.classes);
  const float on = 1.0f - s.label_smoothing + off;
  for (std::int64_t i = 0; i < s.rows; ++i) {
    const std::int64_t label = counted_label(s, labels, i);
    for (std::int64_t j = 0; j < s.classes; ++j) {
      const std::int64_t k = i * s.classes + j;
      dlogits[k] = label < 0 ? 0.0f : (probs[k] - (j == label ? on : off)) * scale;
    }
  }
}

void count_correct(const ClassificationShape& s, const float* logits, const void* labels,
                   float* correct) {
  std::int64_t hits = 0;
  for (std::int64_t i = 0; i < s.rows; ++i) {
    const std::int64_t label = counted_label(s, labels, i);
    if (label < 0) continue;
    const float* row = logits + i * s.classes;
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < s.classes; ++j)
      if (row[j] > row[best]) best = j;
    hits += best == label;
  }
  *correct = static_cast<float>(hits);
}

// The composition Note [fused cross-entropy] defines; every step is an op
// above or a conversion of kernels/half.h, so its bits are the unfused path's.
void softmax_xent_fused(const ClassificationShape& s, DType logits_type, const void* logits,
                        const void* labels, float dloss, void* dlogits, float* loss, float* count,
                        float* correct) {
  if (logits_type != DType::f32 && logits_type != DType::f16 && logits_type != DType::bf16)
    throw InvalidArgument(std::string("cross-entropy: logits are ") + dtype_name(logits_type) +
                          ", expected f32, f16 or bf16");
  const std::int64_t n = s.rows * s.classes;
  std::vector<float> x(static_cast<std::size_t>(n)), probs(static_cast<std::size_t>(n));
  detail::widen(logits, logits_type, n, x.data());
  softmax_xent_forward(s, x.data(), labels, probs.data(), loss, count);
  if (correct) count_correct(s, x.data(), labels, correct);
  softmax_xent_backward(s, probs.data(), labels, count, dloss, probs.data());
  detail::narrow(probs.data(), n, logits_type, dlogits);
}

}  // namespace lockstep::kernels::cpu
