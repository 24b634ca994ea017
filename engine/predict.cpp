// Predictor (engine/predict.h): a preset with a file's weights in eval
// mode, its inputs preprocessed as training preprocessed them (Note
// [preprocess like training]), over tensors or shards.
#include "engine/predict.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>

#include <hdf5.h>

#include "io/hdf5.h"
#include "io/loader.h"

namespace lockstep::engine {

namespace fs = std::filesystem;

namespace {

// The loader's u8 scale (io/loader.cpp's kU8Scale): x * (1.0f / 255).
constexpr float kU8Scale = 1.0f / 255.0f;

// The shape of dataset /model/<name> of `file`, without its data; none when
// the file lacks it or cannot say (load_weights reports such files itself).
std::optional<core::Shape> weight_shape(const fs::path& file, const std::string& name) {
  io::Hdf5Lock lock;
  try {
    io::Hdf5Id f = io::open_hdf5_file(file, "weights file");
    const std::string path = "/model/" + name;
    if (H5Lexists(f.get(), "/model", H5P_DEFAULT) <= 0 ||
        H5Lexists(f.get(), path.c_str(), H5P_DEFAULT) <= 0)
      return std::nullopt;
    io::Hdf5Id d(LOCKSTEP_CHECK_HDF5(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT)));
    return io::extent_of(d.get(), path);
  } catch (const Error&) {
    io::hdf5_error_stack();  // cleared: load_weights reads the file again and says what fails
    return std::nullopt;
  }
}

}  // namespace

std::unique_ptr<Module> make_model_for_weights(const std::string& model, const fs::path& file,
                                               ModelShape* shape) {
  const ModelPreset& preset = model_preset(model);
  std::unique_ptr<Module> reference = make_model(model);
  if (shape) *shape = {};
  const std::vector<Parameter*> params = reference->parameters();
  if (preset.language_model || params.empty()) return reference;
  const Parameter* first = params.front();
  const Parameter* head = nullptr;
  for (const Parameter* p : params)
    if (p->value.shape().size() == 2) head = p;
  ModelShape s;
  // A file without the first parameter, or of another rank there, is of
  // another preset: load_weights names it.
  const std::optional<core::Shape> first_shape = weight_shape(file, first->name);
  if (!first_shape || first_shape->size() != first->value.shape().size() ||
      (*first_shape)[0] <= 0 || first->value.dim(0) % (*first_shape)[0] != 0)
    return reference;
  s.width_divisor = first->value.dim(0) / (*first_shape)[0];
  // The head's rows are the classes when its inputs are the widths' own.
  const std::optional<core::Shape> head_shape =
      head ? weight_shape(file, head->name) : std::nullopt;
  if (head_shape && head_shape->size() == 2 && (*head_shape)[0] > 0 &&
      (*head_shape)[1] * s.width_divisor == head->value.dim(1) &&
      (*head_shape)[0] != preset.classes)
    s.classes = (*head_shape)[0];
  if (s.width_divisor == 1 && s.classes == 0) return reference;
  std::unique_ptr<Module> built;
  try {
    built = make_model(model, ModelOptions{.width_divisor = s.width_divisor, .classes = s.classes});
  } catch (const InvalidArgument&) {
    return reference;  // no preset of these shapes: load_weights names the misfit
  }
  std::vector<std::string> parts;
  if (s.classes != 0) parts.push_back(fmt::format("{} classes", s.classes));
  if (s.width_divisor != 1) parts.push_back(fmt::format("widths / {}", s.width_divisor));
  s.note = fmt::format(
      "{}, as the weights of {} have them{}", fmt::join(parts, ", "), file.filename().string(),
      s.classes != 0 ? fmt::format(" (the preset has {} classes)", preset.classes) : std::string());
  if (shape) *shape = s;
  return built;
}

Predictor::Predictor(const std::string& model, const fs::path& weights_file,
                     PredictorOptions options)
    : preset_(model_preset(model)), options_(std::move(options)) {
  if (options_.stream.device() != options_.device)
    options_.stream = core::Stream::default_for(options_.device);
  input_ = options_.input ? options_.input : read_input_record(weights_file);
  if (input_ && input_->normalized() && preset_.sample_shape.size() != 3)
    throw InvalidArgument(fmt::format(
        "Predictor: the input record of {} ({}) normalises images, but the {} preset takes {} "
        "(the weights of another preset?)",
        weights_file.string(), input_->str(), preset_.name, core::shape_str(preset_.sample_shape)));
  if (input_ && !preset_.language_model) images_ = input_->eval_images(preset_.sample_shape);
  if (images_.enabled() && images_.channels != preset_.sample_shape[0])
    throw InvalidArgument(fmt::format(
        "Predictor: the input record of {} ({}) is for {} channels, but the {} preset takes {} "
        "(the weights of another preset?)",
        weights_file.string(), input_->str(), images_.channels, preset_.name,
        core::shape_str(preset_.sample_shape)));
  model_ = make_model_for_weights(model, weights_file, &shape_);
  initialize(*model_, 0);  // what a partial load leaves, reproducibly
  store_ = std::make_unique<ParameterStore>(*model_, options_.device, options_.stream);
  weights_ = load_weights(weights_file, *model_, options_.stream, options_.weights);
  model_->eval();
  model_->set_input_grad(false);
}

core::Tensor Predictor::preprocess(const core::Tensor& inputs) const {
  const core::Shape& shape = inputs.shape();
  const core::Shape& sample = preset_.sample_shape;
  const bool fits = preset_.language_model
                        ? shape.size() == 2 && shape[1] >= 1 && shape[1] <= sample[0]
                        : shape.size() == sample.size() + 1 &&
                              std::equal(sample.begin(), sample.end(), shape.begin() + 1);
  if (!fits)
    throw InvalidArgument(
        fmt::format("Predictor ({}): inputs of shape {}, but the model takes {} (a batch of {})",
                    preset_.name, core::shape_str(shape),
                    preset_.language_model ? fmt::format("[B, T] with T <= {}", sample[0])
                                           : "[B, " + core::shape_str(sample).substr(1),
                    preset_.language_model ? "token windows" : "samples"));
  if (inputs.dtype() != DType::u8 || preset_.language_model)
    return inputs.to(options_.device, options_.stream);
  // Note [preprocess like training]: on the host, with the CPU loader's own
  // code (the image pipeline's crop and affine, or the scale).
  const std::vector<std::uint8_t> bytes = inputs.to_vector<std::uint8_t>(options_.stream);
  std::vector<float> values(bytes.size());
  if (images_.enabled()) {
    const std::int64_t per_image = core::shape_numel(sample);
    for (std::int64_t i = 0; i < shape[0]; ++i) {
      const io::PixelView view{bytes.data() + i * per_image, sample[0], sample[1], sample[2],
                               sample[1] * sample[2],        sample[2], 1};
      io::crop_resize_normalize(view, io::choose_crop(images_, sample[1], sample[2], 0, i), images_,
                                values.data() + i * per_image);
    }
  } else {
    for (std::size_t i = 0; i < bytes.size(); ++i)
      values[i] = kU8Scale * static_cast<float>(bytes[i]);
  }
  return core::Tensor::from_vector(values, shape, DType::f32, options_.device, options_.stream);
}

core::Tensor Predictor::predict(const core::Tensor& inputs) {
  const core::Tensor x = preprocess(inputs);
  Context ctx;
  ctx.stream = options_.stream;
  return model_->forward(x, ctx).cast(DType::f32, options_.stream);
}

void Predictor::predict_dataset(const io::Dataset& data, std::int64_t batch_size,
                                const std::function<void(const PredictedBatch&)>& consume,
                                int threads) {
  const io::ShardFormat& format = data.format();
  if (preset_.language_model || format.is_tokens())
    throw InvalidArgument(fmt::format(
        "Predictor: the {} preset on shards of {}: predicting over shards takes image or feature "
        "presets and shards with labels or targets (give a language model its tokens with "
        "Predictor::predict, or sample it with lockstep-train --sample-tokens)",
        preset_.name, format.str()));
  if (format.encoded ? preset_.sample_shape.size() != 3
                     : format.sample_shape != preset_.sample_shape)
    throw InvalidArgument(fmt::format(
        "Predictor: the shards hold {}, but the {} preset takes {} (write them at the model's "
        "input size)",
        format.str(), preset_.name, core::shape_str(preset_.sample_shape)));
  io::LoaderOptions o;
  o.sampler = {
      .micro_batch = batch_size, .world_size = 1, .rank = 0, .shuffle = false, .drop_last = false};
  o.threads = threads;
  o.device = options_.device;
  o.stream = options_.stream;
  // The pipeline of the record; encoded images need one all the same (the
  // centre crop and x / 255, as lockstep-train evaluates them).
  o.images = images_.enabled() || !format.encoded
                 ? images_
                 : io::ImageOptions{.channels = preset_.sample_shape[0],
                                    .height = preset_.sample_shape[1],
                                    .width = preset_.sample_shape[2]};
  if (o.images.enabled() && !format.encoded &&
      (format.input_dtype != DType::u8 || format.sample_shape.size() != 3))
    throw InvalidArgument(fmt::format(
        "Predictor: the input record ({}) normalises images of bytes, but the shards hold {} "
        "(predict on u8 images, or pass PredictorOptions::input without normalisation)",
        input_->str(), format.str()));
  o.scale_u8 = format.input_dtype == DType::u8 && !o.images.enabled();
  io::DataLoader loader(data, o);
  loader.start_epoch(0);
  Context ctx;
  ctx.stream = options_.stream;
  while (std::optional<io::Batch> batch = loader.next()) {
    if (batch->valid == 0) continue;
    // Rows [0, valid) are real; the rest is padding (Note [padding], io/sampler.h).
    core::Shape real = batch->inputs.shape();
    real[0] = batch->valid;
    const core::Tensor x = batch->inputs.view(0, real);
    PredictedBatch out;
    out.outputs = model_->forward(x, ctx)
                      .cast(DType::f32, options_.stream)
                      .to(core::Device::cpu(), options_.stream);
    options_.stream.synchronize();
    out.indices.assign(batch->indices.begin(), batch->indices.begin() + batch->valid);
    if (format.has_labels) {
      const std::vector<std::int64_t> labels =
          batch->labels.to_vector<std::int64_t>(options_.stream);
      out.labels.assign(labels.begin(), labels.begin() + batch->valid);
    }
    consume(out);
  }
}

std::vector<std::int64_t> argmax_rows(const core::Tensor& outputs, const core::Stream& stream) {
  if (outputs.shape().size() != 2 || outputs.dtype() != DType::f32)
    throw InvalidArgument(
        fmt::format("argmax_rows: outputs {} of shape {}; it takes f32 [rows, classes]",
                    dtype_name(outputs.dtype()), core::shape_str(outputs.shape())));
  const std::vector<float> p = outputs.to_vector<float>(stream);
  const std::int64_t rows = outputs.shape()[0], classes = outputs.shape()[1];
  std::vector<std::int64_t> best(static_cast<std::size_t>(rows), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = p.data() + r * classes;
    std::int64_t& b = best[static_cast<std::size_t>(r)];
    for (std::int64_t c = 1; c < classes; ++c)
      if (row[c] > row[b]) b = c;
  }
  return best;
}

}  // namespace lockstep::engine
