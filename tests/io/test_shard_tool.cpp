// lockstep-shard, run as a user runs it: Fashion-MNIST converted from Debian's
// IDX files (compared byte for byte with a plain zlib read of them, and with
// the dataset's published facts), synthetic datasets equal to their Philox
// definition, and usage errors.
#include <fmt/core.h>
#include <zlib.h>
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "io/dataset.h"
#include "io/shard_fixtures.h"
#include "io/shard_tool.h"
#include "kernels/philox.h"

using namespace lockstep;
using namespace lockstep::io;
using test::run_shard_tool;
using test::TempDir;
namespace fs = std::filesystem;

namespace {

const fs::path kFashionMnist = "/usr/share/datasets/fashion-mnist";

// The pixels of an IDX image file, after its 16-byte header.
std::vector<std::uint8_t> idx_pixels(const fs::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  REQUIRE(file);
  std::vector<std::uint8_t> bytes;
  std::array<std::uint8_t, 1 << 16> buffer;
  int got;
  while ((got = gzread(file, buffer.data(), buffer.size())) > 0)
    bytes.insert(bytes.end(), buffer.begin(), buffer.begin() + got);
  gzclose(file);
  return {bytes.begin() + 16, bytes.end()};
}

std::vector<std::uint8_t> read_all(const Dataset& data) {
  std::vector<std::int64_t> rows(data.size());
  for (std::int64_t i = 0; i < data.size(); ++i) rows[i] = i;
  std::vector<std::uint8_t> out(data.size() * data.sample_bytes());
  data.read_inputs(rows, out.data());
  return out;
}

}  // namespace

TEST_CASE("lockstep-shard converts Fashion-MNIST into train and val shards", "[io][tool]") {
  if (!fs::exists(kFashionMnist / "train-images-idx3-ubyte.gz")) {
    WARN("dataset-fashion-mnist is not installed: skipping the conversion");
    return;
  }
  TempDir out;
  std::string log;
  REQUIRE(run_shard_tool("fashion-mnist --out " + out.path().string() + " --shards 3", &log) == 0);
  CHECK_THAT(log, Catch::Contains("train: 60000/60000 samples (100%"));

  const Dataset train = Dataset::open(out / "train");
  const Dataset test = Dataset::open(out / "val");  // Fashion-MNIST's test set (t10k)
  REQUIRE(train.size() == 60000);  // Fashion-MNIST: 60000 training and 10000 test images,
  REQUIRE(test.size() == 10000);   // 10 classes of equal size in each
  REQUIRE(train.shards().size() == 3);
  CHECK(train.format() == ShardFormat{DType::u8, {1, 28, 28}, DType::i64});
  for (const auto& [data, per_class] : {std::pair{&train, 6000}, {&test, 1000}}) {
    std::vector<int> count(10, 0);
    for (std::int64_t label : data->labels()) ++count.at(label);
    for (int c : count) CHECK(c == per_class);
  }
  // The first training labels as Zalando's dataset publishes them (9 = ankle boot).
  CHECK(std::vector<std::int64_t>(train.labels().begin(), train.labels().begin() + 5) ==
        std::vector<std::int64_t>{9, 0, 0, 3, 0});
  const auto pixels = read_all(train);  // pread
  CHECK(pixels == idx_pixels(kFashionMnist / "train-images-idx3-ubyte.gz"));
  CHECK(pixels == read_all(Dataset::open(out / "train", {.force_hdf5 = true})));
  CHECK(read_all(test) == idx_pixels(kFashionMnist / "t10k-images-idx3-ubyte.gz"));
}

TEST_CASE("lockstep-shard synthetic writes sample i from Philox (seed, i)", "[io][tool]") {
  for (const char* dtype : {"u8", "f32"}) {
    TempDir out;
    REQUIRE(run_shard_tool(fmt::format("synthetic --out {} --count 300 --shape 2,5 --dtype {} "
                                       "--classes 7 --shards 4 --seed 99",
                                       out.path().string(), dtype)) == 0);
    const Dataset data = Dataset::open(out.path());
    REQUIRE(data.size() == 300);
    REQUIRE(data.shards().size() == 4);
    const bool is_u8 = std::string(dtype) == "u8";
    REQUIRE(data.format() == ShardFormat{is_u8 ? DType::u8 : DType::f32, {2, 5}, DType::i64});
    const auto bytes = read_all(data);
    const std::int64_t words = is_u8 ? 3 : 10;  // ceil(sample bytes / 4)
    for (std::int64_t i = 0; i < 300; ++i) {
      std::vector<std::uint32_t> w(words);
      kernels::cpu::random_words({99, 0}, i * words, w.data(), words);
      std::vector<std::uint8_t> want(data.sample_bytes());
      if (is_u8) {
        std::memcpy(want.data(), w.data(), want.size());
      } else {
        for (std::int64_t v = 0; v < 10; ++v) {
          const float u = static_cast<float>(w[v] >> 8) * 0x1p-24f;  // kernels' uniform
          std::memcpy(want.data() + 4 * v, &u, 4);
        }
      }
      REQUIRE(std::equal(want.begin(), want.end(), bytes.begin() + i * data.sample_bytes()));
      std::uint32_t label_word;
      kernels::cpu::random_words({99, 1}, i, &label_word, 1);
      REQUIRE(data.labels()[i] == label_word % 7);
    }
  }
}

TEST_CASE("lockstep-shard explains bad usage", "[io][tool]") {
  std::string out;
  CHECK(run_shard_tool("--help", &out) == 0);
  CHECK_THAT(out, Catch::Contains("fashion-mnist") && Catch::Contains("synthetic"));
  TempDir dir;
  // Refused while parsing (CLI11's validation error), naming the flag and the choices.
  CHECK(run_shard_tool("synthetic --out " + dir.path().string() + " --count 4 --dtype f64", &out) !=
        0);
  CHECK_THAT(out, Catch::Contains("--dtype: 'f64' is not allowed (allowed: u8, f16, f32)"));
  CHECK(run_shard_tool(
            "fashion-mnist --src " + dir.path().string() + " --out " + (dir / "o").string(),
            &out) == 1);
  CHECK_THAT(out, Catch::Contains("cannot open IDX file"));
  CHECK(run_shard_tool("synthetic --count 4", &out) != 0);  // --out is required
}
