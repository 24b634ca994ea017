// CPU reductions (kernels/reduce.h), accumulated in f64 in index order.
#include <cmath>

#include "kernels/detail/cpu_float.h"
#include "kernels/reduce.h"

namespace lockstep::kernels::cpu {
namespace {

template <typename Term>
double accumulate(const void* x, DType type, std::int64_t n, Term term) {
  double acc = 0.0;
  if (type == DType::f32) {
    const auto* p = static_cast<const float*>(x);
    for (std::int64_t i = 0; i < n; ++i) acc += term(static_cast<double>(p[i]));
    return acc;
  }
  for (std::int64_t i = 0; i < n; ++i)
    acc += term(static_cast<double>(detail::load_f32(x, type, i)));
  return acc;
}

}  // namespace

void sum(const void* x, DType type, std::int64_t n, float* out) {
  detail::require_float(type, "sum");
  *out = static_cast<float>(accumulate(x, type, n, [](double v) { return v; }));
}

void sum_squares(const void* x, DType type, std::int64_t n, float* out) {
  detail::require_float(type, "sum_squares");
  *out = static_cast<float>(accumulate(x, type, n, [](double v) { return v * v; }));
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
