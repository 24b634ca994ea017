// Helpers shared by the communication tests (tests/comm, tests/mpi): the
// reference f16 and bf16 roundings (tests/support/half_reference.h), and
// gradient segment tables laid out as the engine's ParameterStore lays them out.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "comm/buckets.h"
#include "support/half_reference.h"

namespace lockstep::test {

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
