// CPU activations (kernels/activation.h).
#include "kernels/activation.h"

#include <cmath>
#include <cstdint>

#include "kernels/detail/activation_math.h"
#include "kernels/detail/cpu_float.h"
#include "kernels/detail/vector_exp.h"

namespace lockstep::kernels::cpu {
namespace {

// Note [vector tanh]: libm's tanhf is a scalar call (through expm1f) that took
// 40% of a gpt-tiny training step. This is Cephes' tanhf written without
// branches or calls, so that GCC vectorises the f32 GELU(tanh) loops: for
// |x| < 0.625 the odd polynomial x + x^3 P(x^2), beyond it 1 - 2 / (e^2|x| + 1)
// with x's sign, e^y from kernels/detail/vector_exp.h (y clamped to 88,
// where tanh is 1 in f32). NaN stays NaN. Within 3e-7 relative of tanh
// (tests/kernels/test_elementwise.cpp). The f16/bf16 paths and CUDA keep tanhf.
// This file is built with -fno-trapping-math (kernels/CMakeLists.txt): with
// FP exceptions deemed observable GCC may not evaluate both sides of a select,
// and the loops stay scalar. lockstep never reads the FP exception flags.
[[gnu::always_inline]] inline float tanh_vectorisable(float x) {
  const float a = std::fabs(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = x + x * z * p;
  const float twice = 2.0f * a;
  const float e = detail::exp_in_range(twice < 88.0f ? twice : 88.0f);  // NaN: 88
  const float large = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  return x != x ? x : a < 0.625f ? small : large;
}

[[gnu::always_inline]] inline float gelu_tanh(float x) {
  return 0.5f * x *
         (1.0f + tanh_vectorisable(detail::kSqrt2OverPi * (x + detail::kGeluCubic * x * x * x)));
}

[[gnu::always_inline]] inline float gelu_tanh_derivative(float x) {
  const float t = tanh_vectorisable(detail::kSqrt2OverPi * (x + detail::kGeluCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * detail::kSqrt2OverPi *
                                 (1.0f + 3.0f * detail::kGeluCubic * x * x);
}

}  // namespace

float tanh_f32(float x) { return tanh_vectorisable(x); }

// Note [vector tanh]: an AVX2 clone besides the baseline one (chosen at load
// time); without FMA contraction (-std=c++20) both give the same bits.
[[gnu::target_clones("avx2", "default")]] void activation_forward(Activation act, const void* x,
                                                                  void* y, DType type,
                                                                  std::int64_t n) {
  detail::require_float(type, "activation_forward");
  if (type == DType::f32) {
    const auto* in = static_cast<const float*>(x);
    auto* out = static_cast<float*>(y);
    if (act == Activation::relu) {
      for (std::int64_t i = 0; i < n; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
      return;
    }
    if (act == Activation::gelu_tanh) {  // Note [vector tanh]
      for (std::int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(in[i]);
      return;
    }
    for (std::int64_t i = 0; i < n; ++i) out[i] = detail::activation_value(act, in[i]);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i)
    detail::store_f32(y, type, i, detail::activation_value(act, detail::load_f32(x, type, i)));
}

[[gnu::target_clones("avx2", "default")]] void activation_backward(Activation act, const void* dy,
                                                                   const void* x, void* dx,
                                                                   DType type, std::int64_t n) {
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
    if (act == Activation::gelu_tanh) {  // Note [vector tanh]
      for (std::int64_t i = 0; i < n; ++i) out[i] = g[i] * gelu_tanh_derivative(in[i]);
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
