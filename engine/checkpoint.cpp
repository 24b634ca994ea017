// Checkpoint contents: capture and restore (engine/checkpoint.h).
#include "engine/checkpoint.h"

#include <fmt/core.h>

#include <cmath>
#include <set>

#include "kernels/error.h"

namespace lockstep::engine {
namespace {

core::Tensor to_host(const core::Tensor& t, const core::Stream& stream) {
  return t.device().is_cuda() ? t.to(core::Device::cpu(), stream) : t.cast(t.dtype());
}

template <typename T>
T attribute(const CheckpointContents& c, const std::string& file, const std::string& name) {
  auto it = c.attributes.find(name);
  if (it == c.attributes.end() || !std::holds_alternative<T>(it->second))
    throw IoError("checkpoint " + file + " lacks attribute '" + name +
                  "' (not a lockstep checkpoint, or another format version)");
  return std::get<T>(it->second);
}

// Copies `saved` into `live`, naming the tensor on a shape mismatch.
void copy_into(core::Tensor& live, const core::Tensor& saved, const std::string& what,
               const std::string& file, const core::Stream& stream) {
  if (saved.shape() != live.shape())
    throw InvalidArgument("checkpoint " + file + ": " + what + " has shape " +
                          core::shape_str(saved.shape()) + ", the model's is " +
                          core::shape_str(live.shape()) +
                          " (the model differs from the saved one)");
  // Floating-point data arrives as f32 whatever its stored width (io::read_tensor).
  if (saved.dtype() != live.dtype())
    throw InvalidArgument(
        "checkpoint " + file + ": " + what + " is stored as " + dtype_name(saved.dtype()) +
        ", the model's is " + dtype_name(live.dtype()) +
        " (floats load into floats, as f16, f32 or f64; integers into the same integer type)");
  live.copy_from(saved, stream);
}

void load_group(const std::map<std::string, core::Tensor>& tensors, const std::string& prefix,
                Module& model, const std::string& file, const core::Stream& stream,
                bool buffers_required) {
  for (Parameter* p : model.parameters()) {
    auto it = tensors.find(prefix + "model/" + p->name);
    if (it == tensors.end())
      throw InvalidArgument(
          "checkpoint " + file + " has no weights for parameter '" + p->name +
          "' (the first parameter missing: the model differs from the saved one)");
    copy_into(p->value, it->second, "parameter '" + p->name + "'", file, stream);
    ++p->version;
  }
  for (Buffer* b : model.buffers()) {
    auto it = tensors.find(prefix + "buffers/" + b->name);
    if (it == tensors.end()) {
      if (buffers_required)
        throw InvalidArgument("checkpoint " + file + " has no buffer '" + b->name + "'");
      continue;
    }
    copy_into(b->value, it->second, "buffer '" + b->name + "'", file, stream);
  }
}

// A checkpoint is what a run falls back to; one with an inf or NaN would
// replace a good one in the retention window, so it is never made.
void refuse_nonfinite(const CheckpointContents& c, std::int64_t step) {
  for (const auto& [path, tensor] : c.tensors) {
    if (tensor.dtype() != DType::f32) continue;
    const float* data = tensor.data_as<float>();
    for (std::int64_t i = 0; i < tensor.numel(); ++i)
      if (!std::isfinite(data[i]))
        throw NumericalError(fmt::format(
            "refusing to save the checkpoint of step {}: {} element {} is {} (the run has "
            "diverged; resume from an earlier checkpoint with a lower learning rate)",
            step, path, i, data[i]));
  }
}

// Note [resume fingerprint]: every key either side has, defaults filled in.
void check_fingerprint(const CheckpointContents& c, const std::string& file,
                       const std::map<std::string, std::string>& config,
                       const std::map<std::string, std::string>& defaults) {
  const std::string prefix = "config.";
  std::set<std::string> keys;
  for (const auto& [key, value] : config) keys.insert(key);
  for (const auto& [name, value] : c.attributes)
    if (name.starts_with(prefix)) keys.insert(name.substr(prefix.size()));
  for (const std::string& key : keys) {
    const auto fallback = defaults.find(key);
    const bool has_default = fallback != defaults.end();
    const bool saved_set = c.attributes.count(prefix + key) > 0;
    // A missing field without a default is the error attribute() reports.
    const std::string saved = saved_set || !has_default
                                  ? attribute<std::string>(c, file, prefix + key)
                                  : fallback->second;
    const auto live = config.find(key);
    if (live == config.end() && !has_default)
      throw InvalidArgument(fmt::format(
          "cannot resume from {}: it was made with {} '{}', which this program does not set "
          "(the checkpoint of another program or of a newer lockstep: resume it with that one)",
          file, key, saved));
    const std::string now = live != config.end() ? live->second : fallback->second;
    if (saved != now)
      throw InvalidArgument(fmt::format(
          "cannot resume from {}: {} was '{}'{} and is now '{}'{} (a resume may change steps, "
          "epochs, logging, checkpoint cadence, threads and world size, not {})",
          file, key, saved, saved_set ? "" : " (the default: the checkpoint does not record it)",
          now, live != config.end() ? "" : " (the default)", key));
  }
}

}  // namespace

CheckpointContents capture_checkpoint(Module& model, const Optimizer& optimizer,
                                      const TrainingState& state, const core::Stream& stream) {
  CheckpointContents c;
  for (Parameter* p : model.parameters())
    c.tensors["/model/" + p->name] = to_host(p->value, stream);
  for (Buffer* b : model.buffers()) c.tensors["/buffers/" + b->name] = to_host(b->value, stream);
  for (const OptimizerStateTensor& s : optimizer.state_tensors(stream))
    c.tensors["/optimizer/" + s.parameter + "/" + s.state] = to_host(s.value, stream);
  for (const OptimizerScalar& s : optimizer.scalar_state())
    c.attributes["optimizer." + s.name] = s.value;
  c.attributes["format_version"] = kCheckpointFormatVersion;
  c.attributes["step"] = state.step;
  c.attributes["epoch"] = state.epoch;
  c.attributes["position"] = state.position;
  c.attributes["loss_scale"] = static_cast<double>(state.scaler.scale);
  c.attributes["scaler_growth_tracker"] = state.scaler.growth_tracker;
  c.attributes["rng_seed"] = static_cast<std::int64_t>(state.seed);
  c.attributes["rng_offset"] = std::int64_t{0};  // masks are keyed (Note [dropout keys])
  c.attributes["world_size"] = static_cast<std::int64_t>(state.world_size);
  c.attributes["global_batch"] = state.global_batch;
  for (const auto& [key, value] : state.config) c.attributes["config." + key] = value;
  refuse_nonfinite(c, state.step);
  return c;
}

TrainingState restore_checkpoint(const CheckpointContents& c, const std::string& file,
                                 Module& model, Optimizer& optimizer,
                                 const std::map<std::string, std::string>& config,
                                 const std::map<std::string, std::string>& config_defaults,
                                 const core::Stream& stream) {
  const auto version = attribute<std::int64_t>(c, file, "format_version");
  if (version != kCheckpointFormatVersion)
    throw IoError(fmt::format("checkpoint {} has format version {}, this lockstep reads {}", file,
                              version, kCheckpointFormatVersion));
  check_fingerprint(c, file, config, config_defaults);
  load_group(c.tensors, "/", model, file, stream, true);
  for (const auto& [parameter, state] : optimizer.state_names()) {
    const std::string name = "/optimizer/" + parameter + "/" + state;
    auto it = c.tensors.find(name);
    if (it == c.tensors.end())
      throw InvalidArgument("checkpoint " + file + " has no optimizer state " + name);
    optimizer.set_state_tensor(parameter, state, it->second, stream);
  }
  for (const OptimizerScalar& s : optimizer.scalar_state())
    optimizer.set_scalar_state(s.name, attribute<std::int64_t>(c, file, "optimizer." + s.name));
  TrainingState state;
  state.step = attribute<std::int64_t>(c, file, "step");
  state.epoch = attribute<std::int64_t>(c, file, "epoch");
  state.position = attribute<std::int64_t>(c, file, "position");
  state.scaler.scale = static_cast<float>(attribute<double>(c, file, "loss_scale"));
  state.scaler.growth_tracker = attribute<std::int64_t>(c, file, "scaler_growth_tracker");
  state.seed = static_cast<std::uint64_t>(attribute<std::int64_t>(c, file, "rng_seed"));
  state.world_size = static_cast<int>(attribute<std::int64_t>(c, file, "world_size"));
  state.global_batch = attribute<std::int64_t>(c, file, "global_batch");
  state.config = config;
  return state;
}

void load_weights(const std::filesystem::path& file, Module& model, const core::Stream& stream) {
  std::map<std::string, core::Tensor> tensors;
  for (auto& [name, t] : read_group(file, "/model")) tensors["/model/" + name] = t;
  // Weights-only files need no buffers.
  for (auto& [name, t] : read_group(file, "/buffers", false)) tensors["/buffers/" + name] = t;
  load_group(tensors, "/", model, file.string(), stream, false);
}

}  // namespace lockstep::engine
