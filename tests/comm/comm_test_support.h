// Helpers shared by the communication tests (tests/comm, tests/mpi):
// reference roundings to f16 and bf16 that do not use kernels/half.h (GCC's
// _Float16 for f16, an exhaustive nearest-even search for bf16), and gradient
// segment tables laid out as the engine's ParameterStore lays them out.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "comm/buckets.h"

namespace lockstep::test {

// f16 nearest-even rounding of a double, by libgcc's soft-float conversion.
inline double round_f16(double x) { return static_cast<double>(static_cast<_Float16>(x)); }

// The value of bfloat16 pattern `bits` (positive, finite), from its fields.
inline double bf16_value(std::uint16_t bits) {
  const int exp = (bits >> 7) & 0xff;
  const int mant = bits & 0x7f;
  return exp == 0 ? std::ldexp(mant, -133) : std::ldexp(mant + 128, exp - 134);
}

// bfloat16 nearest-even rounding of a double by search over the patterns;
// past the largest finite value's rounding boundary, inf.
inline double round_bf16(double x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const double ax = std::fabs(x);
  if (ax >= std::ldexp(2.0 - std::ldexp(1.0, -8), 127)) return std::copysign(INFINITY, x);
  std::uint16_t lo = 0, hi = 0x7f7f;  // the largest pattern whose value <= ax
  while (lo < hi) {
    const auto mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
    if (bf16_value(mid) <= ax)
      lo = mid;
    else
      hi = static_cast<std::uint16_t>(mid - 1);
  }
  const double below = bf16_value(lo);
  const double above = lo == 0x7f7f ? INFINITY : bf16_value(static_cast<std::uint16_t>(lo + 1));
  double pick;
  if (ax - below < above - ax)
    pick = below;
  else if (ax - below > above - ax)
    pick = above;
  else
    pick = (lo & 1) ? above : below;
  return std::copysign(pick, x);
}

// Segments for parameters listed in ready order, each at a 256-byte (64 f32)
// aligned offset as the ParameterStore places them; `total` gets the buffer size.
inline std::vector<comm::GradientSegment> aligned_segments(
    const std::vector<std::pair<std::string, core::Shape>>& params, std::int64_t& total) {
  std::vector<comm::GradientSegment> segments;
  std::int64_t offset = 0;
  for (const auto& [name, shape] : params) {
    const std::int64_t numel = core::shape_numel(shape);
    segments.push_back({name, offset, numel, shape});
    offset = (offset + numel + 63) / 64 * 64;
  }
  total = offset;
  return segments;
}

// Whether bucket `b` is the one a test worked out by hand.
inline bool same_bucket(const comm::Bucket& b, std::int64_t offset, std::int64_t numel,
                        std::size_t first, std::size_t end) {
  return b.offset == offset && b.numel == numel && b.first_segment == first && b.end_segment == end;
}

// The layout test_buckets.cpp works its bucket plans out on by hand and
// test_synchronizer_unit.cpp synchronises: sizes 1000, 10, 300, 5000, 1, 2000
// at offsets 0, 1024, 1088, 1408, 6464, 6528 (`total` 8576).
inline std::vector<comm::GradientSegment> six_segments(std::int64_t& total) {
  return aligned_segments({{"head.weight", {10, 100}},
                           {"head.bias", {10}},
                           {"mid.weight", {3, 100}},
                           {"body.weight", {50, 100}},
                           {"body.scale", {1}},
                           {"stem.weight", {20, 100}}},
                          total);
}

}  // namespace lockstep::test
