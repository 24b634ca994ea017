// TensorDataset: each rank's rows are the sampler's (every sample once per
// epoch across the ranks, a new order per epoch, the same order for the same
// seed), a batch holds exactly those rows' values, a resumed position
// continues the sequence, and bad tensors (a class or a probability out of
// range included) are refused naming the argument.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "io/tensor_dataset.h"
#include "kernels/error.h"

using namespace lockstep;
using namespace lockstep::io;

namespace {

constexpr std::int64_t kRows = 60;

// Row i holds (i, -i) and label i % 5: a batch's values name its rows.
TensorDataset rows(int world_size, int rank, std::int64_t micro_batch, std::uint64_t seed = 1) {
  std::vector<float> x(2 * kRows);
  std::vector<std::int64_t> y(kRows);
  for (std::int64_t i = 0; i < kRows; ++i) {
    x[2 * i] = static_cast<float>(i);
    x[2 * i + 1] = -static_cast<float>(i);
    y[i] = i % 5;
  }
  TensorDatasetOptions o;
  o.sampler = {.micro_batch = micro_batch, .world_size = world_size, .rank = rank, .seed = seed};
  o.num_classes = 5;
  return TensorDataset(core::Tensor::from_vector(x, {kRows, 2}, DType::f32),
                       core::Tensor::from_vector(y, {kRows}, DType::i64), o);
}

// Every row index of `epoch` in the order rank 0..N-1 takes them, batch by batch.
std::vector<std::int64_t> epoch_rows(int world_size, std::int64_t micro_batch, std::int64_t epoch,
                                     std::uint64_t seed = 1) {
  std::vector<TensorDataset> ranks;
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(rows(world_size, r, micro_batch, seed));
    ranks.back().start_epoch(epoch);
  }
  std::vector<std::int64_t> seen;
  for (std::int64_t b = 0; b < ranks[0].batches_per_epoch(); ++b)
    for (TensorDataset& d : ranks) {
      const std::optional<Batch> batch = d.next();
      REQUIRE(batch);
      CHECK(batch->index == b);
      CHECK(batch->valid == micro_batch);
      const auto x = batch->inputs.to_vector<float>();
      const auto y = batch->labels.to_vector<std::int64_t>();
      for (std::size_t i = 0; i < batch->indices.size(); ++i) {
        const std::int64_t row = batch->indices[i];
        CHECK(x[2 * i] == static_cast<float>(row));
        CHECK(x[2 * i + 1] == -static_cast<float>(row));
        CHECK(y[i] == row % 5);
        seen.push_back(row);
      }
    }
  for (TensorDataset& d : ranks) CHECK_FALSE(d.next());
  return seen;
}

}  // namespace

TEST_CASE("the ranks of a TensorDataset take every row once per epoch", "[io][tensor_dataset]") {
  for (int world : {1, 2, 3}) {
    INFO(world << " ranks");
    std::vector<std::int64_t> seen = epoch_rows(world, 2, 0);
    CHECK(seen.size() == kRows);  // 60 is a multiple of 2 x (1, 2, 3): nothing dropped
    std::sort(seen.begin(), seen.end());
    std::vector<std::int64_t> all(kRows);
    std::iota(all.begin(), all.end(), 0);
    CHECK(seen == all);
  }
}

TEST_CASE("a TensorDataset's order depends on seed and epoch, not on the world size",
          "[io][tensor_dataset]") {
  const auto one = epoch_rows(1, 6, 0);
  // The global batch of 6 rows split over 2 or 3 ranks is the same rows in the same order.
  CHECK(epoch_rows(2, 3, 0) == one);
  CHECK(epoch_rows(3, 2, 0) == one);
  CHECK(epoch_rows(1, 6, 0) == one);
  CHECK(epoch_rows(1, 6, 1) != one);
  CHECK(epoch_rows(1, 6, 0, 2) != one);
}

TEST_CASE("a TensorDataset resumed at a position continues the sequence", "[io][tensor_dataset]") {
  TensorDataset straight = rows(2, 1, 3);
  straight.start_epoch(2);
  for (int i = 0; i < 4; ++i) straight.next();
  const LoaderPosition at = straight.position();
  CHECK(at.epoch == 2);
  CHECK(at.position == 4 * 6);
  TensorDataset resumed = rows(2, 1, 3);
  resumed.start_epoch(at.epoch, at.position);
  while (auto expected = straight.next()) {
    const auto got = resumed.next();
    REQUIRE(got);
    CHECK(got->indices == expected->indices);
  }
  CHECK_FALSE(resumed.next());
  CHECK_THROWS_WITH(resumed.start_epoch(0, 5),
                    Catch::Contains("not a multiple of the global batch 6"));
}

TEST_CASE("a TensorDataset refuses tensors it cannot hand out, naming the argument",
          "[io][tensor_dataset]") {
  const auto x = core::Tensor::zeros({4, 2}, DType::f32);
  const auto y = core::Tensor::from_vector<std::int64_t>({0, 1, 2, 3}, {4}, DType::i64);
  TensorDatasetOptions o;
  CHECK_THROWS_WITH(TensorDataset(x, core::Tensor::zeros({3}, DType::i64), o),
                    Catch::Contains("inputs have 4 rows [4, 2] but targets 3 [3]"));
  CHECK_THROWS_WITH(TensorDataset(core::Tensor(), y, o),
                    Catch::Contains("inputs must be a tensor with a first dimension of rows"));
  o.num_classes = 3;
  CHECK_THROWS_WITH(TensorDataset(x, y, o),
                    Catch::Contains("targets row 3 holds 3, outside [0, 3)"));
  o.num_classes = 4;
  TensorDataset d(x, y, o);
  CHECK_THROWS_WITH(d.next(), Catch::Contains("before start_epoch()"));
}

TEST_CASE(
    "a TensorDataset for binary cross-entropy refuses a target outside [0, 1], naming its row",
    "[io][tensor_dataset]") {
  // Rows of 3 targets; the bad value's place is written out by hand. NaN
  // compares false with both ends, so it is refused as well.
  const auto x = core::Tensor::zeros({3, 2}, DType::f32);
  const TensorDatasetOptions bce{.probability_targets = true};
  const std::vector<float> good{0.0f, 1.0f, 0.25f, 1.0f, 0.0f, 0.5f, 0.75f, 0.0f, 1.0f};
  CHECK_NOTHROW(TensorDataset(x, core::Tensor::from_vector(good, {3, 3}, DType::f32), bce));
  for (const auto& [value, text] : std::vector<std::pair<float, std::string>>{
           {1.5f, "1.5"}, {-0.25f, "-0.25"}, {std::nanf(""), "nan"}}) {
    std::vector<float> bad = good;
    bad[7] = value;  // row 2, value 1 of the row
    CHECK_THROWS_WITH(
        TensorDataset(x, core::Tensor::from_vector(bad, {3, 3}, DType::f32), bce),
        Catch::Contains("targets row 2 holds " + text + " (value 1 of the row), outside [0, 1]"));
    // Without the option (mse, l1, huber) any finite value is a target.
    if (!std::isnan(value))
      CHECK_NOTHROW(TensorDataset(x, core::Tensor::from_vector(bad, {3, 3}, DType::f32), {}));
  }
  // f16 targets are checked as their f32 values: 0x3E00 is 1.5.
  const std::vector<std::uint16_t> half{0x0000, 0x3C00, 0x3E00};
  CHECK_THROWS_WITH(TensorDataset(x, core::Tensor::from_vector(half, {3, 1}, DType::f16), bce),
                    Catch::Contains("targets row 2 holds 1.5"));
}

TEST_CASE("ranks with different rows disagree on the TensorDataset's digest",
          "[io][tensor_dataset]") {
  const auto fields = rows(1, 0, 4).agreement_fields();
  CHECK(fields == rows(2, 1, 3).agreement_fields());  // rows, not the sharding
  std::vector<float> x(2 * kRows, 0.0f);
  std::vector<std::int64_t> y(kRows, 0);
  TensorDataset other(core::Tensor::from_vector(x, {kRows, 2}, DType::f32),
                      core::Tensor::from_vector(y, {kRows}, DType::i64), {});
  const auto other_fields = other.agreement_fields();
  REQUIRE(other_fields.size() == fields.size());
  CHECK(other_fields[0] == fields[0]);  // the same row count and shapes
  CHECK(other_fields.back().first == "tensor_dataset.digest");
  CHECK(other_fields.back().second != fields.back().second);
}

TEST_CASE("a TensorDataset widens integer targets to i64 and hands out float targets as they are",
          "[io][tensor_dataset]") {
  const auto x = core::Tensor::zeros({4, 2}, DType::f32);
  TensorDatasetOptions o;
  o.sampler = {.micro_batch = 4, .world_size = 1, .rank = 0, .shuffle = false};
  o.num_classes = 250;  // u8 values past 127 must not wrap to negative ones
  TensorDataset bytes(x, core::Tensor::from_vector<std::uint8_t>({3, 200, 0, 9}, {4}, DType::u8),
                      o);
  bytes.start_epoch(0);
  const auto b = bytes.next();
  REQUIRE(b);
  CHECK(b->labels.dtype() == DType::i64);
  CHECK(b->labels.to_vector<std::int64_t>() == std::vector<std::int64_t>{3, 200, 0, 9});
  TensorDataset ints(x, core::Tensor::from_vector<std::int32_t>({1, -100, 2, 3}, {4}, DType::i32),
                     TensorDatasetOptions{.sampler = o.sampler});
  ints.start_epoch(0);
  CHECK(ints.next()->labels.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, -100, 2, 3});
  const std::vector<float> values{0.5f, -1.25f, 3.0f, 1e-3f, 7.0f, 8.0f, -2.0f, 0.0f};
  TensorDataset floats(x, core::Tensor::from_vector(values, {4, 2}, DType::f32),
                       TensorDatasetOptions{.sampler = o.sampler});
  floats.start_epoch(0);
  const auto f = floats.next();
  CHECK(f->labels.dtype() == DType::f32);
  CHECK(f->labels.shape() == core::Shape{4, 2});
  CHECK(f->labels.to_vector<float>() == values);
}

TEST_CASE("a TensorDataset hands out its named tensors' rows beside the inputs'",
          "[io][tensor_dataset]") {
  std::vector<float> x(2 * kRows), value(kRows);
  std::vector<std::int64_t> y(kRows);
  std::vector<std::int32_t> second(kRows);
  for (std::int64_t i = 0; i < kRows; ++i) {
    x[2 * i] = static_cast<float>(i), x[2 * i + 1] = -static_cast<float>(i);
    y[i] = i % 5, value[i] = 0.5f * static_cast<float>(i), second[i] = static_cast<int>(i % 7);
  }
  TensorDatasetOptions o;
  o.sampler = {.micro_batch = 4, .world_size = 2, .rank = 1, .seed = 5};
  TensorDataset d(core::Tensor::from_vector(x, {kRows, 2}, DType::f32),
                  core::Tensor::from_vector(y, {kRows}, DType::i64),
                  {{"value", core::Tensor::from_vector(value, {kRows, 1}, DType::f32)},
                   {"second", core::Tensor::from_vector(second, {kRows}, DType::i32)}},
                  o);
  d.start_epoch(1);
  std::int64_t batches = 0;
  while (const std::optional<Batch> b = d.next()) {
    ++batches;
    const auto xs = b->inputs.to_vector<float>();
    const auto vs = b->named.at("value", "test").to_vector<float>();
    const core::Tensor& s = b->named.at("second", "test");
    REQUIRE(s.dtype() == DType::i64);  // widened as integer targets are
    const auto ss = s.to_vector<std::int64_t>();
    for (std::size_t r = 0; r < b->indices.size(); ++r) {
      const std::int64_t i = b->indices[r];
      // Row i's own values, whatever the order: the inputs' first column is i.
      CHECK(xs[2 * r] == static_cast<float>(i));
      CHECK(vs[r] == 0.5f * static_cast<float>(i));
      CHECK(ss[r] == i % 7);
    }
  }
  CHECK(batches == d.batches_per_epoch());
  CHECK_THROWS_WITH(TensorDataset(core::Tensor::from_vector(x, {kRows, 2}, DType::f32),
                                  core::Tensor::from_vector(y, {kRows}, DType::i64),
                                  {{"mask", core::Tensor::zeros({kRows - 1}, DType::f32)}}, o),
                    Catch::Contains("named tensor 'mask' has 59 rows"));
}
