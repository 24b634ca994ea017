// The data-parallel step's gradient checks (engine/zero.h).
#include "engine/zero.h"

#include <cmath>

#include "engine/optim/clip.h"

namespace lockstep::engine {

void measure_gradients(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                       LossScaler& scaler, StepReadback& readback, const core::Stream& stream) {
  scaler.unscale(grads, ranges, readback.nonfinite(), stream);
  enqueue_sum_squares(grads, ranges, readback.sum_squares(), readback.workspace(), stream);
}

GradientPayload gradient_payload(const StepReadback::Values& values) {
  return {values.nonfinite ? 1.0 : 0.0, sum_in_order(values.sum_squares)};
}

GradientCheck decide_gradients(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                               LossScaler& scaler, double max_grad_norm,
                               const GradientPayload& global, const core::Stream& stream) {
  GradientCheck check;
  check.clean = scaler.update_with(global[0] > 0.0);
  check.grad_norm = check.clean ? std::sqrt(global[1]) : NAN;
  if (check.clean && max_grad_norm > 0)
    clip_to_norm(grads, ranges, check.grad_norm, max_grad_norm, stream);
  return check;
}

}  // namespace lockstep::engine
