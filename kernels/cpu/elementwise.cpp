// CPU elementwise ops (kernels/elementwise.h). f32 paths are plain loops the
// compiler vectorises; 16-bit paths go through detail::load_f32/store_f32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/detail/cpu_float.h"
#include "kernels/elementwise.h"

namespace lockstep::kernels::cpu {
namespace {

// Float to integer as documented in elementwise.h: truncate, saturate, NaN -> 0.
template <typename Int>
Int saturate_to(double v) {
  if (std::isnan(v)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<Int>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<Int>::max());
  if (v <= lo) return std::numeric_limits<Int>::min();
  if (v >= hi) return std::numeric_limits<Int>::max();
  return static_cast<Int>(v);
}

std::int64_t load_int(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::i32:
      return static_cast<const std::int32_t*>(p)[i];
    case DType::u8:
      return static_cast<const std::uint8_t*>(p)[i];
    default:
      return static_cast<const std::int64_t*>(p)[i];
  }
}

void store_int(void* p, DType t, std::int64_t i, std::int64_t v) {
  switch (t) {
    case DType::i32:
      static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
      return;
    case DType::u8:
      static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(v);
      return;
    default:
      static_cast<std::int64_t*>(p)[i] = v;
      return;
  }
}

double load_any(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::i32:
      return static_cast<const std::int32_t*>(p)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
    case DType::u8:
      return static_cast<const std::uint8_t*>(p)[i];
    default:
      return detail::load_f32(p, t, i);
  }
}

void store_any(void* p, DType t, std::int64_t i, double v) {
  switch (t) {
    case DType::i32:
      static_cast<std::int32_t*>(p)[i] = saturate_to<std::int32_t>(v);
      return;
    case DType::i64:
      static_cast<std::int64_t*>(p)[i] = saturate_to<std::int64_t>(v);
      return;
    case DType::u8:
      static_cast<std::uint8_t*>(p)[i] = saturate_to<std::uint8_t>(v);
      return;
    default:
      detail::store_f32(p, t, i, static_cast<float>(v));
      return;
  }
}

template <typename Op>
void binary(const void* a, const void* b, void* out, DType t, std::int64_t n, Op op) {
  if (t == DType::f32) {
    auto* o = static_cast<float*>(out);
    auto *x = static_cast<const float*>(a), *y = static_cast<const float*>(b);
    for (std::int64_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i)
    detail::store_f32(out, t, i, op(detail::load_f32(a, t, i), detail::load_f32(b, t, i)));
}

}  // namespace

void fill(void* dst, DType type, std::int64_t n, double value) {
  if (n == 0) return;
  store_any(dst, type, 0, value);  // the element's bytes, by the conversion rules
  auto repeat = [&](auto word) {
    using Word = decltype(word);
    Word w;
    std::memcpy(&w, dst, sizeof w);
    std::fill(static_cast<Word*>(dst), static_cast<Word*>(dst) + n, w);
  };
  switch (dtype_size(type)) {
    case 1:
      repeat(std::uint8_t{});
      break;
    case 2:
      repeat(std::uint16_t{});
      break;
    case 4:
      repeat(std::uint32_t{});
      break;
    default:
      repeat(std::uint64_t{});
      break;
  }
}

void cast(const void* src, DType src_type, void* dst, DType dst_type, std::int64_t n) {
  if (src_type == dst_type) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * dtype_size(src_type));
    return;
  }
  if (!is_floating(src_type) && !is_floating(dst_type)) {
    // Integer to integer wraps, as a C++ conversion (and PyTorch) does.
    for (std::int64_t i = 0; i < n; ++i) store_int(dst, dst_type, i, load_int(src, src_type, i));
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) store_any(dst, dst_type, i, load_any(src, src_type, i));
}

// The residual adds: AVX-512 and AVX2 clones, the same bits (one addition per
// element; Note [AVX-512 clones] in activation.cpp).
namespace {

[[gnu::target_clones("avx512f", "avx2", "default")]] void add_clones(const void* a, const void* b,
                                                                     void* out, DType type,
                                                                     std::int64_t n) {
  detail::require_float(type, "add");
  binary(a, b, out, type, n, [](float x, float y) { return x + y; });
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void add(const void* a, const void* b, void* out, DType type, std::int64_t n) {
  add_clones(a, b, out, type, n);
}

void mul(const void* a, const void* b, void* out, DType type, std::int64_t n) {
  detail::require_float(type, "mul");
  binary(a, b, out, type, n, [](float x, float y) { return x * y; });
}

void scale(void* x, DType type, std::int64_t n, float alpha) {
  detail::require_float(type, "scale");
  for (std::int64_t i = 0; i < n; ++i)
    detail::store_f32(x, type, i, alpha * detail::load_f32(x, type, i));
}

void axpy(float alpha, const void* x, void* y, DType type, std::int64_t n) {
  detail::require_float(type, "axpy");
  binary(x, y, y, type, n, [alpha](float xi, float yi) { return std::fma(alpha, xi, yi); });
}

}  // namespace lockstep::kernels::cpu
