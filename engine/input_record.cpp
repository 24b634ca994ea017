// InputRecord (engine/input_record.h): the input.* attributes of a
// checkpoint to and from the record, and the text programs show of it.
#include "engine/input_record.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "engine/checkpoint_file.h"
#include "kernels/error.h"

namespace lockstep::engine {

std::vector<float> parse_float_list(const std::string& text, const std::string& what) {
  std::vector<float> values;
  if (text.empty()) return values;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, comma - at);
    char* end = nullptr;
    const float v = std::strtof(part.c_str(), &end);
    if (part.empty() || *end != '\0' || !std::isfinite(v))
      throw InvalidArgument(fmt::format("{} {}: '{}' is not a number", what, text, part));
    values.push_back(v);
    at = comma + 1;
  }
  return values;
}

std::string float_list_text(const std::vector<float>& values) {
  std::string out;
  for (float v : values) out += fmt::format("{}{}", out.empty() ? "" : ",", v);
  return out;
}

std::string InputRecord::normalize() const {
  if (!normalized()) return "none";
  std::vector<float> both = mean;
  both.insert(both.end(), std.begin(), std.end());
  return float_list_text(both);
}

std::string InputRecord::str() const {
  return fmt::format("{}, normalize {}, augment {}, evaluation {}",
                     scale_u8 ? "u8 / 255" : "as stored", normalize(), augment, eval_transform);
}

io::ImageOptions InputRecord::eval_images(const core::Shape& sample_shape) const {
  if ((eval_transform == "none" && !normalized()) || sample_shape.size() != 3) return {};
  io::ImageOptions o{.channels = sample_shape[0],
                     .height = sample_shape[1],
                     .width = sample_shape[2],
                     .mean = mean,
                     .std = std};
  o.check();
  return o;
}

std::map<std::string, std::string> InputRecord::fields() const {
  return {{"scaling", scale_u8 ? "u8/255" : "none"},
          {"mean", normalized() ? float_list_text(mean) : "none"},
          {"std", normalized() ? float_list_text(std) : "none"},
          {"augment", augment},
          {"eval_transform", eval_transform}};
}

std::optional<InputRecord> InputRecord::from_fields(
    const std::map<std::string, std::string>& fields, const std::string& file) {
  const auto scaling = fields.find("scaling");
  if (scaling == fields.end()) return std::nullopt;
  auto field = [&](const char* name) {
    const auto it = fields.find(name);
    return it == fields.end() ? std::string() : it->second;
  };
  auto bad = [&](const std::string& problem) {
    return IoError(
        fmt::format("{}: its input record (Note [input record]) {} (write the file "
                    "again with lockstep-train, or remove the input.* attributes)",
                    file, problem));
  };
  InputRecord r;
  if (scaling->second != "u8/255" && scaling->second != "none")
    throw bad(fmt::format("has input.scaling '{}', not 'u8/255' or 'none'", scaling->second));
  r.scale_u8 = scaling->second == "u8/255";
  try {
    if (field("mean") != "none") r.mean = parse_float_list(field("mean"), "input.mean");
    if (field("std") != "none") r.std = parse_float_list(field("std"), "input.std");
  } catch (const InvalidArgument& e) {
    throw bad(fmt::format("does not parse: {}", e.what()));
  }
  if (r.mean.size() != r.std.size())
    throw bad(fmt::format("has {} means and {} stds", r.mean.size(), r.std.size()));
  for (float s : r.std)
    if (!(s > 0)) throw bad(fmt::format("has a std of {}, not above 0", s));
  if (!field("augment").empty()) r.augment = field("augment");
  if (!field("eval_transform").empty()) r.eval_transform = field("eval_transform");
  return r;
}

std::optional<InputRecord> read_input_record(const std::filesystem::path& file) {
  std::map<std::string, std::string> fields;
  for (const auto& [name, value] : read_root_attributes(file, "input.")) {
    const auto* text = std::get_if<std::string>(&value);
    if (!text)
      throw IoError(
          fmt::format("{}: attribute '{}' is a number, but the input record (Note "
                      "[input record]) holds text (write the file again)",
                      file.string(), name));
    fields[name.substr(6)] = *text;
  }
  return InputRecord::from_fields(fields, file.string());
}

}  // namespace lockstep::engine
