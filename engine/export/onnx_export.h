// export_onnx: writes a model, in eval mode, as an ONNX file that ONNX
// Runtime and TensorRT load (docs/deploy.md). Each module maps itself to
// standard operators through engine/export/onnx_graph.h; the weights become
// initializers named by the model's parameter names (fc1.weight, ...).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/core/stream.h"
#include "engine/export/onnx_graph.h"
#include "engine/nn/module.h"

namespace lockstep::engine {

// Note [onnx opset]: 17 is the default because it is the first opset with
// LayerNormalization (the GPTs need it), and TensorRT 8.6 and later and
// ONNX Runtime 1.14 and later run it. Every operator the built-in mappings
// emit has the same definition from 17 to 21, so those opsets are allowed;
// outside that range the export refuses.
inline constexpr int kOnnxDefaultOpset = 17;
inline constexpr int kOnnxMinOpset = 17;
inline constexpr int kOnnxMaxOpset = 21;

struct ExportOptions {
  int opset = kOnnxDefaultOpset;
  // Weights and activations: f32 or f16.
  DType precision = DType::f32;
  // The graph's float input and output type: f32 or f16. With f16 weights
  // and f32 here the graph casts at its ends, so a caller keeps f32 buffers.
  DType io_float_type = DType::f32;
  // One input sample's shape ({1, 28, 28}; {T} tokens for a language model).
  core::Shape sample_shape;
  // The input's element type: a float type (f32: images, features) or i64
  // (tokens). Float inputs are taken in io_float_type.
  DType input_dtype = DType::f32;
  // Rows in a batch; 0 exports a dynamic batch axis named "batch".
  std::int64_t batch = 0;
  // Token inputs: export the sequence axis as dynamic ("seq") instead of
  // sample_shape's length.
  bool dynamic_sequence = false;
  // Note [preprocessing in the graph]: with input_divisor above 0 the graph's
  // first nodes are Div(x, input_divisor), then Sub(mean) and Div(std) per
  // channel (sample_shape[0]) when mean and std are given (one value, or one
  // per channel), so that the graph takes raw values: 0-255 pixel floats for
  // a model trained on u8 images divided by 255 and normalised (Note [input
  // record] in engine/input_record.h). Float inputs only.
  float input_divisor = 0.0f;
  std::vector<float> mean{}, std{};
  std::string input_name = "input";
  std::string output_name = "output";
  // Added to the model's metadata_props (how inputs are scaled, the preset).
  std::map<std::string, std::string> metadata;
  std::string producer_version;  // empty: lockstep's version
  core::Stream stream;           // where the weights are read from
};

// Writes `model` (switched to eval mode, and left so) to `path`. Throws
// InvalidArgument for options out of range and for a module without a
// mapping (naming it), IoError when the file cannot be written.
void export_onnx(Module& model, const std::filesystem::path& path, const ExportOptions& options);

}  // namespace lockstep::engine
