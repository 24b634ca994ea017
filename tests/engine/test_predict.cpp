// engine::Predictor (engine/predict.h) against references built without it:
// a second copy of the model, with the same weights, run forward in eval
// mode on inputs scaled and normalised here by a float64 loop; its shard
// path against its tensor path; its argmax against a hand count.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "engine/checkpoint.h"
#include "engine/checkpoint_file.h"
#include "engine/models.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"
#include "engine/predict.h"
#include "io/dataset.h"
#include "io/shard_writer.h"
#include "tests/support/batch_norms.h"
#include "tests/temp_dir.h"

using namespace lockstep;
using namespace lockstep::engine;
using Catch::Contains;

namespace {

// A model of `preset` with random weights, its checkpoint (with `input` as
// its input record) written under `dir`; the model stays on the CPU for the
// reference forward.
struct Reference {
  std::unique_ptr<Module> model;
  std::unique_ptr<ParameterStore> store;
  std::filesystem::path checkpoint;
};

Reference reference(const std::string& preset, const std::filesystem::path& dir,
                    const std::optional<InputRecord>& input) {
  Reference r;
  r.model = make_model(preset);
  initialize(*r.model, 11);
  r.store = std::make_unique<ParameterStore>(*r.model, core::Device::cpu());
  SGD sgd(*r.store, single_group(*r.store, 0.1, 0.0));
  std::mt19937 rng(5);
  test::perturb_batch_norms(*r.model, rng);
  TrainingState state;
  if (input) state.input = input->fields();
  const CheckpointDirectory checkpoints(dir, 1, CheckpointStart::fresh);
  r.checkpoint = checkpoints.save(0, capture_checkpoint(*r.model, sgd, state, {}));
  return r;
}

std::vector<std::uint8_t> random_bytes(std::int64_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(count));
  for (auto& b : out) b = static_cast<std::uint8_t>(byte(rng));
  return out;
}

// (x / 255 - mean[c]) / std[c] in float64, rounded once to f32: the
// preprocessing of Note [preprocess like training], written independently.
core::Tensor scaled(const std::vector<std::uint8_t>& bytes, const core::Shape& shape,
                    const std::vector<double>& mean, const std::vector<double>& std) {
  const std::int64_t channels = shape[1], plane = core::shape_numel(shape) / shape[0] / channels;
  std::vector<float> out(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto c = static_cast<std::size_t>((static_cast<std::int64_t>(i) / plane) % channels);
    const double m = mean.empty() ? 0.0 : mean[mean.size() == 1 ? 0 : c];
    const double s = std.empty() ? 1.0 : std[std.size() == 1 ? 0 : c];
    out[i] = static_cast<float>((bytes[i] / 255.0 - m) / s);
  }
  return core::Tensor::from_vector(out, shape, DType::f32);
}

// max |a - b| / max |b|: the normwise error check_onnx.py uses.
double normwise_error(const core::Tensor& a, const core::Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  REQUIRE(x.size() == y.size());
  double diff = 0, top = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
    top = std::max(top, std::abs(static_cast<double>(y[i])));
  }
  return diff / top;
}

// The predictor's input is x * (1.0f / 255) (or the image pipeline's affine),
// the reference's the correctly rounded quotient: they differ by at most an
// ulp or two of f32 (2^-23 relative), and a forward of a few layers with
// O(1) weights grows that by a small factor. 1e-5 is far below what a
// missing scale, normalisation or eval mode gives (errors near 1).
constexpr double kTolerance = 1e-5;

}  // namespace

TEST_CASE("a Predictor gives the eval-mode forward of u8 inputs divided by 255", "[predict]") {
  test::TempDir dir;
  Reference ref = reference("mlp", dir / "ckpt", std::nullopt);
  const core::Shape shape{5, 1, 28, 28};
  const std::vector<std::uint8_t> bytes = random_bytes(core::shape_numel(shape), 1);
  Predictor predictor("mlp", ref.checkpoint);
  CHECK_FALSE(predictor.input());  // a checkpoint written without a record
  const core::Tensor got = predictor.predict(core::Tensor::from_vector(bytes, shape, DType::u8));
  REQUIRE(got.shape() == core::Shape{5, 10});
  ref.model->eval();
  Context ctx;
  const core::Tensor want = ref.model->forward(scaled(bytes, shape, {}, {}), ctx);
  CHECK(normwise_error(got, want) <= kTolerance);
  // Float inputs go in as they are.
  const core::Tensor floats = scaled(bytes, shape, {}, {});
  CHECK(normwise_error(predictor.predict(floats), ref.model->forward(floats, ctx)) == 0.0);
}

TEST_CASE("a Predictor uses BatchNorm's running statistics and the recorded normalisation",
          "[predict]") {
  test::TempDir dir;
  const InputRecord record{.scale_u8 = true,
                           .mean = {0.485f, 0.456f, 0.406f},
                           .std = {0.229f, 0.224f, 0.225f},
                           .augment = "none",
                           .eval_transform = "center 32x32 of 3 channels"};
  Reference ref = reference("resnet", dir / "ckpt", record);
  const core::Shape shape{3, 3, 32, 32};
  const std::vector<std::uint8_t> bytes = random_bytes(core::shape_numel(shape), 2);
  Predictor predictor("resnet", ref.checkpoint);
  REQUIRE(predictor.input());
  CHECK(predictor.input()->mean == record.mean);
  const core::Tensor got = predictor.predict(core::Tensor::from_vector(bytes, shape, DType::u8));
  const core::Tensor x = scaled(bytes, shape, {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f});
  Context ctx;
  ref.model->eval();
  const core::Tensor want = ref.model->forward(x, ctx);
  CHECK(normwise_error(got, want) <= kTolerance);
  // Without the normalisation the inputs are other ones: far off; and
  // PredictorOptions::input overrides the record ("--normalize none").
  const core::Tensor unnormalised = ref.model->forward(scaled(bytes, shape, {}, {}), ctx);
  CHECK(normwise_error(got, unnormalised) > 0.01);
  Predictor plain("resnet", ref.checkpoint, {.input = InputRecord{.scale_u8 = true}});
  CHECK(normwise_error(plain.predict(core::Tensor::from_vector(bytes, shape, DType::u8)),
                       unnormalised) <= kTolerance);
  // Without eval mode (batch statistics): far off too. Last, as a training
  // forward moves the reference's running statistics.
  ref.model->train();
  CHECK(normwise_error(got, ref.model->forward(x, ctx)) > 0.01);
}

TEST_CASE("a Predictor over shards gives every row in order, as its tensor path does",
          "[predict]") {
  test::TempDir dir;
  const InputRecord record{.scale_u8 = true, .mean = {0.25f}, .std = {0.5f}};
  Reference ref = reference("mlp", dir / "ckpt", record);
  const std::int64_t rows = 11;
  const core::Shape shape{rows, 1, 28, 28};
  const std::vector<std::uint8_t> bytes = random_bytes(core::shape_numel(shape), 3);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) labels[static_cast<std::size_t>(i)] = (i * 7) % 10;
  const io::ShardFormat format{.input_dtype = DType::u8, .sample_shape = {1, 28, 28}};
  {
    io::ShardWriter writer(dir / "s.h5", format, rows);
    writer.append(bytes.data(), labels.data(), rows);
    writer.close();
  }
  Predictor predictor("mlp", ref.checkpoint);
  std::vector<std::int64_t> indices, seen_labels;
  std::vector<float> outputs;
  int batches = 0;
  predictor.predict_dataset(
      io::Dataset::open(dir / "s.h5"), 4,
      [&](const PredictedBatch& b) {
        ++batches;
        indices.insert(indices.end(), b.indices.begin(), b.indices.end());
        seen_labels.insert(seen_labels.end(), b.labels.begin(), b.labels.end());
        const auto v = b.outputs.to_vector<float>();
        outputs.insert(outputs.end(), v.begin(), v.end());
      },
      2);
  CHECK(batches == 3);  // 4 + 4 + 3: the padded rows of the last batch are dropped
  std::vector<std::int64_t> order(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) order[static_cast<std::size_t>(i)] = i;
  CHECK(indices == order);
  CHECK(seen_labels == labels);
  // The same preprocessing code on both paths: equal bit for bit.
  const core::Tensor whole = predictor.predict(core::Tensor::from_vector(bytes, shape, DType::u8));
  CHECK(outputs == whole.to_vector<float>());
  Context ctx;
  ref.model->eval();
  CHECK(normwise_error(whole, ref.model->forward(scaled(bytes, shape, {0.25}, {0.5}), ctx)) <=
        kTolerance);
}

TEST_CASE("argmax_rows takes the first of the largest values of each row", "[predict]") {
  const core::Tensor t = core::Tensor::from_vector<float>(
      {0, 3, 1, 3, -1, -2, -0.5f, -3, 2, 2, 2, 2}, {3, 4}, DType::f32);
  CHECK(argmax_rows(t) == std::vector<std::int64_t>{1, 2, 0});
}

TEST_CASE("a Predictor refuses inputs of another shape and weights of another preset",
          "[predict]") {
  test::TempDir dir;
  Reference ref = reference("mlp", dir / "ckpt", std::nullopt);
  Predictor predictor("mlp", ref.checkpoint);
  const std::vector<std::uint8_t> bytes(2 * 3 * 28 * 28, 0);
  CHECK_THROWS_WITH(predictor.predict(core::Tensor::from_vector(bytes, {2, 3, 28, 28}, DType::u8)),
                    Contains("[2, 3, 28, 28]") && Contains("[B, 1, 28, 28]"));
  CHECK_THROWS_WITH(Predictor("cnn", ref.checkpoint), Contains("conv1.weight"));
  const io::ShardFormat small{.input_dtype = DType::u8, .sample_shape = {1, 14, 14}};
  {
    io::ShardWriter writer(dir / "small.h5", small, 2);
    const std::vector<std::uint8_t> pixels(2 * 14 * 14, 7);
    const std::vector<std::int64_t> labels{0, 1};
    writer.append(pixels.data(), labels.data(), 2);
    writer.close();
  }
  CHECK_THROWS_WITH(predictor.predict_dataset(io::Dataset::open(dir / "small.h5"), 4,
                                              [](const PredictedBatch&) {}),
                    Contains("[1, 14, 14]") && Contains("the mlp preset takes [1, 28, 28]"));
}
