// The elementwise loss formulas, shared by the CPU and CUDA kernels so that
// both compute the same f32 expressions (PyTorch's definitions of MSELoss,
// L1Loss, HuberLoss and BCEWithLogitsLoss), the derivative included.
#pragma once

#include <cmath>

#include "kernels/detail/philox_block.h"  // LOCKSTEP_HOST_DEVICE
#include "kernels/elementwise_loss.h"

namespace lockstep::kernels::detail {

// The loss of one element, before the mean.
LOCKSTEP_HOST_DEVICE float elementwise_loss_value(const ElementwiseLossShape& s, float p, float t) {
  const float d = p - t;
  switch (s.kind) {
    case ElementwiseLossKind::mse:
      return d * d;
    case ElementwiseLossKind::l1:
      return fabsf(d);
    case ElementwiseLossKind::huber:
      return fabsf(d) <= s.huber_delta ? 0.5f * d * d
                                       : s.huber_delta * (fabsf(d) - 0.5f * s.huber_delta);
    case ElementwiseLossKind::bce_with_logits:
      // max(p, 0) - p t + log(1 + exp(-|p|)): no overflow for any logit.
      return fmaxf(p, 0.0f) - p * t + log1pf(expf(-fabsf(p)));
  }
  return 0.0f;
}

// d loss / d p of one element, before the mean. L1's is 0 at d = 0, as
// PyTorch's sign(); Huber's is d inside the delta and delta sign(d) outside.
LOCKSTEP_HOST_DEVICE float elementwise_loss_derivative(const ElementwiseLossShape& s, float p,
                                                       float t) {
  const float d = p - t;
  switch (s.kind) {
    case ElementwiseLossKind::mse:
      return 2.0f * d;
    case ElementwiseLossKind::l1:
      return d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f);
    case ElementwiseLossKind::huber:
      return d > s.huber_delta ? s.huber_delta : (d < -s.huber_delta ? -s.huber_delta : d);
    case ElementwiseLossKind::bce_with_logits:
      return 1.0f / (1.0f + expf(-p)) - t;
  }
  return 0.0f;
}

}  // namespace lockstep::kernels::detail
