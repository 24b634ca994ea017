// DataLoader on the CPU: batches in order and identical for any thread count,
// holding the samples the sampler names with the values a formula predicts;
// resuming at a position (also on another world size) continues exactly; the
// position counts at the consumer; errors in workers reach the consumer; the
// loader stops cleanly mid-epoch; u8 scaling and transforms.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>

#include "io/loader.h"
#include "io/shard_fixtures.h"

using namespace lockstep;
using namespace lockstep::io;
using test::TempDir;

namespace {

const core::Shape kSample{2, 3, 4};
constexpr std::int64_t kValues = 24;

// 150 u8 samples over three shards (50, 60, 40 rows).
struct Samples {
  TempDir dir;
  Dataset data;
  Samples() : data(make(dir)) {}
  static Dataset make(const TempDir& dir) {
    test::write_shard(dir / "a.h5", 0, 50, kSample, DType::u8);
    test::write_shard(dir / "b.h5", 50, 60, kSample, DType::u8);
    test::write_shard(dir / "c.h5", 110, 40, kSample, DType::u8);
    return Dataset::open(dir.path());
  }
};

struct Record {
  std::int64_t index, valid;
  std::vector<std::int64_t> indices, labels;
  std::vector<std::uint8_t> inputs;
  bool operator==(const Record&) const = default;
};

Record record(const Batch& b) {
  Record r{b.index, b.valid, b.indices, b.labels.to_vector<std::int64_t>(), {}};
  r.inputs.resize(b.inputs.nbytes());
  b.inputs.copy_to_host(r.inputs.data());
  return r;
}

std::vector<Record> run(DataLoader& loader, std::int64_t epoch, std::int64_t position = 0) {
  loader.start_epoch(epoch, position);
  std::vector<Record> out;
  while (auto b = loader.next()) out.push_back(record(*b));
  return out;
}

// Each batch holds what the sampler names, with the formula's bytes and labels.
void require_matches_sampler(const std::vector<Record>& records, std::int64_t n,
                             const SamplerOptions& o, std::int64_t epoch, std::int64_t first = 0) {
  DistributedSampler sampler(n, o);
  sampler.set_epoch(epoch);
  REQUIRE(static_cast<std::int64_t>(records.size()) == sampler.batches_per_epoch() - first);
  for (std::size_t k = 0; k < records.size(); ++k) {
    const Record& r = records[k];
    const MicroBatch mb = sampler.micro_batch(first + static_cast<std::int64_t>(k));
    REQUIRE(r.index == first + static_cast<std::int64_t>(k));
    REQUIRE(r.indices == mb.indices);
    REQUIRE(r.valid == mb.valid);
    for (std::size_t i = 0; i < r.indices.size(); ++i) {
      REQUIRE(r.labels[i] == test::sample_label(r.indices[i]));
      const auto want = test::sample_bytes(r.indices[i], 1, kValues, DType::u8);
      REQUIRE(std::equal(want.begin(), want.end(), r.inputs.begin() + i * kValues));
    }
  }
}

}  // namespace

TEST_CASE("the batch sequence is the same for 1, 2 and 8 threads", "[io][loader]") {
  Samples s;
  for (bool drop_last : {true, false}) {
    const SamplerOptions o{
        .micro_batch = 7, .world_size = 2, .rank = 1, .seed = 3, .drop_last = drop_last};
    std::vector<std::vector<Record>> runs;
    for (auto [threads, depth] : {std::pair{1, 1}, {2, 3}, {8, 0}}) {
      DataLoader loader(s.data, {.sampler = o, .threads = threads, .depth = depth});
      CHECK(loader.depth() == (depth > 0 ? depth : 2 * threads + 2));
      runs.push_back(run(loader, 1));
      require_matches_sampler(runs.back(), 150, o, 1);
      // A second epoch in the same loader has its own order.
      const auto second = run(loader, 2);
      require_matches_sampler(second, 150, o, 2);
      CHECK(second.front().indices != runs.back().front().indices);
    }
    CHECK(runs[1] == runs[0]);
    CHECK(runs[2] == runs[0]);
  }
}

TEST_CASE("across ranks, world sizes, batch sizes and threads every sample is covered as promised",
          "[io][loader]") {
  Samples s;
  for (int world : {1, 2, 3})
    for (std::int64_t b : {4, 7})
      for (int threads : {1, 8})
        for (bool drop_last : {true, false}) {
          INFO("world " << world << " micro-batch " << b << " threads " << threads
                        << (drop_last ? " drop_last" : " padded"));
          std::vector<int> real(150, 0), padding(150, 0);
          for (int r = 0; r < world; ++r) {
            const SamplerOptions o{.micro_batch = b,
                                   .world_size = world,
                                   .rank = r,
                                   .seed = 13,
                                   .drop_last = drop_last};
            DataLoader loader(s.data, {.sampler = o, .threads = threads});
            const auto records = run(loader, 0);
            require_matches_sampler(records, 150, o, 0);
            for (const Record& rec : records)
              for (std::int64_t i = 0; i < b; ++i)
                ++(i < rec.valid ? real : padding)[rec.indices[i]];
          }
          const std::int64_t g = world * b;
          if (drop_last) {
            CHECK(std::accumulate(real.begin(), real.end(), 0) == 150 / g * g);
            CHECK(*std::max_element(real.begin(), real.end()) == 1);
            CHECK(std::accumulate(padding.begin(), padding.end(), 0) == 0);
          } else {
            CHECK(std::all_of(real.begin(), real.end(), [](int c) { return c == 1; }));
            CHECK(std::accumulate(padding.begin(), padding.end(), 0) ==
                  (150 + g - 1) / g * g - 150);
          }
        }
}

TEST_CASE("resuming at a position equals not stopping", "[io][loader]") {
  Samples s;
  const SamplerOptions o{.micro_batch = 5, .world_size = 3, .rank = 2, .seed = 8};
  DataLoader straight(s.data, {.sampler = o, .threads = 3});
  const auto whole = run(straight, 4);
  for (std::int64_t k : {0, 1, 4, 9, 10}) {
    // Take k batches, keep the position a checkpoint would store, start over.
    DataLoader first(s.data, {.sampler = o, .threads = 2});
    first.start_epoch(4);
    for (std::int64_t i = 0; i < k; ++i) REQUIRE(first.next());
    const LoaderPosition saved = first.position();
    REQUIRE(saved.position == k * 15);
    DataLoader resumed(s.data, {.sampler = o, .threads = 4});
    const auto rest = run(resumed, saved.epoch, saved.position);
    REQUIRE(rest.size() == whole.size() - k);
    CHECK(std::equal(rest.begin(), rest.end(), whole.begin() + k));
  }
}

TEST_CASE("resuming on another world size with the same global batch continues exactly",
          "[io][loader]") {
  Samples s;
  // Global batch 12: as 2 ranks x 6, then resumed as 4 ranks x 3.
  auto global_batches = [&](int world, std::int64_t b, std::int64_t position) {
    std::vector<std::vector<std::int64_t>> batches;
    for (int r = 0; r < world; ++r) {
      DataLoader loader(s.data,
                        {.sampler = {.micro_batch = b, .world_size = world, .rank = r, .seed = 21},
                         .threads = 2});
      const auto records = run(loader, 6, position);
      batches.resize(records.size());
      for (std::size_t k = 0; k < records.size(); ++k)
        batches[k].insert(batches[k].end(), records[k].indices.begin(), records[k].indices.end());
    }
    return batches;
  };
  const auto on_two = global_batches(2, 6, 0);
  REQUIRE(on_two.size() == 12);
  DataLoader two(s.data, {.sampler = {.micro_batch = 6, .world_size = 2, .seed = 21}});
  two.start_epoch(6);
  for (int i = 0; i < 5; ++i) two.next();
  const auto on_four = global_batches(4, 3, two.position().position);
  REQUIRE(on_four.size() == 7);
  CHECK(std::equal(on_four.begin(), on_four.end(), on_two.begin() + 5));
}

TEST_CASE("the position counts batches handed out, not batches assembled", "[io][loader]") {
  Samples s;
  DataLoader loader(s.data, {.sampler = {.micro_batch = 4}, .threads = 4, .depth = 8});
  loader.start_epoch(0);
  REQUIRE(loader.next());
  REQUIRE(loader.next());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // workers fill the pool
  CHECK(loader.position().position == 8);
  CHECK(loader.stats().batches == 2);
  CHECK(loader.stats().wait_s >= 0.0);
}

TEST_CASE("an exception in a worker reaches the consumer at its batch", "[io][loader]") {
  Samples s;
  for (int threads : {1, 4}) {
    DataLoader loader(
        s.data, {.sampler = {.micro_batch = 4}, .threads = threads, .transform = [](HostBatch& b) {
                   if (b.index == 3) throw std::runtime_error("augmentation broke");
                 }});
    loader.start_epoch(0);
    for (int i = 0; i < 3; ++i) REQUIRE(loader.next()->index == i);
    CHECK_THROWS_WITH(loader.next(), "augmentation broke");
    CHECK_THROWS_WITH(loader.next(), "augmentation broke");  // it stays failed
    CHECK(loader.position().position == 12);
    // A new epoch starts clean (the transform fails at batch 3 again).
    loader.start_epoch(1, 16);
    CHECK(loader.next()->index == 4);
  }
}

TEST_CASE("a read error in a worker reaches the consumer naming the shard", "[io][loader]") {
  Samples s;
  // Truncating a shard after it was opened makes the workers' reads fail.
  std::filesystem::resize_file(s.dir / "b.h5", 2000);
  DataLoader loader(s.data, {.sampler = {.micro_batch = 16}, .threads = 3});
  loader.start_epoch(0);
  try {
    while (loader.next()) {
    }
    FAIL("no error reading a truncated shard");
  } catch (const IoError& e) {
    CHECK_THAT(e.what(), Catch::Contains("b.h5") && Catch::Contains("dataset 'inputs'"));
  }
}

TEST_CASE("the loader shuts down cleanly mid-epoch and restarts mid-epoch", "[io][loader]") {
  Samples s;
  const SamplerOptions o{.micro_batch = 3, .seed = 2};
  {
    DataLoader loader(s.data, {.sampler = o, .threads = 8, .depth = 4});
    loader.start_epoch(0);
    REQUIRE(loader.next());
  }  // the destructor joins workers that are mid-batch or waiting for a buffer
  DataLoader loader(s.data, {.sampler = o, .threads = 2});
  loader.start_epoch(0);
  for (int i = 0; i < 7; ++i) loader.next();
  const auto whole = run(loader, 0);  // restarting drops the rest of the first try
  require_matches_sampler(whole, 150, o, 0);
  CHECK_FALSE(loader.next());  // the end of the epoch stays the end
}

TEST_CASE("a consumer holding every buffer gets an error, not a hang", "[io][loader]") {
  Samples s;
  DataLoader loader(s.data, {.sampler = {.micro_batch = 2}, .threads = 2, .depth = 2});
  loader.start_epoch(0);
  auto a = loader.next();
  const core::Tensor kept = a->inputs.reshape({2, kValues});  // a view keeps the buffer too
  a.reset();
  auto b = loader.next();
  CHECK_THROWS_WITH(loader.next(), Catch::Contains("holds all 2 batches"));
}

TEST_CASE("the pool grows with the batches the consumer holds", "[io][loader]") {
  // Note [loader pool size]: a consumer that keeps 12 micro-batches (a step
  // of --accum 12) before dropping them needs more than 2 * threads + 2.
  Samples s;
  const SamplerOptions o{.micro_batch = 4, .shuffle = false};
  DataLoader loader(s.data, {.sampler = o, .threads = 1, .held_batches = 12});
  CHECK(loader.depth() == 2 * 1 + 1 + 12);
  loader.start_epoch(0);
  std::vector<std::int64_t> seen;
  for (int step = 0; step < 3; ++step) {
    std::vector<Batch> held;
    for (int k = 0; k < 12; ++k) held.push_back(*loader.next());
    for (const Batch& b : held) seen.insert(seen.end(), b.indices.begin(), b.indices.end());
  }
  std::vector<std::int64_t> expected(36 * 4);
  std::iota(expected.begin(), expected.end(), 0);  // no shuffle: samples in order
  CHECK(seen == expected);
  // Holding more than an epoch's batches is impossible: the pool stops there.
  DataLoader capped(s.data, {.sampler = o, .threads = 1, .held_batches = 1 << 30});
  CHECK(capped.depth() == 2 * 1 + 1 + 150 / 4);
  CHECK_THROWS_WITH(DataLoader(s.data, {.sampler = o, .held_batches = 12, .depth = 11}),
                    Catch::Contains("depth 11 is below held_batches 12"));
  CHECK_THROWS_WITH(DataLoader(s.data, {.sampler = o, .held_batches = 0}),
                    Catch::Contains("held_batches is 0"));
}

TEST_CASE("u8 inputs scale to f32 by 1/255 and transforms run before", "[io][loader]") {
  Samples s;
  std::atomic<int> calls{0};
  DataLoader loader(s.data, {.sampler = {.micro_batch = 5, .shuffle = false},
                             .threads = 2,
                             .scale_u8 = true,
                             .transform = [&](HostBatch& b) {
                               ++calls;  // Catch's assertions are not for worker threads
                               if (b.dtype != DType::u8 || b.shape != core::Shape{5, 2, 3, 4})
                                 throw std::runtime_error("transform sees the wrong batch");
                               auto* x = static_cast<std::uint8_t*>(b.inputs);
                               for (std::int64_t i = 0; i < 5 * kValues; ++i) x[i] = 255 - x[i];
                               for (std::int64_t i = 0; i < 5; ++i) b.labels[i] = b.indices[i];
                             }});
  loader.start_epoch(0);
  int batches = 0;
  while (auto b = loader.next()) {
    ++batches;
    REQUIRE(b->inputs.dtype() == DType::f32);
    const auto x = b->inputs.to_vector<float>();
    const auto labels = b->labels.to_vector<std::int64_t>();
    for (std::int64_t i = 0; i < 5; ++i) {
      CHECK(labels[i] == b->indices[i]);
      for (std::int64_t j = 0; j < kValues; ++j) {
        const double raw = 255 - test::sample_value(b->indices[i], j, DType::u8);
        // Within an f32 rounding of the exact quotient (x * (1/255) rounds twice).
        CHECK(std::abs(x[i * kValues + j] - raw / 255.0) <= 2 * 0x1p-24);
      }
    }
  }
  CHECK(batches == 30);
  CHECK(calls == 30);
}

TEST_CASE("the loader rejects bad options and labels beyond the model", "[io][loader]") {
  Samples s;
  CHECK_THROWS_AS(DataLoader(s.data, {.threads = 0}), InvalidArgument);
  CHECK_THROWS_WITH(DataLoader(s.data, {.num_classes = 9}), Catch::Contains("label 9"));
  CHECK_NOTHROW(DataLoader(s.data, {.num_classes = 10}));
  DataLoader loader(s.data, {.sampler = {.micro_batch = 4}});
  CHECK_THROWS_AS(loader.next(), InvalidArgument);  // no epoch started
  CHECK_THROWS_AS(loader.start_epoch(0, 3), InvalidArgument);
  TempDir dir;
  test::write_shard(dir / "f.h5", 0, 10, {2}, DType::f32);
  CHECK_THROWS_WITH(DataLoader(Dataset::open(dir.path()), {.scale_u8 = true}),
                    Catch::Contains("scale_u8 needs u8 inputs"));
#if !LOCKSTEP_WITH_CUDA
  CHECK_THROWS_AS(DataLoader(s.data, {.device = core::Device::cuda(0)}), InvalidArgument);
#endif
}
