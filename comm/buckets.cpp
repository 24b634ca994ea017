// Segment checks and bucket planning (comm/buckets.h).
#include "comm/buckets.h"

#include <fmt/core.h>

#include <set>

#include "kernels/error.h"

namespace lockstep::comm {

void check_segments(const std::vector<GradientSegment>& segments, std::int64_t buffer_numel) {
  std::set<std::string> names;
  std::int64_t end = 0;  // of the previous segment
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const GradientSegment& s = segments[i];
    const std::string where = fmt::format("gradient segment {} ('{}')", i, s.name);
    if (s.name.empty()) throw InvalidArgument(where + " has no name");
    if (!names.insert(s.name).second)
      throw InvalidArgument(where + ": the name appears twice; parameter names must be unique");
    if (s.numel < 0 || s.numel != core::shape_numel(s.shape))
      throw InvalidArgument(fmt::format("{}: numel {} does not match its shape {}", where, s.numel,
                                        core::shape_str(s.shape)));
    if (s.offset < end)
      throw InvalidArgument(fmt::format(
          "{} starts at element {}, before the end of the previous segment ({}): segments must be "
          "laid out in ready order, each after the one before",
          where, s.offset, end));
    if (s.offset + s.numel > buffer_numel)
      throw InvalidArgument(fmt::format("{} ends at element {}, past the flat buffer's {}", where,
                                        s.offset + s.numel, buffer_numel));
    end = s.offset + s.numel;
  }
}

std::vector<Bucket> plan_buckets(const std::vector<GradientSegment>& segments,
                                 std::size_t first_bucket_cap_bytes, std::size_t bucket_cap_bytes) {
  std::vector<Bucket> buckets;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const std::int64_t end = segments[i].offset + segments[i].numel;
    if (!buckets.empty()) {
      Bucket& open = buckets.back();
      const std::size_t cap = buckets.size() == 1 ? first_bucket_cap_bytes : bucket_cap_bytes;
      const auto bytes = static_cast<std::size_t>(end - open.offset) * sizeof(float);
      if (bytes <= cap) {
        open.numel = end - open.offset;
        open.end_segment = i + 1;
        continue;
      }
    }
    buckets.push_back({segments[i].offset, segments[i].numel, i, i + 1});
  }
  return buckets;
}

}  // namespace lockstep::comm
