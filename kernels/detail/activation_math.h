// The activation formulas, shared by the CPU and CUDA kernels so that both
// compute the same f32 expressions (PyTorch's definitions), backward included.
#pragma once

#include <cmath>

#include "kernels/activation.h"
#include "kernels/detail/philox_block.h"  // LOCKSTEP_HOST_DEVICE

namespace lockstep::kernels::detail {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluCubic = 0.044715f;

LOCKSTEP_HOST_DEVICE float activation_value(Activation act, float x) {
  switch (act) {
    case Activation::relu:
      return x > 0.0f ? x : 0.0f;
    case Activation::gelu_exact:
      return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    case Activation::gelu_tanh:
      return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
  }
  return 0.0f;
}

// dx for one element: dy * act'(x). Note [relu backward selects]: ReLU's
// is PyTorch's threshold_backward, (x > 0 ? dy : 0), a select and not dy times
// a 0/1 derivative: an inf or NaN in dy of an inactive unit gives 0, not NaN,
// so an f16 overflow there skips no step on either backend.
LOCKSTEP_HOST_DEVICE float activation_gradient(Activation act, float dy, float x) {
  switch (act) {
    case Activation::relu:
      return x > 0.0f ? dy : 0.0f;
    case Activation::gelu_exact:
      return dy * (0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x));
    case Activation::gelu_tanh: {
      const float inner = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
      const float t = tanhf(inner);
      return dy * (0.5f * (1.0f + t) +
                   0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x));
    }
  }
  return 0.0f;
}

}  // namespace lockstep::kernels::detail
