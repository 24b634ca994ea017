// The presets at a width divisor (engine/models.h, make_model's
// width_divisor): the preset's tree, names and input and output shapes at a
// fraction of its parameters, which tests that loop over every preset train
// (tests/mpi/test_zero_presets.cpp); a divisor that does not divide is refused.
#include <catch2/catch.hpp>

#include "engine/models.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

std::vector<std::string> names(Module& model) {
  std::vector<std::string> out;
  for (Parameter* p : model.parameters()) out.push_back(p->name);
  return out;
}

std::int64_t parameter_count(Module& model) {
  std::int64_t n = 0;
  for (Parameter* p : model.parameters()) n += p->value.numel();
  return n;
}

}  // namespace

TEST_CASE("a preset at a width divisor keeps its names, depth and input and output shapes",
          "[engine][models]") {
  for (const ModelPreset& preset : model_presets()) {
    INFO(preset.name);
    const auto full = make_model(preset.name),
               narrow = make_model(preset.name, ModelOptions{.width_divisor = 16});
    CHECK(names(*narrow) == names(*full));
    CHECK(parameter_count(*narrow) < parameter_count(*full) / 8);
    // One row in, the preset's classes (a vocabulary per position) out.
    core::Shape in{1};
    const std::int64_t tokens = 4;
    if (preset.language_model)
      in.push_back(tokens);
    else
      in.insert(in.end(), preset.sample_shape.begin(), preset.sample_shape.end());
    const core::Tensor x = preset.language_model
                               ? core::Tensor::zeros(in, DType::i64, core::Device::cpu())
                               : core::Tensor::zeros(in, DType::f32, core::Device::cpu());
    Context ctx;
    narrow->eval();
    const core::Shape expected = preset.language_model ? core::Shape{1, tokens, preset.classes}
                                                       : core::Shape{1, preset.classes};
    CHECK(narrow->forward(x, ctx).shape() == expected);
  }
  // mlp's 784 -> 512 -> 512 -> 10 at a sixteenth: 784 -> 32 -> 32 -> 10,
  // weights and biases counted by hand.
  CHECK(parameter_count(*make_model("mlp", ModelOptions{.width_divisor = 16})) ==
        784 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10);
  // cnn's channels 32 and 64 at a sixteenth: 2 and 4, fc1 then 4 x 7 x 7 -> 8.
  CHECK(parameter_count(*make_model("cnn", ModelOptions{.width_divisor = 16})) ==
        2 * 9 + 2 + 4 * 2 * 9 + 4 + 4 * 7 * 7 * 8 + 8 + 8 * 10 + 10);
}

TEST_CASE("a width divisor that does not divide a preset's width is refused, naming it",
          "[engine][models]") {
  CHECK_THROWS_WITH(
      make_model("mlp", ModelOptions{.width_divisor = 0}),
      Catch::Contains("make_model('mlp'): width_divisor is 0; it must be at least 1"));
  CHECK_THROWS_WITH(make_model("mlp", ModelOptions{.width_divisor = 3}),
                    Catch::Contains("width_divisor 3 does not divide its hidden features of 512"));
  // 128 / 64 = 2 embedding features for gpt-tiny's 4 heads.
  CHECK_THROWS_WITH(
      make_model("gpt-tiny", ModelOptions{.width_divisor = 64}),
      Catch::Contains("leaves an embedding width of 2, which its 4 heads do not divide"));
}
