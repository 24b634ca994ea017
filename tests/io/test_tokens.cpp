// Token shards (docs/data-format.md): i32 or u16 windows [N, T+1] and no
// labels. The loader hands out the first T tokens as inputs and the last T as
// targets, resumes at a position like image shards, checks tokens against
// the vocabulary naming the shard and row, and h5py reads and writes them.
#include <fmt/core.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>

#include "io/dataset.h"
#include "io/loader.h"
#include "io/shard_fixtures.h"
#include "io/shard_writer.h"

using namespace lockstep;
using namespace lockstep::io;
using test::TempDir;

namespace {

constexpr std::int64_t kWindows = 40, kSeq = 6;

// Token t of window i: any formula that differs across windows and positions.
std::int32_t token(std::int64_t i, std::int64_t t) {
  return static_cast<std::int32_t>((i * 13 + t * 5) % 97);
}

void write_tokens(const std::filesystem::path& dir, int shards) {
  DatasetWriter writer(dir, {DType::i32, {kSeq + 1}, DType::i64, false}, kWindows, shards);
  std::vector<std::int32_t> w(kWindows * (kSeq + 1));
  for (std::int64_t i = 0; i < kWindows; ++i)
    for (std::int64_t t = 0; t <= kSeq; ++t) w[i * (kSeq + 1) + t] = token(i, t);
  writer.append(w.data(), nullptr, kWindows);
  writer.close();
}

void require_shifted(const Batch& b) {
  REQUIRE(b.inputs.shape() == core::Shape{b.inputs.dim(0), kSeq});
  REQUIRE(b.inputs.dtype() == DType::i32);
  REQUIRE(b.labels.shape() == b.inputs.shape());
  const auto x = b.inputs.to_vector<std::int32_t>();
  const auto y = b.labels.to_vector<std::int64_t>();
  for (std::size_t r = 0; r < b.indices.size(); ++r)
    for (std::int64_t t = 0; t < kSeq; ++t) {
      REQUIRE(x[r * kSeq + t] == token(b.indices[r], t));
      REQUIRE(y[r * kSeq + t] == token(b.indices[r], t + 1));
    }
}

LoaderOptions options(std::int64_t vocab) {
  LoaderOptions o;
  o.sampler = {.micro_batch = 4, .world_size = 2, .rank = 1, .shuffle = true, .seed = 3};
  o.threads = 2;
  o.num_classes = vocab;
  return o;
}

}  // namespace

TEST_CASE("token windows load as inputs and next-token targets, and resume", "[io][tokens]") {
  TempDir dir;
  write_tokens(dir.path(), 3);
  Dataset data = Dataset::open(dir.path());
  REQUIRE(data.size() == kWindows);
  REQUIRE_FALSE(data.format().has_labels);
  REQUIRE(data.labels().empty());
  DataLoader loader(data, options(97));
  loader.start_epoch(1);
  std::vector<std::vector<std::int32_t>> straight;
  while (auto b = loader.next()) {
    require_shifted(*b);
    straight.push_back(b->inputs.to_vector<std::int32_t>());
  }
  REQUIRE(straight.size() == 5);  // 40 windows / (4 x 2 ranks)
  // Resuming after two global batches (16 samples) gives the rest, unchanged.
  DataLoader resumed(data, options(97));
  resumed.start_epoch(1, 16);
  for (std::size_t k = 2; k < straight.size(); ++k) {
    auto b = resumed.next();
    REQUIRE(b);
    REQUIRE(b->inputs.to_vector<std::int32_t>() == straight[k]);
  }
}

TEST_CASE("a token outside the vocabulary names the shard, row and column", "[io][tokens]") {
  TempDir dir;
  write_tokens(dir.path(), 1);
  DataLoader loader(Dataset::open(dir.path()), options(50));
  loader.start_epoch(0);
  // Some window holds a token >= 50 (the formula reaches 96).
  CHECK_THROWS_WITH(
      [&] {
        while (loader.next()) {
        }
      }(),
      Catch::Contains("shard '") && Catch::Contains("dataset 'inputs'") &&
          Catch::Contains("is outside [0, 50)"));
}

TEST_CASE("token formats are checked when written and when read", "[io][tokens]") {
  TempDir dir;
  CHECK_THROWS_WITH(ShardWriter(dir / "a.h5", {DType::f32, {7}, DType::i64, false}, 1),
                    Catch::Contains("token shard") && Catch::Contains("i32 windows"));
  CHECK_THROWS_WITH(ShardWriter(dir / "b.h5", {DType::i32, {1}, DType::i64, false}, 1),
                    Catch::Contains("T >= 1"));
  // An f32 shard without labels is neither kind.
  const std::vector<float> values(6, 1.0f);
  const hid_t file = test::create_file(dir / "c.h5", {});
  test::write_dataset(file, "inputs", DType::f32, {2, 3}, values.data(), {});
  H5Fclose(file);
  CHECK_THROWS_WITH(Dataset::open(dir / "c.h5"), Catch::Contains("dataset 'labels': missing") &&
                                                     Catch::Contains("these inputs are f32"));
}

TEST_CASE("h5py reads lockstep's token shards and writes u16 and i32 ones", "[io][tokens][h5py]") {
  const char* python = "/usr/bin/python3";
  if (std::system(fmt::format("{} -c 'import h5py' 2>/dev/null", python).c_str()) != 0) {
    WARN("Debian's python3-h5py is not installed: skipping the h5py round trip");
    return;
  }
  TempDir dir;
  write_tokens(dir / "ours", 2);
  const std::filesystem::path script = dir / "check.py";
  // The same formula as token(); exits non-zero on any difference.
  std::ofstream(script) << R"(import sys, glob, h5py, numpy as np
src, out = sys.argv[1], sys.argv[2]
i = np.arange(40)[:, None]; t = np.arange(7)[None, :]
expected = ((i * 13 + t * 5) % 97)
rows = np.concatenate([h5py.File(p, 'r')['inputs'][:] for p in sorted(glob.glob(src + '/*.h5'))])
assert rows.dtype == np.int32 and 'labels' not in h5py.File(sorted(glob.glob(src + '/*.h5'))[0], 'r')
assert (rows == expected).all(), 'lockstep token shard differs from the formula'
with h5py.File(out + '/u16/a.h5', 'w') as f: f['inputs'] = expected.astype(np.uint16)
with h5py.File(out + '/i32/a.h5', 'w') as f: f['inputs'] = expected.astype(np.int32)
)";
  std::filesystem::create_directories(dir / "u16");
  std::filesystem::create_directories(dir / "i32");
  REQUIRE(std::system(fmt::format("{} {} {} {}", python, script.string(), (dir / "ours").string(),
                                  dir.path().string())
                          .c_str()) == 0);
  for (const char* kind : {"u16", "i32"}) {
    INFO(kind);
    Dataset data = Dataset::open(dir / kind);
    REQUIRE(data.format().input_dtype == DType::i32);
    REQUIRE(data.shards()[0].layout ==
            (std::string(kind) == "u16" ? ShardLayout::hdf5 : ShardLayout::contiguous));
    DataLoader loader(data, options(97));
    loader.start_epoch(0);
    while (auto b = loader.next()) require_shifted(*b);
  }
}

TEST_CASE("lockstep-shard text writes byte windows T apart and holds out the tail",
          "[io][tokens][programs]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>("lockstep\n\xff"[i % 10]);
  std::ofstream(dir / "a.txt", std::ios::binary) << text.substr(0, 600);
  std::ofstream(dir / "b.txt", std::ios::binary) << text.substr(600);
  const std::string command =
      fmt::format("{} text --src {} {} --out {} --seq 16 --shards 3 --val-fraction 0.2 >/dev/null",
                  LOCKSTEP_SHARD_TOOL, (dir / "a.txt").string(), (dir / "b.txt").string(),
                  (dir / "out").string());
  REQUIRE(std::system(command.c_str()) == 0);
  // 800 train bytes: (800 - 1) / 16 = 49 windows; 200 val bytes: 12 windows.
  for (auto [split, first_byte, windows] :
       {std::tuple{"train", 0, 49}, std::tuple{"val", 800, 12}}) {
    Dataset data = Dataset::open(dir / "out" / split);
    REQUIRE(data.size() == windows);
    std::vector<std::int32_t> rows(static_cast<std::size_t>(windows * 17));
    std::vector<std::int64_t> all(static_cast<std::size_t>(windows));
    for (std::int64_t i = 0; i < windows; ++i) all[i] = i;
    data.read_inputs(all, rows.data());
    for (std::int64_t w = 0; w < windows; ++w)
      for (std::int64_t t = 0; t < 17; ++t)
        REQUIRE(rows[w * 17 + t] == static_cast<std::uint8_t>(text[first_byte + w * 16 + t]));
  }
  const std::string too_long =
      fmt::format("{} text --src {} --out {} --seq 5000 2>&1 | grep -q 'fewer than one window'",
                  LOCKSTEP_SHARD_TOOL, (dir / "a.txt").string(), (dir / "bad").string());
  CHECK(std::system(too_long.c_str()) == 0);
}
