// TensorDataset (io/tensor_dataset.h): the sampler's rows gathered from host
// tensors, then moved to the consumer's device.
#include "io/tensor_dataset.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "kernels/error.h"
#include "kernels/half.h"

namespace lockstep::io {
namespace {

std::uint64_t fnv1a(const core::Tensor& t, std::uint64_t hash) {
  const auto* bytes = static_cast<const unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  return hash;
}

std::int64_t rows_of(const core::Tensor& t, const char* what) {
  if (!t.defined() || t.shape().empty())
    throw InvalidArgument(
        fmt::format("TensorDataset: {} must be a tensor with a first dimension of rows, got {}",
                    what, t.defined() ? "a scalar" : "an undefined tensor"));
  if (t.device().is_cuda())
    throw InvalidArgument(fmt::format(
        "TensorDataset: {} is on {}; pass host tensors (TensorDatasetOptions::device says where "
        "batches go)",
        what, t.device().str()));
  return t.dim(0);
}

// Class indices as i64, float targets as they are.
core::Tensor widened_targets(core::Tensor targets) {
  if (!targets.defined() || targets.device().is_cuda() || targets.dtype() == DType::i64 ||
      is_floating(targets.dtype()))
    return targets;  // rows_of reports the first two
  core::Tensor wide = core::Tensor::empty(targets.shape(), DType::i64);
  auto* to = wide.data_as<std::int64_t>();
  for (std::int64_t i = 0; i < targets.numel(); ++i)
    to[i] = targets.dtype() == DType::i32 ? targets.data_as<std::int32_t>()[i]
                                          : targets.data_as<std::uint8_t>()[i];
  return wide;
}

// Element i of a host tensor of float or integer targets, as a double.
double target_value(const core::Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f32:
      return t.data_as<float>()[i];
    case DType::f16:
      return kernels::f16_bits_to_f32(t.data_as<std::uint16_t>()[i]);
    case DType::bf16:
      return kernels::bf16_bits_to_f32(t.data_as<std::uint16_t>()[i]);
    default:  // widened_targets made every integer dtype i64
      return static_cast<double>(t.data_as<std::int64_t>()[i]);
  }
}

}  // namespace

TensorDataset::TensorDataset(core::Tensor inputs, core::Tensor targets,
                             TensorDatasetOptions options)
    : TensorDataset(std::move(inputs), std::move(targets), {}, std::move(options)) {}

TensorDataset::TensorDataset(core::Tensor inputs, core::Tensor targets, core::NamedTensors named,
                             TensorDatasetOptions options)
    : inputs_(std::move(inputs)),
      labels_(widened_targets(std::move(targets))),
      options_(std::move(options)),
      sampler_(rows_of(inputs_, "inputs"), options_.sampler) {
  const std::int64_t rows = rows_of(labels_, "targets");
  if (rows != inputs_.dim(0))
    throw InvalidArgument(fmt::format(
        "TensorDataset: inputs have {} rows {} but targets {} {} (one target row per input row)",
        inputs_.dim(0), core::shape_str(inputs_.shape()), rows, core::shape_str(labels_.shape())));
  for (const auto& [name, tensor] : named) {
    const std::string what = "named tensor '" + name + "'";
    if (name == "inputs" || name == "targets")
      throw InvalidArgument("TensorDataset: a named tensor is called '" + name +
                            "', the name of the dataset's own inputs or targets (rename it)");
    if (rows_of(tensor, what.c_str()) != rows)
      throw InvalidArgument(
          fmt::format("TensorDataset: {} has {} rows {}, the inputs {} (one row per input row)",
                      what, tensor.dim(0), core::shape_str(tensor.shape()), rows));
    named_.set(name, widened_targets(tensor));
  }
  if (options_.num_classes > 0 && labels_.dtype() == DType::i64) {
    const auto* y = labels_.data_as<std::int64_t>();
    const std::int64_t per_row = rows > 0 ? labels_.numel() / rows : 0;
    for (std::int64_t i = 0; i < labels_.numel(); ++i)
      if (y[i] < 0 || y[i] >= options_.num_classes)
        throw InvalidArgument(
            fmt::format("TensorDataset: targets row {} holds {}, outside [0, {}) "
                        "(TensorDatasetOptions::num_classes)",
                        i / per_row, y[i], options_.num_classes));
  }
  if (options_.probability_targets) {
    const std::int64_t per_row = rows > 0 ? labels_.numel() / rows : 0;
    for (std::int64_t i = 0; i < labels_.numel(); ++i)
      if (const double v = target_value(labels_, i); !(v >= 0.0 && v <= 1.0))
        throw InvalidArgument(fmt::format(
            "TensorDataset: targets row {} holds {} (value {} of the row), outside [0, 1]: "
            "binary cross-entropy reads each target as a probability, and past [0, 1] its loss "
            "falls without bound (TensorDatasetOptions::probability_targets; fix the targets, or "
            "train with a loss for any real target)",
            i / per_row, v, i % per_row));
  }
}

void TensorDataset::do_start_epoch(std::int64_t epoch, std::int64_t position) {
  sampler_.check_position(position);
  sampler_.set_epoch(epoch);
  epoch_ = epoch;
  next_batch_ = position / sampler_.global_batch();
}

core::Tensor TensorDataset::gather(const core::Tensor& all,
                                   const std::vector<std::int64_t>& indices) {
  core::Shape shape = all.shape();
  shape[0] = static_cast<std::int64_t>(indices.size());
  core::Tensor out = core::Tensor::empty(shape, all.dtype());
  const std::size_t row_bytes = all.dim(0) > 0 ? all.nbytes() / all.dim(0) : 0;
  const auto* from = static_cast<const char*>(all.data());
  auto* to = static_cast<char*>(out.data());
  for (std::size_t i = 0; i < indices.size(); ++i)
    std::memcpy(to + i * row_bytes, from + indices[i] * row_bytes, row_bytes);
  return out;
}

std::optional<Batch> TensorDataset::next() {
  if (next_batch_ < 0)
    throw InvalidArgument(
        "TensorDataset::next() before start_epoch() (call start_epoch(epoch) first)");
  if (next_batch_ == sampler_.batches_per_epoch()) return std::nullopt;
  MicroBatch rows = sampler_.micro_batch(next_batch_);
  Batch b;
  b.inputs = gather(inputs_, rows.indices);
  b.labels = gather(labels_, rows.indices);
  for (const auto& [name, tensor] : named_) b.named.set(name, gather(tensor, rows.indices));
  if (options_.device.is_cuda()) {
    b.inputs = b.inputs.to(options_.device, options_.stream);
    b.labels = b.labels.to(options_.device, options_.stream);
    core::NamedTensors moved;
    for (const auto& [name, tensor] : b.named)
      moved.set(name, tensor.to(options_.device, options_.stream));
    b.named = std::move(moved);
  }
  b.indices = std::move(rows.indices);
  b.valid = rows.valid;
  b.epoch = epoch_;
  b.index = next_batch_++;
  return b;
}

LoaderPosition TensorDataset::position() const {
  return {epoch_, std::max<std::int64_t>(next_batch_, 0) * sampler_.global_batch()};
}

std::vector<std::pair<std::string, std::string>> TensorDataset::agreement_fields() const {
  std::uint64_t digest = fnv1a(labels_, fnv1a(inputs_, 0xcbf29ce484222325ULL));
  for (const auto& [name, tensor] : named_) digest = fnv1a(tensor, digest);
  std::vector<std::pair<std::string, std::string>> fields{
      {"tensor_dataset.rows", std::to_string(size())},
      {"tensor_dataset.inputs",
       fmt::format("{} {}", dtype_name(inputs_.dtype()), core::shape_str(inputs_.shape()))},
      {"tensor_dataset.targets",
       fmt::format("{} {}", dtype_name(labels_.dtype()), core::shape_str(labels_.shape()))}};
  for (const auto& [name, tensor] : named_)
    fields.emplace_back(
        "tensor_dataset.named." + name,
        fmt::format("{} {}", dtype_name(tensor.dtype()), core::shape_str(tensor.shape())));
  fields.emplace_back("tensor_dataset.digest", fmt::format("{:016x}", digest));
  return fields;
}

}  // namespace lockstep::io
