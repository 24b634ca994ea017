// DistributedSampler: coverage of every sample across all ranks (drop_last
// and padding), the rank layout inside a global batch, independence from the
// world size, and the permutation itself checked against Philox blocks and
// Fisher-Yates written out here (Note [sampler permutation]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>

#include "io/sampler.h"
#include "kernels/error.h"
#include "kernels/philox.h"

using namespace lockstep;
using namespace lockstep::io;

namespace {

struct Seen {
  std::vector<std::int64_t> valid_samples;    // every real row of every rank, in global order
  std::vector<std::int64_t> padding_samples;  // every padding row
};

// All ranks' micro-batches of one epoch, laid out global batch by global batch.
Seen gather(std::int64_t n, SamplerOptions o, std::int64_t epoch) {
  Seen seen;
  std::vector<DistributedSampler> ranks;
  for (int r = 0; r < o.world_size; ++r) {
    o.rank = r;
    ranks.emplace_back(n, o);
    ranks.back().set_epoch(epoch);
  }
  for (std::int64_t b = 0; b < ranks[0].batches_per_epoch(); ++b)
    for (const DistributedSampler& s : ranks) {
      const MicroBatch mb = s.micro_batch(b);
      REQUIRE(static_cast<std::int64_t>(mb.indices.size()) == o.micro_batch);
      for (std::int64_t i = 0; i < o.micro_batch; ++i)
        (i < mb.valid ? seen.valid_samples : seen.padding_samples).push_back(mb.indices[i]);
    }
  return seen;
}

// The permutation of Note [sampler permutation], from raw Philox blocks.
std::vector<std::int64_t> reference_order(std::int64_t n, std::uint64_t seed, std::uint64_t epoch) {
  const std::uint64_t stream = 0x53414D5000000000ull + epoch;
  auto word = [&](std::uint64_t w) {
    const std::uint64_t block = w / 4;
    return kernels::philox4x32_10(
        {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
         static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
        {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)})[w % 4];
  };
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::uint64_t w = 0;
  for (std::int64_t i = n - 1; i > 0; --i, w += 2) {
    const unsigned __int128 x = word(w) | (std::uint64_t{word(w + 1)} << 32);
    std::swap(order[i], order[static_cast<std::int64_t>((x * (i + 1)) >> 64)]);
  }
  return order;
}

}  // namespace

TEST_CASE("with drop_last every sample is seen at most once and only the tail is missing",
          "[io][sampler]") {
  for (std::int64_t n : {1, 7, 64, 101})
    for (int world : {1, 2, 3, 8})
      for (std::int64_t b : {1, 3, 8}) {
        INFO("n " << n << " world " << world << " micro-batch " << b);
        const SamplerOptions o{.micro_batch = b, .world_size = world, .seed = 5};
        const Seen seen = gather(n, o, 3);
        const std::int64_t g = world * b, used = n / g * g;
        CHECK(seen.padding_samples.empty());
        REQUIRE(static_cast<std::int64_t>(seen.valid_samples.size()) == used);
        // Rank r holds rows [r*B, (r+1)*B) of each global batch: laid side by
        // side, the ranks give back the epoch's order, minus its tail.
        const auto order = DistributedSampler(n, o).order(3);
        CHECK(std::equal(seen.valid_samples.begin(), seen.valid_samples.end(), order.begin()));
        std::vector<std::int64_t> missing(order.begin() + used, order.end());
        std::vector<int> count(n, 0);
        for (std::int64_t s : seen.valid_samples) ++count[s];
        for (std::int64_t s = 0; s < n; ++s) {
          const bool in_tail = std::find(missing.begin(), missing.end(), s) != missing.end();
          REQUIRE(count[s] == (in_tail ? 0 : 1));
        }
      }
}

TEST_CASE("with padding every sample is seen and only marked padding repeats", "[io][sampler]") {
  for (std::int64_t n : {1, 7, 64, 101})
    for (int world : {1, 2, 3, 8})
      for (std::int64_t b : {1, 3, 8}) {
        INFO("n " << n << " world " << world << " micro-batch " << b);
        const SamplerOptions o{.micro_batch = b, .world_size = world, .drop_last = false};
        const Seen seen = gather(n, o, 0);
        const std::int64_t g = world * b, batches = (n + g - 1) / g;
        std::vector<std::int64_t> valid = seen.valid_samples;
        std::sort(valid.begin(), valid.end());
        std::vector<std::int64_t> all(n);
        std::iota(all.begin(), all.end(), 0);
        REQUIRE(valid == all);  // every sample exactly once among real rows
        REQUIRE(static_cast<std::int64_t>(seen.padding_samples.size()) == batches * g - n);
        // Padding repeats the order from its start.
        const auto order = DistributedSampler(n, o).order(0);
        for (std::size_t i = 0; i < seen.padding_samples.size(); ++i)
          CHECK(seen.padding_samples[i] == order[i % n]);
      }
}

TEST_CASE("padding is a suffix of each micro-batch, whole micro-batches included",
          "[io][sampler]") {
  // 7 samples, global batch 4 x 3 = 12: ranks get 3, 3, 1 and 0 real rows.
  const std::int64_t expected_valid[] = {3, 3, 1, 0};
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(7, {.micro_batch = 3, .world_size = 4, .rank = r, .drop_last = false});
    s.set_epoch(0);
    REQUIRE(s.batches_per_epoch() == 1);
    const MicroBatch mb = s.micro_batch(0);
    CHECK(mb.valid == expected_valid[r]);
    const auto order = s.order(0);
    for (int i = 0; i < 3; ++i) CHECK(mb.indices[i] == order[(3 * r + i) % 7]);
  }
}

TEST_CASE("the global batch does not depend on the world size", "[io][sampler]") {
  // Global batch 12 as 1 x 12, 2 x 6, 3 x 4 and 12 x 1.
  std::vector<std::vector<std::int64_t>> orders;
  for (auto [world, b] : {std::pair{1, 12}, {2, 6}, {3, 4}, {12, 1}}) {
    const Seen seen = gather(100, {.micro_batch = b, .world_size = world, .seed = 11}, 2);
    orders.push_back(seen.valid_samples);
  }
  for (const auto& o : orders) CHECK(o == orders[0]);
}

TEST_CASE("the permutation is Fisher-Yates on the Philox stream of (seed, epoch)",
          "[io][sampler]") {
  for (std::int64_t n : {2, 3, 10, 1000})
    for (std::uint64_t seed : {0ull, 42ull, 0xfedcba9876543210ull})
      for (std::int64_t epoch : {0, 1, 7})
        CHECK(DistributedSampler(n, {.seed = seed}).order(epoch) ==
              reference_order(n, seed, epoch));
  const DistributedSampler s(1000, {.seed = 1});
  CHECK(s.order(0) != s.order(1));
  CHECK(s.order(0) != DistributedSampler(1000, {.seed = 2}).order(0));
  std::vector<std::int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(DistributedSampler(1000, {.shuffle = false, .seed = 1}).order(4) == identity);
}

TEST_CASE("each sample is equally likely at each position", "[io][sampler]") {
  // 6000 epochs of 5 samples: each (position, sample) pair is expected 1200
  // times with standard deviation sqrt(6000 * 0.2 * 0.8) = 31; allow 5 sigma.
  const DistributedSampler s(5, {.seed = 9});
  std::map<std::pair<int, std::int64_t>, int> count;
  for (std::int64_t e = 0; e < 6000; ++e) {
    const auto order = s.order(e);
    for (int p = 0; p < 5; ++p) ++count[{p, order[p]}];
  }
  for (const auto& [key, c] : count) CHECK(std::abs(c - 1200) < 155);
}

TEST_CASE("bad options and positions are InvalidArgument", "[io][sampler]") {
  CHECK_THROWS_AS(DistributedSampler(10, {.micro_batch = 0}), InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(10, {.world_size = 2, .rank = 2}), InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(-1, {}), InvalidArgument);
  DistributedSampler s(100, {.micro_batch = 4, .world_size = 2});
  CHECK_NOTHROW(s.check_position(96));  // 12 global batches of 8: the end
  CHECK_THROWS_WITH(s.check_position(12), Catch::Contains("not a multiple of the global batch 8"));
  CHECK_THROWS_AS(s.check_position(104), InvalidArgument);
  CHECK_THROWS_AS(s.micro_batch(0), InvalidArgument);  // no epoch set
  s.set_epoch(0);
  CHECK_THROWS_AS(s.micro_batch(12), InvalidArgument);
  CHECK_THROWS_AS(s.order(-1), InvalidArgument);
}
