// Predictor: a model preset's outputs for inputs, with a checkpoint's (or a
// weights file's) weights, in eval mode, on the CPU or a GPU, with the input
// preprocessing the training run recorded (Note [input record] in
// engine/input_record.h); from tensors in memory or from HDF5 shards. It is
// what lockstep-predict runs and what a user's program calls to compare
// lockstep with ONNX Runtime (docs/deploy.md).
//
// Note [preprocess like training]: lockstep-train feeds a model u8 inputs as
// x * (1.0f / 255) (the loader's scale_u8), or, when its image pipeline is
// on (--normalize, --augment, encoded images), through the evaluation centre
// crop (the whole image when it has the model's size) and the per-channel
// (x / 255 - mean) / std of io::channel_affine; f16 and f32 inputs as stored
// and tokens as they are. The Predictor takes the pipeline from the file's
// input record (InputRecord::eval_images), so that a checkpoint predicts
// with the numbers it trained with and no flag; a file without a record (a
// PyTorch state_dict) gets x / 255 alone unless PredictorOptions::input says
// otherwise. Tensors in memory are preprocessed on the host by the CPU
// loader's own code (io::crop_resize_normalize with the centre crop, or the
// scale), so that on the CPU predict() of a shard's rows equals
// predict_dataset() bit for bit (on a GPU the loader crops to u8 and
// normalises on the device: the same values to f32 rounding).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "engine/input_record.h"
#include "engine/models.h"
#include "engine/nn/module.h"
#include "engine/parameter_store.h"
#include "io/dataset.h"
#include "io/image_transform.h"

namespace lockstep::engine {

// Note [model from the weights]: a checkpoint's image preset may not have the
// preset's class count (lockstep-train takes resnet50's from the data, Note
// [classes from the data] in examples/train/main.cpp) nor its widths
// (--width-divisor). make_model_for_weights reads the shapes of two of the
// file's weights, not their values: the head's (the last 2-D parameter, the
// last Linear's weight [classes, features]) gives the class count when its
// features are the widths' own, and the first parameter's first dimension
// against the preset's gives the width divisor. A file without that first
// parameter, or with shapes that no make_model gives, leaves the preset as it
// is, and load_weights then names the misfit. A GPT preset's vocabulary and widths
// stay its own. lockstep-predict and lockstep-export build through it and say
// what they took.
struct ModelShape {
  std::int64_t classes = 0;        // make_model's: 0 for the preset's
  std::int64_t width_divisor = 1;  // make_model's
  // "3 classes, widths / 16, as the weights of ckpt-4.h5 have them (the
  // preset has 1000 classes)"; "": the preset as it is.
  std::string note;
};
// make_model(model) at the class count and widths of `weights_file`'s
// weights (Note [model from the weights]); `shape`, when given, gets them.
std::unique_ptr<Module> make_model_for_weights(const std::string& model,
                                               const std::filesystem::path& weights_file,
                                               ModelShape* shape = nullptr);

struct PredictorOptions {
  // Where the model runs (a World's device()), and the stream it runs on
  // (default: the device's default stream).
  core::Device device = core::Device::cpu();
  core::Stream stream{};
  WeightsLoadOptions weights{};  // Note [weights files]
  // The input preprocessing; nullopt: the file's own record
  // (read_input_record), or x / 255 alone for a file without one.
  std::optional<InputRecord> input{};
};

// One batch of predict_dataset, on the host.
struct PredictedBatch {
  core::Tensor outputs;               // f32 [rows, ...output]: the model's logits
  std::vector<std::int64_t> indices;  // the global sample index of each row
  std::vector<std::int64_t> labels;   // each row's label; empty for shards without labels
};

class Predictor {
 public:
  // make_model_for_weights(model, weights_file) (the preset at the file's
  // class count and widths), its parameters on options.device, the weights of
  // `weights_file` (load_weights), eval mode. Throws as load_weights does for
  // a file that does not fit the preset.
  Predictor(const std::string& model, const std::filesystem::path& weights_file,
            PredictorOptions options = {});

  // The model's input for raw inputs [B, ...sample_shape] on any device
  // (Note [preprocess like training]): u8 scaled and normalised to f32, other
  // types unchanged; on the predictor's device. Throws InvalidArgument
  // naming the shape when it is not the preset's sample shape behind a batch
  // (a language model takes [B, T] tokens, T up to its context).
  core::Tensor preprocess(const core::Tensor& inputs) const;
  // The eval-mode forward of preprocess(inputs): f32 logits [B, classes]
  // ([B, T, vocab] for a language model) on the predictor's device.
  core::Tensor predict(const core::Tensor& inputs);
  // Every sample of `data` in order, `batch_size` rows at a time, read by
  // the DataLoader (`threads` workers) with the evaluation preprocessing;
  // `consume` gets each batch's outputs on the host. Not for token shards.
  void predict_dataset(const io::Dataset& data, std::int64_t batch_size,
                       const std::function<void(const PredictedBatch&)>& consume, int threads = 2);

  const ModelPreset& preset() const { return preset_; }
  // The class count and widths taken from the file (Note [model from the weights]).
  const ModelShape& model_shape() const { return shape_; }
  const core::Stream& stream() const { return options_.stream; }
  Module& model() { return *model_; }
  const WeightsLoadReport& weights() const { return weights_; }
  // The preprocessing in use: the file's record, PredictorOptions::input,
  // or nullopt (x / 255 alone, for a file without a record).
  const std::optional<InputRecord>& input() const { return input_; }

 private:
  const ModelPreset& preset_;
  PredictorOptions options_;
  ModelShape shape_;
  std::unique_ptr<Module> model_;
  std::unique_ptr<ParameterStore> store_;
  WeightsLoadReport weights_;
  std::optional<InputRecord> input_;
  io::ImageOptions images_;  // the evaluation pipeline; disabled: x / 255 alone
};

// The index of each row's largest value of f32 outputs [rows, classes] on
// any device (the first on a tie, as numpy's and PyTorch's argmax); `stream`
// is the one they were computed on (Predictor::stream()).
std::vector<std::int64_t> argmax_rows(const core::Tensor& outputs, const core::Stream& stream = {});

}  // namespace lockstep::engine
