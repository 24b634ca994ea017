// InputRecord: the model's input contract as a checkpoint keeps it (its
// input.* attributes): how raw inputs were scaled and normalised in training
// and the evaluation-time transform, so that evaluation, fine-tuning and
// export feed a model what it learned on (Note [input record]).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "io/image_transform.h"

namespace lockstep::engine {

// Note [input record]: lockstep-train writes into every checkpoint the root
// attributes input.scaling ("u8/255": u8 inputs divided by 255; "none":
// inputs used as stored), input.mean and input.std (comma lists, of pixels
// in [0, 1], one value or one per channel; "none": no normalisation),
// input.augment (the training crop and flip recipe, never applied at
// evaluation) and input.eval_transform (the evaluation crop,
// io::ImageOptions::str() without the normalisation, or "none"). A model
// trained on normalised pixels is meaningless on unnormalised ones, so
// --eval-only and --init-from apply the record's normalisation unless
// --normalize is given on purpose, and lockstep-export puts the scaling and
// normalisation into the ONNX graph. A file without input.scaling (a PyTorch
// state_dict, a checkpoint older than 0.2.0) has no record: programs keep
// their flags' behaviour and say so.
struct InputRecord {
  bool scale_u8 = false;
  std::vector<float> mean{}, std{};
  std::string augment = "none";
  std::string eval_transform = "none";

  bool normalized() const { return !mean.empty(); }
  // Means then stds as --normalize takes them ("0.5,0.5"); "none" without.
  std::string normalize() const;
  // "u8 / 255, normalize 0.5,0.5, augment crop-flip, evaluation center 28x28
  // of 1 channel", for run headers and export metadata.
  std::string str() const;
  // The evaluation loader's image pipeline (io::LoaderOptions::images) for a
  // model of [C, H, W] samples: the centre crop with this normalisation, as
  // lockstep-train evaluates; disabled when training had no image pipeline
  // (eval_transform "none" and no normalisation: u8 / 255 alone).
  io::ImageOptions eval_images(const core::Shape& sample_shape) const;
  // The input.* attributes without their prefix (TrainingState::input).
  std::map<std::string, std::string> fields() const;
  // The record `fields` hold; nullopt when they have no "scaling". Throws
  // IoError naming `file` and the field for a value that does not parse.
  static std::optional<InputRecord> from_fields(const std::map<std::string, std::string>& fields,
                                                const std::string& file);
};

// The record in the root attributes of a checkpoint or weights file (read
// without the checksum, as load_weights reads weights); nullopt when the
// file has none (Note [input record]).
std::optional<InputRecord> read_input_record(const std::filesystem::path& file);

// "0.5,0.25" as floats; throws InvalidArgument naming `what` and the first
// part that is not a finite number. "" gives no values.
std::vector<float> parse_float_list(const std::string& text, const std::string& what);
// The inverse: the shortest text that reads back as each value ("0.5,0.25").
std::string float_list_text(const std::vector<float>& values);

}  // namespace lockstep::engine
