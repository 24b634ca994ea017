// CPU activations (kernels/activation.h).
#include "kernels/activation.h"

#include "kernels/detail/activation_math.h"
#include "kernels/detail/cpu_float.h"

namespace lockstep::kernels::cpu {

void activation_forward(Activation act, const void* x, void* y, DType type, std::int64_t n) {
  detail::require_float(type, "activation_forward");
  if (type == DType::f32) {
    const auto* in = static_cast<const float*>(x);
    auto* out = static_cast<float*>(y);
    if (act == Activation::relu) {
      for (std::int64_t i = 0; i < n; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
      return;
    }
    for (std::int64_t i = 0; i < n; ++i) out[i] = detail::activation_value(act, in[i]);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i)
    detail::store_f32(y, type, i, detail::activation_value(act, detail::load_f32(x, type, i)));
}

void activation_backward(Activation act, const void* dy, const void* x, void* dx, DType type,
                         std::int64_t n) {
  detail::require_float(type, "activation_backward");
  if (type == DType::f32) {
    const auto *g = static_cast<const float*>(dy), *in = static_cast<const float*>(x);
    auto* out = static_cast<float*>(dx);
    if (act == Activation::relu) {  // Note [relu backward selects], branch-free for the vectoriser
      // g[i] is loaded whatever the sign: a load under the condition may not
      // be speculated, so GCC would emit a scalar loop with a branch that
      // mispredicts on about half the elements (ten times slower).
      for (std::int64_t i = 0; i < n; ++i) {
        const float gi = g[i];
        out[i] = in[i] > 0.0f ? gi : 0.0f;
      }
      return;
    }
    for (std::int64_t i = 0; i < n; ++i) out[i] = detail::activation_gradient(act, g[i], in[i]);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const float gradient = detail::activation_gradient(act, detail::load_f32(dy, type, i),
                                                       detail::load_f32(x, type, i));
    detail::store_f32(dx, type, i, gradient);
  }
}

}  // namespace lockstep::kernels::cpu
