// export_onnx (engine/export/onnx_export.h): checks the options, builds the
// model around the graph the mappings fill (inputs, casts at the ends,
// outputs, metadata) and writes it with libprotobuf.
#include "engine/export/onnx_export.h"

#include <fmt/core.h>

#include <cmath>
#include <limits>

#include "engine/core/output_file.h"
#include "engine/export/detail/onnx_impl.h"
#include "engine/nn/channels_last.h"
#include "kernels/error.h"

namespace lockstep::engine {
namespace {

// The IR version each opset needs (onnx/helper.py's VERSION_TABLE).
std::int64_t ir_version_for(int opset) {
  if (opset <= 18) return 8;
  if (opset <= 20) return 9;
  return 10;
}

void check_options(const ExportOptions& o) {
  if (o.opset < kOnnxMinOpset || o.opset > kOnnxMaxOpset)
    throw InvalidArgument("ONNX export: opset " + std::to_string(o.opset) + " is outside " +
                          std::to_string(kOnnxMinOpset) + ".." + std::to_string(kOnnxMaxOpset) +
                          " (LayerNormalization needs 17; the default is " +
                          std::to_string(kOnnxDefaultOpset) + ")");
  auto float_ok = [](DType t) { return t == DType::f32 || t == DType::f16; };
  if (!float_ok(o.precision))
    throw InvalidArgument("ONNX export: precision " + std::string(dtype_name(o.precision)) +
                          " is not f32 or f16");
  if (!float_ok(o.io_float_type))
    throw InvalidArgument("ONNX export: input/output type " +
                          std::string(dtype_name(o.io_float_type)) + " is not f32 or f16");
  if (!float_ok(o.input_dtype) && o.input_dtype != DType::i64 && o.input_dtype != DType::i32)
    throw InvalidArgument("ONNX export: input dtype " + std::string(dtype_name(o.input_dtype)) +
                          " is not a float type, i32 or i64 (u8 images: export floats and feed "
                          "x/255, docs/deploy.md)");
  if (o.sample_shape.empty())
    throw InvalidArgument(
        "ONNX export: the sample shape is empty (give one sample's shape, "
        "e.g. {1, 28, 28})");
  for (std::int64_t d : o.sample_shape)
    if (d <= 0)
      throw InvalidArgument("ONNX export: sample shape " + core::shape_str(o.sample_shape) +
                            " has a size below 1");
  if (o.batch < 0)
    throw InvalidArgument("ONNX export: batch " + std::to_string(o.batch) +
                          " is negative (0 exports a dynamic batch)");
  if (o.dynamic_sequence && (o.input_dtype == DType::f32 || o.input_dtype == DType::f16))
    throw InvalidArgument("ONNX export: a dynamic sequence axis is for token inputs (i32, i64)");
  const bool float_input = o.input_dtype == DType::f32 || o.input_dtype == DType::f16;
  if (!(o.input_divisor >= 0) || !std::isfinite(o.input_divisor))
    throw InvalidArgument(fmt::format(
        "ONNX export: input_divisor {} is not a finite number of at least 0 (255 for u8 pixels; "
        "0: no division)",
        o.input_divisor));
  if ((o.input_divisor > 0 || !o.mean.empty() || !o.std.empty()) && !float_input)
    throw InvalidArgument(fmt::format(
        "ONNX export: preprocessing (input_divisor {}, {} means) is for float inputs, but the "
        "input is {} (leave it out for tokens)",
        o.input_divisor, o.mean.size(), dtype_name(o.input_dtype)));
  const auto channels = static_cast<std::size_t>(o.sample_shape[0]);
  if (o.mean.size() != o.std.size() ||
      (!o.mean.empty() && o.mean.size() != 1 && o.mean.size() != channels))
    throw InvalidArgument(fmt::format(
        "ONNX export: {} means and {} stds for a sample of shape {}: give one of each, or {} "
        "of each (one per channel)",
        o.mean.size(), o.std.size(), core::shape_str(o.sample_shape), channels));
  for (std::size_t c = 0; c < o.std.size(); ++c)
    if (!(o.std[c] > 0) || !std::isfinite(o.std[c]) || !std::isfinite(o.mean[c]))
      throw InvalidArgument(
          fmt::format("ONNX export: channel {} has mean {} and std {}: the std must be a finite "
                      "number above 0 and the mean finite",
                      c, o.mean[c], o.std[c]));
  if (o.input_name.empty() || o.output_name.empty() || o.input_name == o.output_name)
    throw InvalidArgument("ONNX export: the input and output names must be given and differ");
}

void set_value_info(onnx::ValueInfoProto& info, const std::string& name, DType dtype,
                    const std::vector<std::int64_t>& shape, bool dynamic_sequence) {
  info.set_name(name);
  onnx::TypeProto_Tensor* t = info.mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx_type(dtype));
  onnx::TensorShapeProto* s = t->mutable_shape();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    onnx::TensorShapeProto_Dimension* d = s->add_dim();
    if (shape[i] != kOnnxDynamicDim)
      d->set_dim_value(shape[i]);
    else if (i == 0)
      d->set_dim_param("batch");
    else if (i == 1 && dynamic_sequence)
      d->set_dim_param("seq");
    else
      d->set_dim_param("dim" + std::to_string(i));
  }
}

// Note [preprocessing in the graph] (onnx_export.h): Div, Sub, Div rather
// than one affine x * a + b, so that each node is the step a reader of the
// graph expects from torchvision's ToTensor and Normalize, and the values
// are those of lockstep's loader up to rounding.
OnnxValue preprocess(OnnxGraph& g, OnnxValue x, const ExportOptions& o) {
  if (o.input_divisor > 0)
    x = g.op("Div", {x.name, g.constant_float({o.input_divisor}, {})}, x.dtype, x.shape);
  if (o.mean.empty()) return x;
  // [C, 1, ..., 1] broadcasts over [batch, C, ...]; one value over anything.
  std::vector<std::int64_t> per_channel = {static_cast<std::int64_t>(o.mean.size())};
  if (o.mean.size() > 1) per_channel.resize(o.sample_shape.size(), 1);
  x = g.op("Sub", {x.name, g.constant_float(o.mean, per_channel)}, x.dtype, x.shape);
  return g.op("Div", {x.name, g.constant_float(o.std, per_channel)}, x.dtype, x.shape);
}

}  // namespace

void export_onnx(Module& model, const std::filesystem::path& path, const ExportOptions& options) {
  check_options(options);
  model.eval();
  onnx::ModelProto proto;
  proto.set_ir_version(ir_version_for(options.opset));
  proto.set_producer_name("lockstep");
  proto.set_producer_version(options.producer_version.empty() ? LOCKSTEP_VERSION
                                                              : options.producer_version);
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(options.opset);
  for (const auto& [key, value] : options.metadata) {
    onnx::StringStringEntryProto* e = proto.add_metadata_props();
    e->set_key(key);
    e->set_value(value);
  }

  onnx::GraphProto* graph = proto.mutable_graph();
  // A channels-last model is its NCHW model in the graph (Note [channels-last
  // layers]), its name included.
  auto* channels_last = dynamic_cast<ChannelsLast*>(&model);
  graph->set_name((channels_last ? channels_last->inner() : model).type_name());
  OnnxGraph::Impl impl;
  impl.graph = graph;
  impl.float_type = options.precision;
  impl.opset = options.opset;
  impl.stream = options.stream;
  OnnxGraph g(impl);

  const bool float_input = options.input_dtype == DType::f32 || options.input_dtype == DType::f16;
  const DType input_type = float_input ? options.io_float_type : options.input_dtype;
  std::vector<std::int64_t> shape = {options.batch == 0 ? kOnnxDynamicDim : options.batch};
  shape.insert(shape.end(), options.sample_shape.begin(), options.sample_shape.end());
  if (options.dynamic_sequence) shape[1] = kOnnxDynamicDim;
  set_value_info(*graph->add_input(), options.input_name, input_type, shape,
                 options.dynamic_sequence);

  OnnxValue x{options.input_name, input_type, shape};
  if (float_input && input_type != options.precision)
    x = g.op("Cast", {x.name}, options.precision, x.shape,
             {{"to", std::int64_t{onnx_type(options.precision)}}});
  if (float_input) x = preprocess(g, x, options);
  const OnnxValue y = g.module(model, x);
  if (y.dtype != options.precision && y.dtype != options.io_float_type)
    throw InvalidArgument("ONNX export: " + model.describe() + " gives " + dtype_name(y.dtype) +
                          ", not floats: nothing to export as the output");
  // The output node's own name is the graph's output name.
  onnx::NodeProto* out = graph->add_node();
  out->set_name(options.output_name);
  out->add_input(y.name);
  out->add_output(options.output_name);
  if (y.dtype != options.io_float_type) {
    out->set_op_type("Cast");
    onnx::AttributeProto* to = out->add_attribute();
    to->set_name("to");
    to->set_type(onnx::AttributeProto::INT);
    to->set_i(onnx_type(options.io_float_type));
  } else {
    out->set_op_type("Identity");
  }
  set_value_info(*graph->add_output(), options.output_name, options.io_float_type, y.shape,
                 options.dynamic_sequence);

  // Note [onnx size limit]: protobuf refuses messages of 2 GiB or more, and
  // ONNX then needs its external-data format, which this export does not write.
  const std::size_t bytes = proto.ByteSizeLong();
  if (bytes >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw InvalidArgument("ONNX export: the model would be " + std::to_string(bytes) +
                          " bytes, over protobuf's 2 GiB limit (export with f16 precision)");
  std::string serialized;
  if (!proto.SerializeToString(&serialized))
    throw InvalidArgument("ONNX export: protobuf could not serialise the model for '" +
                          path.string() + "'");
  // Note [one way to write a file]: a cut-short export never leaves a file
  // under the name a server loads, and the checkpoint being exported (an
  // input) is never the output.
  core::write_file(path, serialized, "ONNX export: the output file");
}

}  // namespace lockstep::engine
