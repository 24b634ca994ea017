// Losses that compare a prediction with a target element by element (mean
// squared error, L1, Huber, binary cross-entropy with logits), over f32
// prediction and target of n elements. The loss is the mean over the n
// elements (PyTorch's reduction 'mean'), summed in f64 in a fixed order; it is
// a one-element f32 output in the prediction's memory, so a GPU step needs no
// host synchronisation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/stream.h"

namespace lockstep::kernels {

enum class ElementwiseLossKind { mse, l1, huber, bce_with_logits };

struct ElementwiseLossShape {
  ElementwiseLossKind kind = ElementwiseLossKind::mse;
  std::int64_t n = 0;
  float huber_delta = 1.0f;  // Huber: quadratic below delta, linear above (PyTorch's HuberLoss)
};

namespace cpu {
// loss: f32[1], mean over the n elements.
void elementwise_loss_forward(const ElementwiseLossShape& s, const float* prediction,
                              const float* target, float* loss);
// dprediction = d loss / d prediction * dloss (the mean's 1/n included).
void elementwise_loss_backward(const ElementwiseLossShape& s, const float* prediction,
                               const float* target, float dloss, float* dprediction);
}  // namespace cpu

namespace cuda {
// Scratch the CUDA forward needs: one f64 partial sum per block.
std::size_t elementwise_loss_workspace_bytes(std::int64_t n);
void elementwise_loss_forward(const ElementwiseLossShape& s, const float* prediction,
                              const float* target, float* loss, void* workspace, CudaStream stream);
void elementwise_loss_backward(const ElementwiseLossShape& s, const float* prediction,
                               const float* target, float dloss, float* dprediction,
                               CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
