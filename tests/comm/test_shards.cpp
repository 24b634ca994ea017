// The ZeRO-1 shard layout (comm/shards.h, Note [shard layout]) on the layout
// test_buckets.cpp works out by hand (six_segments: 8576 elements), for 2
// and 3 ranks by hand, and its invariants for 1 to 5 ranks and several caps.
#include <catch2/catch.hpp>

#include "comm/comm_test_support.h"
#include "comm/shards.h"
#include "kernels/error.h"

using namespace lockstep;
using comm::Bucket;
using test::same_bucket;
using test::six_segments;

TEST_CASE("shard buckets round the bucket plan's ends up to ranks x 64 elements",
          "[comm][shards]") {
  std::int64_t total = 0;
  const auto segments = six_segments(total);
  // Unsharded, the plan ends at 1000, 1388, 6408 and 8528 (test_buckets.cpp).
  SECTION("2 ranks: units of 128 elements, no tail past the buffer") {
    const auto layout = comm::plan_shards(segments, total, 2, 1, 4096, 16384);
    REQUIRE(layout.padded_numel() == 8576);
    REQUIRE(layout.buckets.size() == 4);
    CHECK(same_bucket(layout.buckets[0], 0, 1024, 0, 1));
    CHECK(same_bucket(layout.buckets[1], 1024, 384, 1, 3));
    CHECK(same_bucket(layout.buckets[2], 1408, 5120, 3, 5));  // body.scale starts at 6464
    CHECK(same_bucket(layout.buckets[3], 6528, 2048, 5, 6));
    CHECK(layout.chunk(2, 1).offset == 1408 + 2560);
    CHECK(layout.chunk(2, 1).numel == 2560);
    CHECK(layout.shard_numel() == 4288);
  }
  SECTION("3 ranks: units of 192, and the tail [8448, 8640) a bucket of its own") {
    const auto layout = comm::plan_shards(segments, total, 3, 2, 4096, 16384);
    REQUIRE(layout.padded_numel() == 8640);
    REQUIRE(layout.buckets.size() == 5);
    CHECK(same_bucket(layout.buckets[0], 0, 1152, 0, 3));  // mid.weight is cut at 1152
    CHECK(same_bucket(layout.buckets[1], 1152, 384, 2, 4));
    CHECK(same_bucket(layout.buckets[2], 1536, 4992, 3, 5));
    CHECK(same_bucket(layout.buckets[3], 6528, 1920, 5, 6));
    CHECK(same_bucket(layout.buckets[4], 8448, 192, 5, 6));
    // The tail's chunks: rank 1's [8512, 8576) is in the buffer, rank 2's is all padding.
    CHECK(layout.chunk(4, 1).offset == 8512);
    CHECK(layout.chunk(4, 1).numel == 64);
    CHECK(layout.chunk(4, 2).numel == 0);
    CHECK(layout.shard_numel() == 2880);
  }
}

TEST_CASE("shard chunks are aligned, equal per bucket and tile the buffer", "[comm][shards]") {
  std::int64_t total = 0;
  const auto segments = six_segments(total);
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (std::size_t cap : {std::size_t{0}, std::size_t{4096}, std::size_t{1} << 30}) {
      INFO(ranks << " ranks, cap " << cap);
      const std::int64_t unit = 64 * ranks;
      std::vector<int> owners(static_cast<std::size_t>(total), 0);
      for (int rank = 0; rank < ranks; ++rank) {
        const auto layout = comm::plan_shards(segments, total, ranks, rank, cap, cap);
        CHECK(layout.padded_numel() == (total + unit - 1) / unit * unit);
        std::int64_t end = 0, shard = 0;
        for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
          const Bucket& bucket = layout.buckets[b];
          CHECK(bucket.offset == end);
          CHECK(bucket.numel % unit == 0);
          CHECK(bucket.numel > 0);
          // Only the last bucket reaches past the buffer, and then by less than a unit.
          if (bucket.offset + bucket.numel > total) {
            CHECK(b + 1 == layout.buckets.size());
            CHECK(bucket.numel == unit);
          }
          // The bucket lists exactly the segments it touches.
          for (std::size_t s = 0; s < segments.size(); ++s) {
            const bool touches = segments[s].offset < bucket.offset + bucket.numel &&
                                 segments[s].offset + segments[s].numel > bucket.offset;
            CHECK(touches == (s >= bucket.first_segment && s < bucket.end_segment));
          }
          const comm::FlatRange mine = layout.chunk(b, rank);
          CHECK(mine.offset % 64 == 0);
          for (std::int64_t i = mine.offset; i < mine.offset + mine.numel; ++i)
            ++owners[static_cast<std::size_t>(i)];
          shard += layout.chunk_numel(b);
          end = bucket.offset + bucket.numel;
        }
        CHECK(end == layout.padded_numel());
        CHECK(shard == layout.shard_numel());
        CHECK(layout.shard_numel() * ranks == layout.padded_numel());
      }
      // Every element of the buffer has exactly one owner.
      CHECK(std::count(owners.begin(), owners.end(), 1) == total);
    }
  CHECK_THROWS_AS(comm::plan_shards(segments, total, 2, 2, 0, 0), InvalidArgument);
}
