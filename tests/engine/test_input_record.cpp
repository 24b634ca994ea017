// Note [input record] (engine/input_record.h): a checkpoint's input.*
// attributes written from a record and read back, a file without them, a
// malformed record refused, and the evaluation pipeline a record gives,
// held to torchvision's formula (x / 255 - mean) / std.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "engine/checkpoint.h"
#include "engine/checkpoint_file.h"
#include "engine/input_record.h"
#include "engine/nn/linear.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"
#include "tests/temp_dir.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// A real checkpoint of a small model with `input` as its record's fields.
std::filesystem::path checkpoint_with(const std::filesystem::path& dir,
                                      const std::map<std::string, std::string>& input) {
  Linear model(4, 2);
  ParameterStore store(model, core::Device::cpu());
  SGD sgd(store, single_group(store, 0.1, 0.0));
  TrainingState state;
  state.input = input;
  const CheckpointDirectory checkpoints(dir, 1, CheckpointStart::fresh);
  return checkpoints.save(0, capture_checkpoint(model, sgd, state, {}));
}

}  // namespace

TEST_CASE("a checkpoint's input record reads back as written", "[engine]") {
  test::TempDir dir;
  const InputRecord written{.scale_u8 = true,
                            .mean = {0.485f, 0.456f, 0.406f},
                            .std = {0.229f, 0.224f, 0.225f},
                            .augment = "imagenet",
                            .eval_transform = "centre-crop 224x224 of 3 channels"};
  const auto file = checkpoint_with(dir.path() / "ckpt", written.fields());
  // The attributes as h5py shows them, spelled out here, not by fields().
  const CheckpointContents c = read_checkpoint(file);
  CHECK(std::get<std::string>(c.attributes.at("input.scaling")) == "u8/255");
  CHECK(std::get<std::string>(c.attributes.at("input.mean")) == "0.485,0.456,0.406");
  CHECK(std::get<std::string>(c.attributes.at("input.std")) == "0.229,0.224,0.225");
  const std::optional<InputRecord> read = read_input_record(file);
  REQUIRE(read);
  CHECK(read->scale_u8);
  CHECK(read->mean == written.mean);  // the shortest text that reads back: exact
  CHECK(read->std == written.std);
  CHECK(read->augment == "imagenet");
  CHECK(read->eval_transform == "centre-crop 224x224 of 3 channels");
  CHECK(read->normalize() == "0.485,0.456,0.406,0.229,0.224,0.225");
}

TEST_CASE("a file without input attributes has no input record", "[engine]") {
  test::TempDir dir;
  CHECK_FALSE(read_input_record(checkpoint_with(dir.path() / "ckpt", {})).has_value());
  const InputRecord plain{};  // float data, no normalisation
  const auto file = checkpoint_with(dir.path() / "plain", plain.fields());
  const std::optional<InputRecord> read = read_input_record(file);
  REQUIRE(read);
  CHECK_FALSE(read->scale_u8);
  CHECK_FALSE(read->normalized());
  CHECK(read->normalize() == "none");
}

TEST_CASE("a malformed input record is refused naming the file and the field", "[engine]") {
  const std::map<std::string, std::string> good{
      {"scaling", "u8/255"}, {"mean", "0.5"}, {"std", "0.25"}};
  auto with = [&](const std::string& key, const std::string& value) {
    auto fields = good;
    fields[key] = value;
    return fields;
  };
  CHECK(InputRecord::from_fields(good, "f.h5").has_value());
  CHECK_THROWS_WITH(InputRecord::from_fields(with("scaling", "u8/256"), "f.h5"),
                    Catch::Contains("f.h5") && Catch::Contains("input.scaling 'u8/256'"));
  CHECK_THROWS_WITH(InputRecord::from_fields(with("mean", "0.5,x"), "f.h5"),
                    Catch::Contains("input.mean 0.5,x: 'x' is not a number"));
  CHECK_THROWS_WITH(InputRecord::from_fields(with("std", "0.25,0.25"), "f.h5"),
                    Catch::Contains("1 means and 2 stds"));
  CHECK_THROWS_WITH(InputRecord::from_fields(with("std", "0"), "f.h5"),
                    Catch::Contains("a std of 0"));
}

TEST_CASE("a record's evaluation pipeline is (x / 255 - mean) / std per channel", "[engine]") {
  const InputRecord r{.scale_u8 = true, .mean = {0.5f, 0.25f, 0.1f}, .std = {0.25f, 0.5f, 2.0f}};
  const io::ImageOptions o = r.eval_images({3, 8, 8});
  REQUIRE(o.enabled());
  CHECK(o.crop == io::CropKind::center);
  const kernels::ChannelAffine a = io::channel_affine(o);
  for (int c = 0; c < 3; ++c)
    for (int pixel : {0, 17, 255}) {
      const double want = (pixel / 255.0 - r.mean[c]) / r.std[c];  // torchvision's formula
      // f32 rounding of scale and bias, and of their product and sum: a few ulp of 4.
      CHECK(a.scale[c] * static_cast<float>(pixel) + a.bias[c] == Approx(want).margin(1e-6));
    }
  CHECK_FALSE(InputRecord{}.eval_images({1, 28, 28}).enabled());  // u8 / 255 alone: no pipeline
}
