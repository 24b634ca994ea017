// CPU reductions (kernels/reduce.h), accumulated in f64 over eight lanes in a
// fixed order (kernels/detail/lane_sum.h): an in-order f64 sum is a chain of
// dependent adds (the gradient norm took 0.4 ms of the mlp's 4.9 ms step).
#include <cmath>

#include "kernels/detail/cpu_float.h"
#include "kernels/detail/lane_sum.h"
#include "kernels/reduce.h"

namespace lockstep::kernels::cpu {
namespace {

template <typename Term>
[[gnu::always_inline]] inline double accumulate(const void* x, DType type, std::int64_t n,
                                                Term term) {
  if (type == DType::f32) {
    const auto* p = static_cast<const float*>(x);
    return detail::lane_sum(n, [&](std::int64_t i) { return term(static_cast<double>(p[i])); });
  }
  return detail::lane_sum(
      n, [&](std::int64_t i) { return term(static_cast<double>(detail::load_f32(x, type, i))); });
}

}  // namespace

namespace {

[[gnu::target_clones("avx2", "default")]] void sum_clones(const void* x, DType type, std::int64_t n,
                                                          float* out) {
  detail::require_float(type, "sum");
  *out = static_cast<float>(accumulate(x, type, n, [](double v) { return v; }));
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void sum(const void* x, DType type, std::int64_t n, float* out) { sum_clones(x, type, n, out); }

namespace {

[[gnu::target_clones("avx2", "default")]] void sum_squares_clones(const void* x, DType type,
                                                                  std::int64_t n, double* out) {
  detail::require_float(type, "sum_squares");
  *out = accumulate(x, type, n, [](double v) { return v * v; });
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void sum_squares(const void* x, DType type, std::int64_t n, double* out) {
  sum_squares_clones(x, type, n, out);
}

void sum_squares(const void* x, DType type, std::int64_t n, float* out) {
  double total = 0.0;
  sum_squares(x, type, n, &total);
  *out = static_cast<float>(total);
}

void flag_nonfinite(const void* x, DType type, std::int64_t n, std::int32_t* flag) {
  detail::require_float(type, "flag_nonfinite");
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(detail::load_f32(x, type, i))) {
      *flag = 1;
      return;
    }
  }
}

}  // namespace lockstep::kernels::cpu
