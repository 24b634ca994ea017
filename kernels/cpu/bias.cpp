// CPU bias and bias gradient (kernels/bias.h).
#include "kernels/bias.h"

#include <vector>

#include "kernels/detail/cpu_float.h"

namespace lockstep::kernels::cpu {

// AVX-512 and AVX2 clones besides the baseline one: additions only, so every
// clone gives the same bits (Note [AVX-512 clones] in activation.cpp).
namespace {

[[gnu::target_clones("avx512f", "avx2", "default")]] void add_bias_clones(void* y, DType type,
                                                                          const float* bias,
                                                                          std::int64_t rows,
                                                                          std::int64_t cols) {
  detail::require_float(type, "add_bias");
  if (type == DType::f32) {
    auto* out = static_cast<float*>(y);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) out[i * cols + j] += bias[j];
    return;
  }
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t k = i * cols + j;
      detail::store_f32(y, type, k, detail::load_f32(y, type, k) + bias[j]);
    }
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void add_bias(void* y, DType type, const float* bias, std::int64_t rows, std::int64_t cols) {
  add_bias_clones(y, type, bias, rows, cols);
}

// AVX2: four columns' f64 sums per vector, AVX-512 eight (the same sums, in
// the same order).
namespace {

[[gnu::target_clones("avx512f", "avx2", "default")]] void bias_grad_clones(
    const void* dy, DType type, std::int64_t rows, std::int64_t cols, float* db) {
  detail::require_float(type, "bias_grad");
  std::vector<double> acc(static_cast<std::size_t>(cols), 0.0);
  if (type == DType::f32) {
    const auto* g = static_cast<const float*>(dy);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) acc[j] += g[i * cols + j];
  } else {
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) acc[j] += detail::load_f32(dy, type, i * cols + j);
  }
  for (std::int64_t j = 0; j < cols; ++j) db[j] = static_cast<float>(db[j] + acc[j]);
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void bias_grad(const void* dy, DType type, std::int64_t rows, std::int64_t cols, float* db) {
  bias_grad_clones(dy, type, rows, cols, db);
}

}  // namespace lockstep::kernels::cpu
