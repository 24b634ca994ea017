// Gradient segments and bucket planning for the GradientSynchronizer. A
// segment is one parameter's gradient in the flat f32 gradient buffer.
// Segments are listed in ready order (the order backward completes them) and
// laid out in that order, so a bucket, a run of consecutive segments, is one
// contiguous slice of the buffer: an f32 allreduce needs no copy in or out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace lockstep::comm {

struct GradientSegment {
  std::string name;         // the parameter's dotted name, "features.0.weight"
  std::int64_t offset = 0;  // elements from the start of the flat buffers
  std::int64_t numel = 0;   // == shape_numel(shape)
  core::Shape shape;
};

struct Bucket {
  std::int64_t offset = 0;        // the first segment's offset
  std::int64_t numel = 0;         // to the end of the last segment, padding included
  std::size_t first_segment = 0;  // segments [first_segment, end_segment), in ready order
  std::size_t end_segment = 0;
};

// Throws InvalidArgument naming the first segment that breaks the rules:
// unique non-empty names, numel == shape_numel(shape), and offsets that start
// each segment at or after the end of the one before, inside the buffer.
void check_segments(const std::vector<GradientSegment>& segments, std::int64_t buffer_numel);

// Greedy in ready order: a bucket takes the next segment unless its slice
// would then exceed the cap (first_bucket_cap_bytes for the first bucket,
// bucket_cap_bytes after it); a segment larger than the cap is a bucket of its
// own. Slices are measured in f32 bytes. The segments must pass check_segments.
std::vector<Bucket> plan_buckets(const std::vector<GradientSegment>& segments,
                                 std::size_t first_bucket_cap_bytes, std::size_t bucket_cap_bytes);

}  // namespace lockstep::comm
