// lockstep-onnx-reference: the lockstep side of the ONNX Runtime comparison
// (tests/export/check_onnx.py). For one preset it writes a real checkpoint
// of a randomly initialised model (BatchNorm statistics and affine made
// non-trivial), then lockstep's own eval-mode forward at batch 1 and 7 on
// random inputs, as raw little-endian files the Python side reads. Given
// NORMALIZE (--normalize's MEAN,STD), the checkpoint holds that input record
// and the inputs are raw 0-255 pixels, which lockstep's evaluation pipeline
// (io/image_transform.h) divides by 255 and normalises before the forward.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/checkpoint.h"
#include "engine/checkpoint_file.h"
#include "engine/input_record.h"
#include "engine/models.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"
#include "io/image_transform.h"
#include "tests/support/batch_norms.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

void write_raw(const std::filesystem::path& path, const void* data, std::size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) throw IoError("cannot write " + path.string());
}

// "[7,1,28,28]": one word, read as JSON by check_onnx.py.
std::string dims_json(const core::Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

// What lockstep's evaluation loader gives the model for raw u8 `pixels`
// [batch, C, H, W] of a model trained as `record` says: each image through
// the centre crop (the identity at the input size) and the normalisation.
core::Tensor evaluation_input(const InputRecord& record, const std::vector<std::uint8_t>& pixels,
                              const core::Shape& shape) {
  const io::ImageOptions o = record.eval_images({shape[1], shape[2], shape[3]});
  const std::int64_t plane = shape[2] * shape[3], image = shape[1] * plane;
  std::vector<float> out(pixels.size());
  for (std::int64_t i = 0; i < shape[0]; ++i) {
    const io::PixelView view{.data = pixels.data() + i * image,
                             .channels = shape[1],
                             .height = shape[2],
                             .width = shape[3],
                             .channel_stride = plane,
                             .row_stride = shape[3],
                             .column_stride = 1};
    io::crop_resize_normalize(view, io::choose_crop(o, shape[2], shape[3], 0, i), o,
                              out.data() + i * image);
  }
  return core::Tensor::from_vector(out, shape, DType::f32);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr,
                 "usage: lockstep-onnx-reference PRESET SEED SEQ OUT_DIR [NORMALIZE] (SEQ: GPT "
                 "only; NORMALIZE: MEAN,STD of an image preset)\n");
    return 2;
  }
  try {
    const std::string name = argv[1];
    const std::uint64_t seed = std::stoull(argv[2]);
    const std::int64_t seq = std::stoll(argv[3]);
    const std::filesystem::path dir = argv[4];
    const ModelPreset& preset = model_preset(name);
    std::unique_ptr<Module> model = make_model(name);
    initialize(*model, seed);
    ParameterStore store(*model, core::Device::cpu());
    SGD sgd(store, single_group(store, 0.1, 0.0));
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    test::perturb_batch_norms(*model, rng);
    std::optional<InputRecord> record;
    if (argc == 6) {
      const std::vector<float> normalize = parse_float_list(argv[5], "NORMALIZE");
      if (normalize.size() != 2 || preset.sample_shape.size() != 3)
        throw InvalidArgument("NORMALIZE is MEAN,STD, for an image preset");
      record = InputRecord{.scale_u8 = true,
                           .mean = {normalize[0]},
                           .std = {normalize[1]},
                           .eval_transform = io::ImageOptions{.channels = preset.sample_shape[0],
                                                              .height = preset.sample_shape[1],
                                                              .width = preset.sample_shape[2]}
                                                 .str()};
    }
    TrainingState state;
    state.seed = seed;
    if (record) state.input = record->fields();
    const CheckpointDirectory checkpoints(dir / (name + "-ckpt"), 1, CheckpointStart::fresh);
    const auto file = checkpoints.save(0, capture_checkpoint(*model, sgd, state, {}));
    fmt::print("checkpoint {}\n", file.string());

    model->eval();
    Context ctx;
    for (std::int64_t batch : {1, 7}) {
      core::Shape shape = {batch};
      core::Tensor x, raw;  // raw: what the ONNX graph takes, when it differs from x
      if (preset.language_model) {
        shape.push_back(seq);
        std::uniform_int_distribution<std::int64_t> token(0, preset.classes - 1);
        std::vector<std::int64_t> tokens(static_cast<std::size_t>(batch * seq));
        for (auto& t : tokens) t = token(rng);
        x = core::Tensor::from_vector(tokens, shape, DType::i64);
      } else if (record) {
        shape.insert(shape.end(), preset.sample_shape.begin(), preset.sample_shape.end());
        std::uniform_int_distribution<int> pixel(0, 255);
        std::vector<std::uint8_t> pixels(static_cast<std::size_t>(core::shape_numel(shape)));
        for (auto& p : pixels) p = static_cast<std::uint8_t>(pixel(rng));
        raw = core::Tensor::from_vector(std::vector<float>(pixels.begin(), pixels.end()), shape,
                                        DType::f32);
        x = evaluation_input(*record, pixels, shape);
      } else {
        shape.insert(shape.end(), preset.sample_shape.begin(), preset.sample_shape.end());
        std::uniform_real_distribution<float> value(0.0f, 1.0f);  // u8 / 255's range
        std::vector<float> values(static_cast<std::size_t>(core::shape_numel(shape)));
        for (auto& v : values) v = value(rng);
        x = core::Tensor::from_vector(values, shape, DType::f32);
      }
      const core::Tensor y = model->forward(x, ctx);
      const std::string stem = fmt::format("{}_b{}", name, batch);
      const core::Tensor& fed = record ? raw : x;
      write_raw(dir / (stem + "_input.bin"), fed.data(), fed.nbytes());
      const auto out = y.cast(DType::f32).to_vector<float>();
      write_raw(dir / (stem + "_output.bin"), out.data(), out.size() * sizeof(float));
      fmt::print("batch {} input {} output {}\n", batch, dims_json(fed.shape()),
                 dims_json(y.shape()));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-onnx-reference: %s\n", e.what());
    return 1;
  }
}
