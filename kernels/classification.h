// Softmax cross-entropy and accuracy over f32 logits [rows, classes] with
// integer labels (i64 or i32) [rows]. Rows whose label is ignore_index do not
// count: the loss is the mean over the counted rows (PyTorch's reduction
// 'mean' with ignore_index). With label_smoothing e the target of a counted
// row is (1 - e) onehot(label) + e / classes (PyTorch's label_smoothing). Results are one-element
// f32 outputs in the logits' memory, so a GPU step needs no host synchronisation.
//
// A label outside [0, classes) that is not ignore_index is an error on the
// CPU; on CUDA (which cannot throw from a kernel) such a row is not counted,
// and the data loader is what checks labels against the model's classes.
//
// softmax_xent_fused is the loss, its gradient and the accuracy in one call
// over logits of their own dtype (Note [fused cross-entropy]).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

struct ClassificationShape {
  std::int64_t rows = 0;
  std::int64_t classes = 0;
  std::int64_t ignore_index = -100;
  DType label_type = DType::i64;
  float label_smoothing = 0.0f;  // in [0, 1]
};

namespace cpu {
// probs: softmax of the logits, kept for backward. loss and count: f32[1].
void softmax_xent_forward(const ClassificationShape& s, const float* logits, const void* labels,
                          float* probs, float* loss, float* count);
// dlogits = (probs - target) * dloss / count on counted rows, 0 elsewhere;
// dlogits may be probs (each element is read, then written, by one thread).
void softmax_xent_backward(const ClassificationShape& s, const float* probs, const void* labels,
                           const float* count, float dloss, float* dlogits);
// correct: f32[1], rows whose largest logit (first on ties) is the label.
void count_correct(const ClassificationShape& s, const float* logits, const void* labels,
                   float* correct);

// Note [fused cross-entropy]: llm.c's fused classifier. One call takes logits
// [rows, classes] of `logits_type` (f32, f16 or bf16), the labels and dloss
// (the gradient of the objective with respect to the mean loss, known before
// the forward: the step's loss scale / micro-batches), and writes
//   loss, count: as softmax_xent_forward (count: rows not ignored);
//   correct:     as count_correct, of the logits as given (nullptr: not wanted);
//   dlogits:     as softmax_xent_backward's dlogits, rounded to logits_type
//                (to nearest even), which is what the unfused composition
//                forward -> backward -> cast gives.
// dlogits is logits (in place: every statistic of a row, its max, f64 sum of
// exponentials, label logit, argmax and f64 sum of logits for smoothing, is
// taken before any of it is written) or does not overlap them. This CPU
// version is that composition (widen to f32, softmax_xent_forward,
// count_correct, softmax_xent_backward, narrow): the reference the CUDA
// kernel is held to (tests/gpu/test_gpu_fused_xent.cpp), which differs from
// it by its exponentials' ulps before the rounding to logits_type.
void softmax_xent_fused(const ClassificationShape& s, DType logits_type, const void* logits,
                        const void* labels, float dloss, void* dlogits, float* loss, float* count,
                        float* correct);
}  // namespace cpu

namespace cuda {
// Scratch the CUDA forward and count_correct need: 2 * rows f32 values.
inline std::size_t classification_workspace_bytes(std::int64_t rows) {
  return static_cast<std::size_t>(2 * rows) * sizeof(float);
}
void softmax_xent_forward(const ClassificationShape& s, const float* logits, const void* labels,
                          float* probs, float* loss, float* count, void* workspace,
                          CudaStream stream);
void softmax_xent_backward(const ClassificationShape& s, const float* probs, const void* labels,
                           const float* count, float dloss, float* dlogits, CudaStream stream);
void count_correct(const ClassificationShape& s, const float* logits, const void* labels,
                   float* correct, void* workspace, CudaStream stream);

// Note [fused cross-entropy], on the device: a one-block pre-pass counts the
// labels (the gradient's scale is dloss / count), one 256-thread block per row
// reads the row once for its statistics (16-byte loads from the row's first
// 16-byte boundary, scalar head and tail: any classes, any row alignment) and
// once more to write the gradient, and one block adds the rows' losses and hits
// in a fixed order (f64). Deterministic; no f32 copy of the logits, no host
// synchronisation. rows must be below 2^31 (one block each).
inline std::size_t fused_xent_workspace_bytes(std::int64_t rows) {
  return static_cast<std::size_t>(3 * rows) * sizeof(float);
}
void softmax_xent_fused(const ClassificationShape& s, DType logits_type, const void* logits,
                        const void* labels, float dloss, void* dlogits, float* loss, float* count,
                        float* correct, void* workspace, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
