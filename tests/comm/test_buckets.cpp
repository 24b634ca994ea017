// Bucket planning and the segment-table checks, on a layout worked out by
// hand (comm_test_support.h's six_segments: offsets 256-byte aligned, as the
// ParameterStore places them).
#include <catch2/catch.hpp>

#include "comm/buckets.h"
#include "comm/comm_test_support.h"
#include "kernels/error.h"

using namespace lockstep;
using comm::Bucket;
using comm::GradientSegment;
using test::same_bucket;
using test::six_segments;

TEST_CASE("buckets fill in ready order up to their caps, the first one smaller",
          "[comm][buckets]") {
  std::int64_t total = 0;
  const auto segments = six_segments(total);
  REQUIRE(total == 8576);
  // First cap 1024 floats: head.weight alone (adding head.bias reaches 1034).
  // Later caps 4096 floats: head.bias + mid.weight (364); body.weight (5000)
  // is over the cap and alone; body.scale + stem.weight (6464..8528: 2064).
  const auto buckets = comm::plan_buckets(segments, 4096, 16384);
  REQUIRE(buckets.size() == 4);
  CHECK(same_bucket(buckets[0], 0, 1000, 0, 1));
  CHECK(same_bucket(buckets[1], 1024, 364, 1, 3));
  CHECK(same_bucket(buckets[2], 1408, 5000, 3, 4));
  CHECK(same_bucket(buckets[3], 6464, 2064, 4, 6));
}

TEST_CASE("bucket caps range from one parameter per bucket to one bucket for all",
          "[comm][buckets]") {
  std::int64_t total = 0;
  const auto segments = six_segments(total);
  const auto singles = comm::plan_buckets(segments, 0, 0);
  REQUIRE(singles.size() == segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i)
    CHECK(same_bucket(singles[i], segments[i].offset, segments[i].numel, i, i + 1));
  const auto one = comm::plan_buckets(segments, 1 << 30, 1 << 30);
  REQUIRE(one.size() == 1);
  CHECK(same_bucket(one[0], 0, 8528, 0, 6));  // to the end of stem.weight, padding included
  CHECK(comm::plan_buckets({}, 1024, 1024).empty());
}

TEST_CASE("segment tables that break the layout rules are rejected by name", "[comm][buckets]") {
  std::int64_t total = 0;
  const auto good = six_segments(total);
  CHECK_NOTHROW(comm::check_segments(good, total));

  auto overlapping = good;
  overlapping[2].offset = 1030;  // inside head.bias (1024..1034)
  CHECK_THROWS_WITH(comm::check_segments(overlapping, total),
                    Catch::Contains("'mid.weight'") && Catch::Contains("ready order"));
  auto reversed = good;
  std::swap(reversed[0].offset, reversed[5].offset);
  CHECK_THROWS_AS(comm::check_segments(reversed, total), InvalidArgument);
  CHECK_THROWS_WITH(comm::check_segments(good, 8000),
                    Catch::Contains("'stem.weight'") && Catch::Contains("past the flat buffer"));
  auto wrong_numel = good;
  wrong_numel[1].numel = 11;
  CHECK_THROWS_WITH(comm::check_segments(wrong_numel, total),
                    Catch::Contains("'head.bias'") && Catch::Contains("[10]"));
  auto duplicate = good;
  duplicate[4].name = "head.bias";
  CHECK_THROWS_WITH(comm::check_segments(duplicate, total), Catch::Contains("twice"));
  auto unnamed = good;
  unnamed[3].name.clear();
  CHECK_THROWS_WITH(comm::check_segments(unnamed, total), Catch::Contains("segment 3"));
}
