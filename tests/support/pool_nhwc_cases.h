// The channels-last pooling tests' cases (Note [channels-last pooling]):
// window shapes (the 2x2 fast path, overlapping, padded, odd sizes, resnet's
// 3x3 stride 2), inputs full of ties, NaN and -inf in any float dtype, and an
// NCHW <-> NHWC transpose of raw elements written here, apart from the
// kernels', so that the CPU and [gpu] tests compare layouts independently.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/half.h"
#include "kernels/pooling.h"

namespace lockstep::test {

inline kernels::Pool2dShape pool_case(std::int64_t batch, std::int64_t channels, std::int64_t h,
                                      std::int64_t w, std::int64_t kh, std::int64_t kw,
                                      std::int64_t sh, std::int64_t sw, std::int64_t ph,
                                      std::int64_t pw) {
  kernels::Pool2dShape s;
  s.batch = batch;
  s.channels = channels;
  s.in_h = h;
  s.in_w = w;
  s.kernel_h = kh;
  s.kernel_w = kw;
  s.stride_h = sh;
  s.stride_w = sw;
  s.pad_h = ph;
  s.pad_w = pw;
  return s;
}

// Odd sizes and every window kind the kernels treat apart.
inline std::vector<kernels::Pool2dShape> pool_nhwc_cases() {
  return {
      pool_case(2, 3, 7, 5, 3, 3, 2, 2, 1, 1),   // resnet's stem pool at an odd size
      pool_case(2, 5, 6, 8, 2, 2, 2, 2, 0, 0),   // the 2x2 fast path (Note [pool 2x2])
      pool_case(1, 4, 7, 7, 2, 2, 2, 2, 0, 0),   // 2x2 with a dropped last row and column
      pool_case(3, 2, 9, 4, 3, 2, 1, 1, 1, 1),   // overlapping windows: the gathering backward
      pool_case(2, 7, 8, 9, 3, 3, 3, 3, 0, 0),   // non-overlapping 3x3: the scattering backward
      pool_case(1, 1, 5, 6, 1, 1, 1, 1, 0, 0),   // a 1x1 window and one channel
      pool_case(2, 33, 5, 5, 3, 3, 2, 2, 1, 1),  // channels past a warp
  };
}

// A raw buffer of n elements of `type` from f32 values (rounded to nearest).
inline std::vector<char> raw_from_f32(const std::vector<float>& values, DType type) {
  std::vector<char> out(values.size() * dtype_size(type));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (type == DType::f32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const std::uint16_t bits = type == DType::f16 ? kernels::f32_to_f16_bits(values[i])
                                                    : kernels::f32_to_bf16_bits(values[i]);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

// Values on a grid of halves in [-2, 2] (many ties in a window), with NaN
// and -inf sprinkled in when `specials`.
inline std::vector<float> tied_values(std::size_t n, std::uint32_t seed, bool specials) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> grid(-4, 4), special(0, 39);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = 0.5f * static_cast<float>(grid(gen));
    if (!specials) continue;
    const int k = special(gen);
    if (k == 0) x = std::numeric_limits<float>::quiet_NaN();
    if (k == 1) x = -std::numeric_limits<float>::infinity();
  }
  return v;
}

// Gradients: random f32 in [-1, 1) with no ties to worry about.
inline std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Per image, [rows, cols] elements of `bytes` each into [cols, rows]: NCHW
// [c, hw] to NHWC [hw, c] with (rows, cols) = (c, hw), and back with (hw, c).
inline std::vector<char> transpose_images(const std::vector<char>& src, std::size_t bytes,
                                          std::int64_t images, std::int64_t rows,
                                          std::int64_t cols) {
  std::vector<char> dst(src.size());
  for (std::int64_t n = 0; n < images; ++n)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        std::memcpy(dst.data() + ((n * cols + c) * rows + r) * bytes,
                    src.data() + ((n * rows + r) * cols + c) * bytes, bytes);
  return dst;
}

template <typename T>
std::vector<char> as_raw(const std::vector<T>& v) {
  std::vector<char> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// The number of elements of `bytes` each whose bits differ.
inline std::int64_t bit_mismatches(const std::vector<char>& a, const std::vector<char>& b,
                                   std::size_t bytes) {
  if (a.size() != b.size()) return -1;
  std::int64_t count = 0;
  for (std::size_t i = 0; i < a.size(); i += bytes)
    count += std::memcmp(a.data() + i, b.data() + i, bytes) != 0;
  return count;
}

}  // namespace lockstep::test
