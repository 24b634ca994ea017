// Checkpoint contents: capture and restore, and weights-only loading (Note
// [weights files]) (engine/checkpoint.h).
#include "engine/checkpoint.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "engine/nn/batchnorm.h"
#include "engine/nn/linear.h"
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

// Throws unless `saved` fits `live` (shape and type), naming the tensor.
void check_fits(const core::Tensor& live, const core::Tensor& saved, const std::string& what,
                const std::string& file) {
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
}

// Copies `saved` into `live`, naming the tensor on a mismatch.
void copy_into(core::Tensor& live, const core::Tensor& saved, const std::string& what,
               const std::string& file, const core::Stream& stream) {
  check_fits(live, saved, what, file);
  live.copy_from(saved, stream);
}

// A checkpoint's weights and buffers (load_weights has its own rules: Note [weights files]).
void load_group(const std::map<std::string, core::Tensor>& tensors, const std::string& prefix,
                Module& model, const std::string& file, const core::Stream& stream) {
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
    if (it == tensors.end())
      throw InvalidArgument("checkpoint " + file + " has no buffer '" + b->name + "'");
    copy_into(b->value, it->second, "buffer '" + b->name + "'", file, stream);
  }
}

// Note [weights files]: names in an error, the first few of a long list.
constexpr std::size_t kNamesShown = 8;

// "a, b, c" for up to kNamesShown names, then "and N more".
std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kNamesShown; ++i)
    out += (i > 0 ? ", " : "") + names[i];
  if (names.size() > kNamesShown) out += fmt::format(" and {} more", names.size() - kNamesShown);
  return out;
}

// The modules of the tree, root first.
void collect_modules(Module& module, std::vector<Module*>& out) {
  out.push_back(&module);
  for (Module* child : module.children()) collect_modules(*child, out);
}

// One copy load_weights makes once every check has passed.
struct WeightCopy {
  core::Tensor* live;
  const core::Tensor* saved;
  const char* kind;      // "parameter" or "buffer"
  std::string name;      // dotted
  Parameter* parameter;  // its version is bumped; null for a buffer
};

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
  for (const auto& [key, value] : state.input) c.attributes["input." + key] = value;
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
  load_group(c.tensors, "/", model, file, stream);
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

WeightsLoadReport load_weights(const std::filesystem::path& file, Module& model,
                               const core::Stream& stream, const WeightsLoadOptions& options) {
  const std::string name = fmt::format("'{}'", file.string());
  // The file's weights by dataset path ("/model/fc1.weight", "/buffers/bn1.running_mean").
  std::map<std::string, core::Tensor> entries;
  for (auto& [key, t] : read_group(file, "/model")) entries["/model/" + key] = t;
  for (auto& [key, t] : read_group(file, "/buffers", false)) entries["/buffers/" + key] = t;
  std::set<std::string> used;
  std::vector<WeightCopy> copies;
  WeightsLoadReport report;

  for (Parameter* p : model.parameters()) {
    const auto it = entries.find("/model/" + p->name);
    if (it == entries.end()) {
      report.missing.push_back(p->name);
      continue;
    }
    used.insert(it->first);
    copies.push_back({&p->value, &it->second, "parameter", p->name, p});
  }
  std::vector<Module*> modules;
  collect_modules(model, modules);
  std::set<const Buffer*> counters;
  for (Module* m : modules)
    if (auto* bn = dynamic_cast<BatchNorm2d*>(m); bn && bn->num_batches_tracked())
      counters.insert(bn->num_batches_tracked());
  for (Buffer* b : model.buffers()) {
    const auto own = entries.find("/buffers/" + b->name);
    const auto pytorch = entries.find("/model/" + b->name);
    if (own != entries.end() && pytorch != entries.end())
      throw InvalidArgument(fmt::format(
          "weights file {} holds buffer '{}' twice, as {} and {} (keep one: lockstep writes "
          "buffers under /buffers, PyTorch's state_dict has them with the parameters)",
          name, b->name, own->first, pytorch->first));
    const auto it = own != entries.end() ? own : pytorch;
    if (it == entries.end()) {
      (counters.count(b) ? report.kept_counters : report.missing).push_back(b->name);
      continue;
    }
    used.insert(it->first);
    copies.push_back({&b->value, &it->second, "buffer", b->name, nullptr});
  }
  // Note [weights files]: a tied weight's second name, as PyTorch lists it.
  for (Module* m : modules) {
    auto* linear = dynamic_cast<Linear*>(m);
    if (!linear) continue;
    const std::vector<Parameter*> own = linear->own_parameters();
    Parameter& weight = linear->weight();
    if (std::find(own.begin(), own.end(), &weight) != own.end()) continue;
    const std::string alias = "/model/" + (m->path().empty() ? "" : m->path() + ".") + "weight";
    const auto tied = entries.find(alias);
    const auto owner = entries.find("/model/" + weight.name);
    if (tied == entries.end() || owner == entries.end()) continue;
    const core::Tensor &a = tied->second, &b = owner->second;
    if (a.shape() != b.shape() || a.dtype() != b.dtype() ||
        std::memcmp(a.data(), b.data(), a.nbytes()) != 0)
      throw InvalidArgument(fmt::format(
          "weights file {}: {} is tied to {} in this model (one tensor), but the file holds "
          "different values for them (write one, or the same tensor under both names)",
          name, alias, owner->first));
    used.insert(alias);
  }
  for (const auto& [key, t] : entries)
    if (!used.count(key)) report.unused.push_back(key);

  if (report.partial() && !options.allow_partial) {
    std::string found;
    if (!report.missing.empty())
      found = fmt::format("{} of the model's entries {} missing: {}", report.missing.size(),
                          report.missing.size() == 1 ? "is" : "are", name_list(report.missing));
    if (!report.unused.empty())
      found += fmt::format("{}{} of the file's entries {} unused: {}", found.empty() ? "" : "; ",
                           report.unused.size(), report.unused.size() == 1 ? "is" : "are",
                           name_list(report.unused));
    throw InvalidArgument(fmt::format(
        "weights file {} does not match the model: {} (is the model the file's? A PyTorch "
        "state_dict goes in whole, buffers included, as /model/<name>: docs/models.md. To load "
        "only the entries both have, on purpose, allow a partial load: --allow-partial-weights "
        "in lockstep-train and lockstep-export, WeightsLoadOptions::allow_partial in the library)",
        name, found));
  }
  if (copies.empty() && !report.missing.empty())
    throw InvalidArgument(fmt::format(
        "weights file {} has none of the model's parameters and buffers, so even a partial "
        "load would take nothing from it (the model's: {}; the file's: {})",
        name, name_list(report.missing),
        report.unused.empty() ? "no datasets under /model or /buffers" : name_list(report.unused)));
  for (const WeightCopy& c : copies)
    check_fits(*c.live, *c.saved, fmt::format("{} '{}'", c.kind, c.name), name);
  for (const WeightCopy& c : copies) {
    c.live->copy_from(*c.saved, stream);
    if (c.parameter) ++c.parameter->version;
    report.loaded.push_back(c.name);
  }
  return report;
}

void load_weights(const std::filesystem::path& file, Module& model, const core::Stream& stream) {
  load_weights(file, model, stream, WeightsLoadOptions{});
}

std::string WeightsLoadReport::summary() const {
  const std::size_t total = loaded.size() + missing.size() + kept_counters.size();
  std::string line = partial() ? "partial load: " : "";
  line +=
      loaded.size() == total
          ? fmt::format("all {} of the model's parameters and buffers loaded", total)
          : fmt::format("{} of the model's {} parameters and buffers loaded", loaded.size(), total);
  if (!missing.empty()) line += "; missing from the file, left as they were: " + name_list(missing);
  if (!unused.empty()) line += "; the file's entries left unused: " + name_list(unused);
  if (!kept_counters.empty())
    line += fmt::format(
        "; {} num_batches_tracked absent from the file, kept as they were (a count that no "
        "output depends on)",
        kept_counters.size());
  return line;
}

}  // namespace lockstep::engine
