// Shards written by lockstep's writer and shards laid out the way h5py lays
// them out (contiguous; chunked with gzip; big-endian; user block; libver
// latest; and, when Debian's python3-h5py is there, files h5py itself wrote)
// read back to the values a formula predicts, through the pread path or the
// HDF5 path as their layout requires, and through the HDF5 path on request.
#include <fmt/core.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>

#include "io/dataset.h"
#include "io/shard_fixtures.h"
#include "io/shard_writer.h"

using namespace lockstep;
using namespace lockstep::io;
using test::TempDir;

namespace {

// Reads `rows` through the dataset and compares with the formula.
void require_rows_read(const Dataset& data, const std::vector<std::int64_t>& rows) {
  const ShardFormat& f = data.format();
  std::vector<std::uint8_t> got(rows.size() * f.sample_bytes());
  data.read_inputs(rows, got.data());
  const std::int64_t values = core::shape_numel(f.sample_shape);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto want = test::sample_bytes(rows[r], 1, values, f.input_dtype);
    INFO("row " << r << " = sample " << rows[r]);
    REQUIRE(std::equal(want.begin(), want.end(), got.begin() + r * f.sample_bytes()));
  }
}

// Every row once in a shuffled order, plus repeats and runs of neighbours.
std::vector<std::int64_t> mixed_rows(std::int64_t n, std::uint32_t seed) {
  std::vector<std::int64_t> rows(n);
  for (std::int64_t i = 0; i < n; ++i) rows[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(rows.begin(), rows.end(), rng);
  rows.push_back(rows[0]);
  rows.push_back(rows[0]);
  for (std::int64_t i = 0; i < std::min<std::int64_t>(n, 5); ++i) rows.push_back(i);
  return rows;
}

void require_all_labels(const Dataset& data) {
  for (std::int64_t i = 0; i < data.size(); ++i) REQUIRE(data.labels()[i] == test::sample_label(i));
}

}  // namespace

TEST_CASE("dataset writer shards read back through pread in every dtype", "[io][shards]") {
  const struct {
    DType input, label;
  } cases[] = {{DType::u8, DType::i64}, {DType::f16, DType::i32}, {DType::f32, DType::i64}};
  for (const auto& c : cases) {
    TempDir dir;
    const core::Shape sample{3, 5};
    const std::int64_t n = 103, values = 15;
    DatasetWriter writer(dir.path(), {c.input, sample, c.label}, n, 4, "part");
    // Appends of uneven sizes cross shard boundaries (shards hold 25 or 26 rows).
    for (std::int64_t first = 0, step = 1; first < n; first += step, step = step * 2 + 1) {
      const std::int64_t count = std::min(step, n - first);
      const auto inputs = test::sample_bytes(first, count, values, c.input);
      std::vector<std::int64_t> l64(count);
      std::vector<std::int32_t> l32(count);
      for (std::int64_t i = 0; i < count; ++i)
        l32[i] = static_cast<std::int32_t>(l64[i] = test::sample_label(first + i));
      writer.append(inputs.data(),
                    c.label == DType::i32 ? static_cast<const void*>(l32.data()) : l64.data(),
                    count);
    }
    writer.close();

    const Dataset data = Dataset::open(dir.path());
    REQUIRE(data.size() == n);
    REQUIRE(data.format() == ShardFormat{c.input, sample, c.label});
    REQUIRE(data.shards().size() == 4);
    for (std::size_t s = 0; s < 4; ++s) {
      CHECK(data.shards()[s].path.filename() == fmt::format("part-{:05d}-of-00004.h5", s));
      CHECK(data.shards()[s].first_row == n * static_cast<std::int64_t>(s) / 4);
      CHECK(data.shards()[s].layout == ShardLayout::contiguous);
    }
    require_all_labels(data);
    require_rows_read(data, mixed_rows(n, 1));
    CHECK_FALSE(std::filesystem::exists(data.shards()[0].path.string() + ".tmp"));
    // The same shards through the HDF5 path give the same rows.
    const Dataset via_hdf5 = Dataset::open(dir.path(), {.force_hdf5 = true});
    CHECK(via_hdf5.shards()[0].layout == ShardLayout::hdf5);
    require_rows_read(via_hdf5, mixed_rows(n, 6));
  }
}

TEST_CASE("files laid out as h5py writes them read correctly", "[io][shards]") {
  struct Case {
    const char* name;
    test::Layout layout;
    DType input, label;
    ShardLayout expected;
  };
  const Case cases[] = {
      {"contiguous", {}, DType::u8, DType::i64, ShardLayout::contiguous},
      {"contiguous with a user block",
       {.userblock = 1024},
       DType::f32,
       DType::i64,
       ShardLayout::contiguous},
      {"chunked + gzip", {.chunked = true}, DType::u8, DType::i64, ShardLayout::hdf5},
      {"chunked, no filters",
       {.chunked = true, .gzip = false},
       DType::f32,
       DType::i64,
       ShardLayout::hdf5},
      {"chunked + shuffle + gzip, f16",
       {.chunked = true, .shuffle = true},
       DType::f16,
       DType::i32,
       ShardLayout::hdf5},
      {"chunked + gzip, libver latest",
       {.chunked = true, .libver_latest = true},
       DType::f32,
       DType::i64,
       ShardLayout::hdf5},
      {"big-endian contiguous", {.big_endian = true}, DType::f32, DType::i64, ShardLayout::hdf5},
      {"big-endian f16", {.big_endian = true}, DType::f16, DType::i32, ShardLayout::hdf5},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    TempDir dir;
    // Two shards, 37 + 50 rows; chunks of 16 rows leave partial chunks at both ends.
    test::write_shard(dir / "a.h5", 0, 37, {2, 3, 4}, c.input, c.label, c.layout);
    test::write_shard(dir / "b.h5", 37, 50, {2, 3, 4}, c.input, c.label, c.layout);
    const Dataset data = Dataset::open(dir.path());
    REQUIRE(data.size() == 87);
    CHECK(data.shards()[0].layout == c.expected);
    require_all_labels(data);
    require_rows_read(data, mixed_rows(87, 2));
    require_rows_read(Dataset::open(dir.path(), {.force_hdf5 = true}), mixed_rows(87, 7));
  }
}

TEST_CASE("a dataset may mix contiguous and chunked shards", "[io][shards]") {
  TempDir dir;
  test::write_shard(dir / "0.h5", 0, 20, {7}, DType::u8);
  test::write_shard(dir / "1.h5", 20, 30, {7}, DType::u8, DType::i64, {.chunked = true});
  test::write_shard(dir / "2.h5", 50, 0, {7}, DType::u8);  // an empty shard is allowed
  test::write_shard(dir / "3.h5", 50, 10, {7}, DType::u8);
  const Dataset data = Dataset::open(dir.path());
  REQUIRE(data.size() == 60);
  CHECK(data.shards()[1].layout_reason == "chunked with filters");
  require_rows_read(data, mixed_rows(60, 3));
  // An explicit list keeps its order: samples of 3.h5 come first.
  const Dataset listed =
      Dataset::open(std::vector<std::filesystem::path>{dir / "3.h5", dir / "0.h5"});
  REQUIRE(listed.size() == 30);
  CHECK(listed.labels()[0] == test::sample_label(50));
  CHECK(listed.labels()[10] == test::sample_label(0));
}

TEST_CASE("many threads read both layouts at once", "[io][shards]") {
  TempDir dir;
  test::write_shard(dir / "a.h5", 0, 300, {16}, DType::f32);
  test::write_shard(dir / "b.h5", 300, 300, {16}, DType::f32, DType::i64, {.chunked = true});
  const Dataset data = Dataset::open(dir.path());
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::uniform_int_distribution<std::int64_t> pick(0, 599);
      std::vector<std::int64_t> rows(64);
      std::vector<std::uint8_t> got(64 * data.sample_bytes());
      for (int round = 0; round < 20; ++round) {
        for (auto& r : rows) r = pick(rng);
        data.read_inputs(rows, got.data());
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const auto want = test::sample_bytes(rows[i], 1, 16, DType::f32);
          if (!std::equal(want.begin(), want.end(), got.begin() + i * data.sample_bytes()))
            ++failures[t];
        }
      }
    });
  for (auto& t : threads) t.join();
  for (int t = 0; t < 8; ++t) CHECK(failures[t] == 0);
}

TEST_CASE("files written by h5py itself read correctly", "[io][shards][h5py]") {
  const char* python = "/usr/bin/python3";
  if (std::system((std::string(python) + " -c 'import h5py' 2>/dev/null").c_str()) != 0) {
    WARN("Debian's python3-h5py is not installed: skipping the h5py-written files");
    return;
  }
  TempDir dir;
  const std::filesystem::path script = dir / "make.py";
  // The same formula as test::sample_value and test::sample_label.
  std::ofstream(script) << R"(import sys, h5py, numpy as np
out = sys.argv[1]
i = np.arange(60)[:, None]; j = np.arange(12)[None, :]
u8 = ((i * 31 + j * 7 + 3) % 251).astype(np.uint8).reshape(60, 3, 4)
f16 = ((i % 512) + 0.25 * (j % 4)).astype(np.float16).reshape(60, 3, 4)
labels = (np.arange(60) * 7) % 10
with h5py.File(out + '/a.h5', 'w') as f:
    f['inputs'] = u8[:25]; f['labels'] = labels[:25]
with h5py.File(out + '/b.h5', 'w') as f:
    f.create_dataset('inputs', data=u8[25:], chunks=(8, 3, 4), compression='gzip', shuffle=True)
    f.create_dataset('labels', data=labels[25:], compression='gzip')
with h5py.File(out + '/f16.h5', 'w', libver='latest') as f:
    f.create_dataset('inputs', data=f16, chunks=True, compression='gzip')
    f.create_dataset('labels', data=labels.astype('>i8'))
)";
  REQUIRE(std::system(
              (std::string(python) + " " + script.string() + " " + dir.path().string()).c_str()) ==
          0);
  const Dataset u8 = Dataset::open(std::vector<std::filesystem::path>{dir / "a.h5", dir / "b.h5"});
  REQUIRE(u8.size() == 60);
  CHECK(u8.shards()[0].layout == ShardLayout::contiguous);
  CHECK(u8.shards()[1].layout == ShardLayout::hdf5);
  require_all_labels(u8);
  require_rows_read(u8, mixed_rows(60, 4));
  const Dataset f16 = Dataset::open(dir / "f16.h5");
  REQUIRE(f16.format() == ShardFormat{DType::f16, {3, 4}, DType::i64});
  require_all_labels(f16);
  require_rows_read(f16, mixed_rows(60, 5));
}

TEST_CASE("a writer that is not closed leaves no shard behind", "[io][shards]") {
  TempDir dir;
  const ShardFormat format{DType::u8, {4}, DType::i64};
  const auto inputs = test::sample_bytes(0, 10, 4, DType::u8);
  const std::vector<std::int64_t> labels(10, 1);
  {
    ShardWriter writer(dir / "s.h5", format, 10);
    writer.append(inputs.data(), labels.data(), 6);
    CHECK(std::filesystem::exists(dir / "s.h5.tmp"));
    CHECK_THROWS_AS(writer.close(), InvalidArgument);  // 6 of 10 rows
  }
  CHECK_FALSE(std::filesystem::exists(dir / "s.h5"));
  CHECK_FALSE(std::filesystem::exists(dir / "s.h5.tmp"));
  {
    ShardWriter writer(dir / "s.h5", format, 10);
    CHECK_THROWS_AS(writer.append(inputs.data(), labels.data(), 11), InvalidArgument);
    writer.append(inputs.data(), labels.data(), 10);
    writer.close();
  }
  CHECK(Dataset::open(dir / "s.h5").size() == 10);
  CHECK_THROWS_WITH(DatasetWriter(dir.path(), format, 10, 1),
                    Catch::Contains("already holds shards (s.h5)"));
  CHECK_THROWS_AS(ShardWriter(dir / "t.h5", {DType::i32, {4}, DType::i64}, 1), InvalidArgument);
  CHECK_THROWS_AS(ShardWriter(dir / "t.h5", {DType::u8, {0}, DType::i64}, 1), InvalidArgument);
  CHECK_THROWS_AS(ShardWriter(dir / "t.h5", {DType::u8, {4}, DType::f32}, 1), InvalidArgument);
  CHECK_THROWS_AS(DatasetWriter(dir / "more", format, 3, 4), InvalidArgument);
  {
    DatasetWriter partial(dir / "partial", format, 10, 3);
    partial.append(inputs.data(), labels.data(), 7);  // shards 0 and 1 done, 2 started
    CHECK(std::filesystem::exists(partial.shard_paths()[0]));
  }
  CHECK(std::filesystem::is_empty(dir / "partial"));
}

TEST_CASE("a dataset's agreement fields name its size, format and every shard's file",
          "[io][shards][agreement]") {
  TempDir dir;
  const std::int64_t n = 10;
  DatasetWriter writer(dir.path(), {DType::u8, {2, 3}, DType::i32}, n, 2, "part");
  const auto inputs = test::sample_bytes(0, n, 6, DType::u8);
  std::vector<std::int32_t> labels(n, 1);
  writer.append(inputs.data(), labels.data(), n);
  writer.close();
  const Dataset data = Dataset::open(dir.path());
  const auto fields = data.agreement_fields();
  REQUIRE(fields.size() == 5);
  CHECK(fields[0] == std::pair<std::string, std::string>{"dataset.samples", "10"});
  CHECK(fields[1] ==
        std::pair<std::string, std::string>{"dataset.format", "inputs u8 [2, 3], labels i32"});
  CHECK(fields[2] == std::pair<std::string, std::string>{"dataset.shards", "2"});
  for (std::size_t i = 0; i < 2; ++i) {
    const ShardInfo& s = data.shards()[i];
    // The name without its directory: copies in other directories agree.
    CHECK(fields[3 + i].first == fmt::format("dataset.shard[{}]", i));
    CHECK(fields[3 + i].second == fmt::format("{}: 5 rows, {} bytes", s.path.filename().string(),
                                              std::filesystem::file_size(s.path)));
  }
}
