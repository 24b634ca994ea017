// CPU elementwise losses (kernels/elementwise_loss.h): the shared formulas of
// kernels/detail/elementwise_loss_math.h, summed in f64 in element order.
#include "kernels/elementwise_loss.h"

#include "kernels/detail/elementwise_loss_math.h"

namespace lockstep::kernels::cpu {

void elementwise_loss_forward(const ElementwiseLossShape& s, const float* prediction,
                              const float* target, float* loss) {
  double total = 0.0;
  for (std::int64_t i = 0; i < s.n; ++i)
    total += detail::elementwise_loss_value(s, prediction[i], target[i]);
  *loss = s.n > 0 ? static_cast<float>(total / static_cast<double>(s.n)) : 0.0f;
}

void elementwise_loss_backward(const ElementwiseLossShape& s, const float* prediction,
                               const float* target, float dloss, float* dprediction) {
  const float scale = s.n > 0 ? dloss / static_cast<float>(s.n) : 0.0f;
  for (std::int64_t i = 0; i < s.n; ++i)
    dprediction[i] = detail::elementwise_loss_derivative(s, prediction[i], target[i]) * scale;
}

}  // namespace lockstep::kernels::cpu
