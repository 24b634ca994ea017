// Independent references for the kernel tests, shared by the CPU tests and the
// [gpu] tests: random inputs from std::mt19937 (not the code under test), a
// float64 triple-loop GEMM, and the error bound GEMM results are held to.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/half.h"

namespace lockstep::test {

// Values uniform in [-1, 1], already rounded to `type`, as f32 and as storage bytes.
struct RandomMatrix {
  std::vector<float> values;        // exactly representable in `type`
  std::vector<std::uint8_t> bytes;  // the storage of `type`
};

inline RandomMatrix random_matrix(std::int64_t count, DType type, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  RandomMatrix m;
  m.values.resize(count);
  m.bytes.resize(count * dtype_size(type));
  for (std::int64_t i = 0; i < count; ++i) {
    float v = dist(rng);
    if (type == DType::f16) {
      const std::uint16_t h = kernels::f32_to_f16_bits(v);
      reinterpret_cast<std::uint16_t*>(m.bytes.data())[i] = h;
      v = kernels::f16_bits_to_f32(h);
    } else if (type == DType::bf16) {
      const std::uint16_t b = kernels::f32_to_bf16_bits(v);
      reinterpret_cast<std::uint16_t*>(m.bytes.data())[i] = b;
      v = kernels::bf16_bits_to_f32(b);
    } else {
      reinterpret_cast<float*>(m.bytes.data())[i] = v;
    }
    m.values[i] = v;
  }
  return m;
}

inline float decode(const std::vector<std::uint8_t>& bytes, DType type, std::int64_t i) {
  if (type == DType::f16)
    return kernels::f16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(bytes.data())[i]);
  if (type == DType::bf16)
    return kernels::bf16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(bytes.data())[i]);
  return reinterpret_cast<const float*>(bytes.data())[i];
}

// Row-major float64 reference of C = alpha op(A) op(B) + beta C0, and, per
// element, the magnitude sum_k |a||b| that scales the rounding error bound.
struct GemmReference {
  std::vector<double> c;
  std::vector<double> magnitude;
};

inline GemmReference reference_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                    std::int64_t k, double alpha, const std::vector<float>& a,
                                    const std::vector<float>& b, double beta,
                                    const std::vector<float>& c0) {
  GemmReference r{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0, mag = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = trans_a ? a[p * m + i] : a[i * k + p];
        const double y = trans_b ? b[j * k + p] : b[p * n + j];
        acc += x * y;
        mag += std::fabs(x * y);
      }
      r.c[i * n + j] = alpha * acc + beta * c0[i * n + j];
      r.magnitude[i * n + j] = std::fabs(alpha) * mag + std::fabs(beta * c0[i * n + j]);
    }
  return r;
}

// Tolerance for one GEMM output element. With f32 accumulation the classic
// bound is |error| <= k u sum|a b| (u = 2^-24, Higham's gamma_k); we allow 2k u
// for blocked/FMA orderings plus one f32 rounding of alpha and beta terms.
// A 16-bit C adds one rounding to that type: half an ulp, 2^-11 (f16) or
// 2^-8 (bf16) of the value.
inline double gemm_tolerance(double magnitude, double value, std::int64_t k, DType c_type) {
  const double u32 = std::ldexp(1.0, -24);
  double tol = (2.0 * static_cast<double>(k) + 2.0) * u32 * magnitude + 1e-30;
  if (c_type == DType::f16) tol += std::ldexp(1.0, -11) * std::fabs(value) + std::ldexp(1.0, -25);
  if (c_type == DType::bf16) tol += std::ldexp(1.0, -8) * std::fabs(value) + 1e-38;
  return tol;
}

}  // namespace lockstep::test
