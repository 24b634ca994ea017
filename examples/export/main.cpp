// lockstep-export: writes a trained model preset as an ONNX file for ONNX
// Runtime and TensorRT (docs/deploy.md). It loads a checkpoint's weights into
// the preset (as --init-from does), switches it to eval mode and calls
// engine::export_onnx with the input shape the preset trains on and the
// preprocessing the checkpoint's input record holds as the graph's first
// nodes (Note [input record], Note [preprocessing in the graph]).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>

#include "engine/checkpoint.h"
#include "engine/export/onnx_export.h"
#include "engine/input_record.h"
#include "engine/models.h"
#include "engine/predict.h"
#include "examples/common/flags.h"

using namespace lockstep;
using namespace lockstep::engine;
using namespace lockstep::examples;

namespace {

struct Flags {
  std::string checkpoint, model, out, precision = "fp32", io_precision, batch = "dynamic";
  int opset = kOnnxDefaultOpset;
  std::int64_t seq = 0;
  bool allow_partial_weights = false;  // Note [weights files] in engine/checkpoint.h
};

DType float_type(const std::string& flag, const std::string& value) {
  if (value == "fp32") return DType::f32;
  if (value == "fp16") return DType::f16;
  throw InvalidArgument(flag + " '" + value + "' is not fp32 or fp16");
}

int run(const Flags& f) {
  const ModelPreset& preset = model_preset(f.model);
  if (f.seq > 0 && !preset.language_model)
    throw InvalidArgument(
        fmt::format("--seq {}: --model {} takes no token sequence (only the GPT "
                    "presets do; leave --seq out)",
                    f.seq, preset.name));
  if (f.seq > 0 && f.seq > preset.sample_shape[0])
    throw InvalidArgument(fmt::format("--seq {} is longer than {}'s context of {} tokens", f.seq,
                                      preset.name, preset.sample_shape[0]));
  // Every flag is checked before the checkpoint is read.
  ExportOptions o;
  if (f.batch != "dynamic") {
    std::size_t used = 0;
    o.batch = std::stoll(f.batch, &used);
    if (used != f.batch.size())
      throw InvalidArgument("--batch '" + f.batch + "' is not a whole number (or 'dynamic')");
  }
  // Note [model from the weights]: the preset at the checkpoint's classes and widths.
  ModelShape shape;
  std::unique_ptr<Module> model = make_model_for_weights(f.model, f.checkpoint, &shape);
  const std::optional<InputRecord> record = read_input_record(f.checkpoint);
  const WeightsLoadReport weights =
      load_weights(f.checkpoint, *model, core::Stream{},
                   WeightsLoadOptions{.allow_partial = f.allow_partial_weights});

  o.opset = f.opset;
  o.precision = float_type("--precision", f.precision);
  o.io_float_type = f.io_precision.empty() ? o.precision : float_type("--io", f.io_precision);
  o.sample_shape = preset.sample_shape;
  o.metadata["lockstep.preset"] = preset.name;
  if (!shape.note.empty()) o.metadata["lockstep.model"] = shape.note;
  o.metadata["lockstep.checkpoint"] = std::filesystem::path(f.checkpoint).filename().string();
  // What a partial load skipped travels with the file, and is said below.
  const bool skipped = weights.partial() || !weights.kept_counters.empty();
  if (skipped) o.metadata["lockstep.weights"] = weights.summary();
  std::string preprocessing;  // said below when the graph has it
  if (preset.language_model) {
    o.input_dtype = DType::i64;
    o.input_name = "tokens";
    o.output_name = "logits";
    if (f.seq > 0)
      o.sample_shape = {f.seq};
    else
      o.dynamic_sequence = true;
    o.metadata["lockstep.input"] =
        fmt::format("tokens: int64 [batch, seq], 1 <= seq <= {}, token ids below {}",
                    preset.sample_shape[0], preset.classes);
    o.metadata["lockstep.output"] = "logits: [batch, seq, vocab] for the next token";
  } else {
    const std::string io_type = o.io_float_type == DType::f16 ? "float16" : "float32";
    const std::string layout = preset.sample_shape.size() == 3 ? " (NCHW)" : "";
    if (record && record->scale_u8) {
      // Note [preprocessing in the graph]: the file is the whole model a
      // server needs, whatever normalisation training used.
      o.input_divisor = 255.0f;
      o.mean = record->mean;
      o.std = record->std;
      preprocessing = fmt::format(
          "the graph's first nodes divide by 255{}, as lockstep-train prepared the training "
          "images",
          record->normalized()
              ? fmt::format(", subtract mean [{}] and divide by std [{}]",
                            float_list_text(record->mean), float_list_text(record->std))
              : "");
      o.metadata["lockstep.input"] = fmt::format(
          "input: {} [batch, {}]{}, raw pixel values 0 to 255 (u8 pixels cast to float, not "
          "scaled: {}); images of another size first take the evaluation transform: {}",
          io_type, fmt::join(preset.sample_shape, ", "), layout, preprocessing,
          record->eval_transform);
    } else if (record) {
      o.metadata["lockstep.input"] = fmt::format(
          "input: {} [batch, {}]{}, values as stored in the training shards (float data, "
          "used unscaled in training)",
          io_type, fmt::join(preset.sample_shape, ", "), layout);
    } else {
      o.metadata["lockstep.input"] = fmt::format(
          "input: {} [batch, {}]{}; {} has no input record (a PyTorch state_dict, or a "
          "checkpoint older than 0.2.0), so any normalisation of training is unknown: "
          "lockstep-train divides u8 inputs by 255 and takes f16/f32 inputs as stored, so feed "
          "u8 images as x / 255 and float data unchanged",
          io_type, fmt::join(preset.sample_shape, ", "), layout,
          std::filesystem::path(f.checkpoint).filename().string());
    }
    if (record) o.metadata["lockstep.input_record"] = record->str();
    o.metadata["lockstep.output"] = fmt::format(
        "output: [batch, {}] logits", shape.classes != 0 ? shape.classes : preset.classes);
  }
  export_onnx(*model, f.out, o);
  if (!shape.note.empty()) fmt::print("lockstep-export: model {}: {}\n", f.model, shape.note);
  if (skipped) fmt::print("lockstep-export: weights of {}: {}\n", f.checkpoint, weights.summary());
  if (!preprocessing.empty())
    fmt::print("lockstep-export: input: raw 0-255 pixel floats; {}\n", preprocessing);
  else if (!record && !preset.language_model)
    fmt::print("lockstep-export: {} has no input record: feed u8 images as x / 255\n",
               f.checkpoint);
  fmt::print("lockstep-export: wrote {} ({}, opset {}, {}, batch {})\n", f.out, preset.name,
             f.opset, f.precision, f.batch);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"lockstep-export: writes a model preset with a checkpoint's weights as ONNX"};
  app.footer(
      "The model is exported in eval mode (dropout off, BatchNorm with its running\n"
      "statistics). Image presets trained on u8 images take raw 0-255 pixel floats: the\n"
      "graph divides by 255 and normalises as the checkpoint records (docs/deploy.md);\n"
      "GPT presets take int64 tokens. See docs/deploy.md for ONNX Runtime and trtexec.");
  add_weights_flags(app, f.checkpoint, f.allow_partial_weights, f.model, true,
                    " (also in the file's metadata_props)");
  app.add_option("--out", f.out, "the ONNX file to write")->required()->check(non_empty());
  app.add_option("--opset", f.opset,
                 fmt::format("ONNX opset, {} to {}", kOnnxMinOpset, kOnnxMaxOpset))
      ->check(within(kOnnxMinOpset, kOnnxMaxOpset))
      ->capture_default_str();
  app.add_option("--precision", f.precision, "weights and activations: fp32 or fp16")
      ->check(one_of({"fp32", "fp16"}))
      ->capture_default_str();
  app.add_option("--io", f.io_precision,
                 "float input and output type: fp32 or fp16 (default: --precision)")
      ->check(one_of({"fp32", "fp16"}));
  app.add_option("--batch", f.batch, "rows per batch: a number, or 'dynamic' for a batch axis")
      ->check(CLI::IsMember({"dynamic"}) | within(1, kMaxRows))
      ->capture_default_str();
  app.add_option("--seq", f.seq,
                 "GPT presets: a fixed sequence length (default: a dynamic 'seq' axis)")
      ->check(within(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-export: {}\n", e.what());
    return 1;
  }
}
