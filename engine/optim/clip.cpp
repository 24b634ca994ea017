// Gradient norm and clipping (engine/optim/clip.h).
#include "engine/optim/clip.h"

#include <cmath>
#include <string>

#include "engine/core/ops.h"

namespace lockstep::engine {

double grad_norm(const core::Tensor& grads, const core::Stream& stream) {
  if (grads.dtype() != DType::f32)
    throw InvalidArgument(std::string("grad_norm: gradients are ") + dtype_name(grads.dtype()) +
                          ", expected the f32 flat gradient buffer");
  const core::Tensor sum_squares = core::ops::sum_squares(grads, stream);
  float value = 0.0f;
  sum_squares.copy_to_host(&value, stream);
  return std::sqrt(static_cast<double>(value));
}

double clip_grad_norm(core::Tensor& grads, double max_norm, const core::Stream& stream) {
  if (!(max_norm > 0.0))
    throw InvalidArgument("clip_grad_norm: max_norm " + std::to_string(max_norm) + " must be > 0");
  const double norm = grad_norm(grads, stream);
  const double clip_coef = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && clip_coef < 1.0)
    core::ops::scale(grads, static_cast<float>(clip_coef), stream);
  return norm;
}

}  // namespace lockstep::engine
