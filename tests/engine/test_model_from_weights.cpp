// Note [model from the weights]: make_model_for_weights builds an image
// preset at the class count and widths its checkpoint has (and says so),
// the preset as it is for the preset's own shapes, and leaves a file of
// another preset to load_weights' refusal.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "engine/checkpoint.h"
#include "engine/checkpoint_file.h"
#include "engine/models.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"
#include "engine/predict.h"
#include "tests/temp_dir.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// A checkpoint of make_model(preset, {.width_divisor, .classes}).
std::filesystem::path saved(const std::string& preset, std::int64_t width_divisor,
                            std::int64_t classes, const std::filesystem::path& dir) {
  std::unique_ptr<Module> model =
      make_model(preset, ModelOptions{.width_divisor = width_divisor, .classes = classes});
  initialize(*model, 3);
  ParameterStore store(*model, core::Device::cpu());
  SGD sgd(store, single_group(store, 0.1, 0.0));
  const CheckpointDirectory checkpoints(dir, 1, CheckpointStart::fresh);
  return checkpoints.save(0, capture_checkpoint(*model, sgd, TrainingState{}, {}));
}

std::int64_t outputs_of(Module& model) {
  std::int64_t last = 0;
  for (Parameter* p : model.parameters())
    if (p->value.shape().size() == 2) last = p->value.dim(0);
  return last;
}

}  // namespace

TEST_CASE("make_model_for_weights takes the checkpoint's classes and widths",
          "[predict][model_from_weights]") {
  test::TempDir dir;
  const auto file = saved("resnet50", 16, 3, dir / "a");
  ModelShape shape;
  std::unique_ptr<Module> model = make_model_for_weights("resnet50", file, &shape);
  CHECK(shape.classes == 3);
  CHECK(shape.width_divisor == 16);
  CHECK(shape.note == "3 classes, widths / 16, as the weights of " + file.filename().string() +
                          " have them (the preset has 1000 classes)");
  CHECK(outputs_of(*model) == 3);
  CHECK(load_weights(file, *model, {}, {}).loaded.size() > 0);  // every shape fits

  // Widths alone.
  const auto cnn = saved("cnn", 4, 0, dir / "b");
  model = make_model_for_weights("cnn", cnn, &shape);
  CHECK(shape.classes == 0);
  CHECK(shape.width_divisor == 4);
  CHECK(shape.note == "widths / 4, as the weights of " + cnn.filename().string() + " have them");
  load_weights(cnn, *model, {});

  // The preset's own shapes: nothing to say.
  const auto mlp = saved("mlp", 1, 0, dir / "c");
  model = make_model_for_weights("mlp", mlp, &shape);
  CHECK(shape.note.empty());
  CHECK(outputs_of(*model) == 10);
  // Another preset's weights: the preset as it is, and load_weights names the misfit.
  model = make_model_for_weights("cnn", mlp, &shape);
  CHECK(shape.note.empty());
  CHECK_THROWS_WITH(load_weights(mlp, *model, {}), Catch::Contains("conv1.weight"));
}
