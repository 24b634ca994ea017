// CPU reductions and softmax along a dimension (kernels/dim_reduce.h): the
// reference for the CUDA kernels. Each (outer, inner) row is walked in index
// order; the f64 sums are what the CUDA column kernel computes too.
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/detail/cpu_float.h"
#include "kernels/detail/dim_reduce_math.h"
#include "kernels/dim_reduce.h"

namespace lockstep::kernels::cpu {
namespace {

float row_max(const void* x, DType t, std::int64_t base, const DimExtent& e) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < e.dim; ++j)
    m = detail::max_nan(m, detail::load_f32(x, t, base + j * e.inner));
  return m;
}

double row_sum(const void* x, DType t, std::int64_t base, const DimExtent& e) {
  double s = 0.0;
  for (std::int64_t j = 0; j < e.dim; ++j) s += detail::load_f32(x, t, base + j * e.inner);
  return s;
}

}  // namespace

void reduce_dim(DimReduce op, const void* x, void* out, DType type, const DimExtent& e) {
  detail::require_float(type, "reduce along a dim");
  for (std::int64_t o = 0; o < e.outer; ++o)
    for (std::int64_t i = 0; i < e.inner; ++i) {
      const std::int64_t base = o * e.dim * e.inner + i;
      float r;
      if (op == DimReduce::max)
        r = row_max(x, type, base, e);
      else if (op == DimReduce::sum)
        r = static_cast<float>(row_sum(x, type, base, e));
      else
        r = static_cast<float>(row_sum(x, type, base, e) / static_cast<double>(e.dim));
      detail::store_f32(out, type, o * e.inner + i, r);
    }
}

void softmax_dim(const void* x, void* y, DType type, const DimExtent& e, bool log) {
  detail::require_float(type, "softmax");
  for (std::int64_t o = 0; o < e.outer; ++o)
    for (std::int64_t i = 0; i < e.inner; ++i) {
      const std::int64_t base = o * e.dim * e.inner + i;
      const float m = row_max(x, type, base, e);
      double s = 0.0;
      for (std::int64_t j = 0; j < e.dim; ++j)
        s += expf(detail::load_f32(x, type, base + j * e.inner) - m);
      for (std::int64_t j = 0; j < e.dim; ++j) {
        const std::int64_t k = base + j * e.inner;
        detail::store_f32(y, type, k,
                          detail::softmax_value(detail::load_f32(x, type, k), m, s, log));
      }
    }
}

}  // namespace lockstep::kernels::cpu
