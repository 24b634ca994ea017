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
// 40% of a gpt-tiny training step. GELU(tanh) is computed instead through
// 0.5 (1 + tanh u) = sigmoid(2u) = 1 / (1 + e^-2u), u = sqrt(2/pi) (x + c x^3):
// one exponential (kernels/detail/vector_exp.h, its argument clamped to
// [-87, 88], where sigmoid is 1 or 0 in f32) and one division, written without
// branches or calls so that GCC vectorises the f32 loops. It is the same
// function, and more accurate in f32 for negative x, where 1 + tanh u cancels;
// within 1e-6 relative of the float64 formula (tests/kernels/test_elementwise.cpp).
// A NaN stays NaN; GELU(-inf) is -inf where PyTorch's formula gives NaN (both
// non-finite for the loss scaler). The f16/bf16 paths and CUDA keep tanhf.
// This file is built with -fno-trapping-math (kernels/CMakeLists.txt): with
// FP exceptions deemed observable GCC may not evaluate both sides of a select,
// and the loops stay scalar. lockstep never reads the FP exception flags.
//
// Note [opaque clamp]: the clamp's bounds reach the loops through a volatile
// read, once per call. With them as constants GCC rewrote exp(clamp(y)) as
// select(in range, exp(y), exp(bound)) and folded the bound's side to
// x / (1 + e^88), a subnormal constant (6e-39) that every vector then
// multiplied by x: a microcode assist per vector, and GELU took 6.5 ns an
// element where the same loop with the bounds opaque takes 1.0 (2-vCPU Intel
// Xeon, AVX2 clone; 19% of a gpt-tiny step). The values are the same bits.
struct ExpBounds {
  float low, high;
};
ExpBounds exp_bounds() {
  static volatile float low = -87.0f, high = 88.0f;
  return {low, high};
}

[[gnu::always_inline]] inline float sigmoid_twice_inner(float x, ExpBounds b) {
  const float y = -2.0f * detail::kSqrt2OverPi * (x + detail::kGeluCubic * x * x * x);
  const float e = detail::exp_in_range(y < b.high ? (y > b.low ? y : b.low) : b.high);  // NaN: high
  return 1.0f / (1.0f + e);
}

[[gnu::always_inline]] inline float gelu_tanh(float x, ExpBounds b) {
  return x * sigmoid_twice_inner(x, b);
}

// d/dx x s(x), s = sigmoid(2u): s + 2 x s (1 - s) u', as 1 - tanh^2 u = 4 s (1 - s).
[[gnu::always_inline]] inline float gelu_tanh_derivative(float x, ExpBounds b) {
  const float s = sigmoid_twice_inner(x, b);
  return s + 2.0f * x * s * (1.0f - s) * detail::kSqrt2OverPi *
                 (1.0f + 3.0f * detail::kGeluCubic * x * x);
}

}  // namespace

// Note [vector tanh]: AVX-512 and AVX2 clones besides the baseline one
// (chosen at load time), all giving the same bits (Note [AVX-512 clones]).
//
// Note [AVX-512 clones]: the GELU and causal-softmax loops (this file and
// cpu/attention.cpp) have an avx512f clone, 16 lanes where AVX2 has 8. The
// avx512f target also enables FMA, which GCC contracts a * b + c into by
// default in C++ (-std=c++20 leaves -ffp-contract=fast; the AVX2 and
// baseline targets have no FMA to contract into): so built, that clone's
// GELU, GELU gradient and softmax differed from the AVX2 clone's in 1.46
// million of 10.1 million outputs (1 ulp in the softmax, up to 8e-6
// relative near GELU's tails). These files are built with
// -ffp-contract=off (kernels/CMakeLists.txt), and then the same outputs,
// over 4 million GELU inputs (NaN, infinities, subnormals and [-40, 40]
// among them) and causal softmaxes at T = 1 to 257, were bit for bit those
// of the build without the clone: a machine without AVX-512 computes the
// same bits, as the rank-invariant mode needs across machines. Measured on
// the 2-vCPU Intel Xeon VM (family 6, model 167): GELU backward 1.17 ms
// for 1 M warm elements with the AVX2 clone, 0.83 with AVX-512; bench_step
// gpt-tiny b16 at 1 thread, lockstep alone (--baseline 0), 3 interleaved
// runs each at load 0.7-1.0: 117.3, 119.5, 117.7 ms/step against 114.6,
// 115.3, 109.7. The bias add, the bias gradient and the residual add
// (cpu/bias.cpp, cpu/elementwise.cpp) have the clone too: additions only,
// nothing to contract, and the same bits measured (777 rows of 1 to 1000
// columns, magnitudes 2^-20 to 2^20, a NaN and an infinity); the step, 3
// interleaved pairs at load 0.8-1.0: 120.3, 118.8, 119.1 ms without, 120.0,
// 117.7, 117.8 with.
//
// Note [clones behind the API]: every cloned CPU kernel is an internal
// function (NAME_clones) with target_clones, behind the public function its
// kernels/ header declares, which calls it. clang 14 ignores target_clones on
// a function that an earlier declaration without the attribute names (the
// header's), silently, and compiles it for the first target listed alone:
// CI's clang build ran the causal softmax's AVX-512 code on the AVX2 VM and
// died of SIGILL once that loop was written in explicit vectors (Note
// [softmax in vectors]); before, its loops had happened to meet no
// instruction the VM lacks (a clang build at -O3 would have). Measured with nm: the clang objects
// had no clones of the 13 public kernels, the gcc ones had them; an internal function gets its
// clones and resolver from both compilers.
namespace {

[[gnu::target_clones("avx512f", "avx2", "default")]] void activation_forward_clones(
    Activation act, const void* x, void* y, DType type, std::int64_t n) {
  detail::require_float(type, "activation_forward");
  if (type == DType::f32) {
    const auto* in = static_cast<const float*>(x);
    auto* out = static_cast<float*>(y);
    if (act == Activation::relu) {
      for (std::int64_t i = 0; i < n; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
      return;
    }
    if (act == Activation::gelu_tanh) {  // Note [vector tanh], Note [opaque clamp]
      const ExpBounds b = exp_bounds();
      for (std::int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(in[i], b);
      return;
    }
    for (std::int64_t i = 0; i < n; ++i) out[i] = detail::activation_value(act, in[i]);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i)
    detail::store_f32(y, type, i, detail::activation_value(act, detail::load_f32(x, type, i)));
}

}  // namespace

// Note [clones behind the API], above.
void activation_forward(Activation act, const void* x, void* y, DType type, std::int64_t n) {
  activation_forward_clones(act, x, y, type, n);
}

namespace {

[[gnu::target_clones("avx512f", "avx2", "default")]] void activation_backward_clones(
    Activation act, const void* dy, const void* x, void* dx, DType type, std::int64_t n) {
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
    if (act == Activation::gelu_tanh) {  // Note [vector tanh], Note [opaque clamp]
      const ExpBounds b = exp_bounds();
      for (std::int64_t i = 0; i < n; ++i) out[i] = g[i] * gelu_tanh_derivative(in[i], b);
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

}  // namespace

// Note [clones behind the API], above.
void activation_backward(Activation act, const void* dy, const void* x, void* dx, DType type,
                         std::int64_t n) {
  activation_backward_clones(act, dy, x, dx, type, n);
}

}  // namespace lockstep::kernels::cpu
