// Json over nlohmann-json (engine/core/json.h, Note [JSON by a library]).
#include "engine/core/json.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace lockstep::core {
namespace {

using Ordered = nlohmann::ordered_json;

const char* non_finite_name(double v) { return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

// A copy of `v` with a "non_finite" member in each object that holds a
// non-finite number directly; nlohmann writes the number itself as null.
Ordered with_non_finite_notes(const Ordered& v) {
  if (v.is_array()) {
    Ordered out = Ordered::array();
    for (const Ordered& e : v) out.push_back(with_non_finite_notes(e));
    return out;
  }
  if (!v.is_object()) return v;
  Ordered out = Ordered::object();
  Ordered notes = Ordered::object();
  for (const auto& [key, member] : v.items()) {
    if (member.is_number_float() && !std::isfinite(member.get<double>()))
      notes[key] = non_finite_name(member.get<double>());
    out[key] = with_non_finite_notes(member);
  }
  if (!notes.empty() && !out.contains("non_finite")) out["non_finite"] = std::move(notes);
  return out;
}

bool holds_non_finite(const Ordered& v) {
  if (v.is_number_float()) return !std::isfinite(v.get<double>());
  if (v.is_structured())
    for (const Ordered& e : v)
      if (holds_non_finite(e)) return true;
  return false;
}

// nlohmann's one-line form with a space after each ':' and ',' between
// tokens, as Python's json.dumps writes a line: what people and grep read in
// a metrics file. Inside strings (escaped by the library) nothing changes.
std::string spaced(const std::string& compact) {
  std::string out;
  out.reserve(compact.size() + compact.size() / 4);
  bool in_string = false, escaped = false;
  for (const char c : compact) {
    out += c;
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == ':' || c == ',') {
      out += ' ';
    }
  }
  return out;
}

}  // namespace

struct Json::Value {
  Ordered json;
};

Json::Json() : value_(std::make_unique<Value>()) {}
Json::Json(bool value) : Json() { value_->json = value; }
Json::Json(double value) : Json() { value_->json = value; }
Json::Json(std::int64_t value) : Json() { value_->json = value; }
Json::Json(std::uint64_t value) : Json() { value_->json = value; }
Json::Json(std::string_view text) : Json() { value_->json = std::string(text); }

Json Json::object() {
  Json j;
  j.value_->json = Ordered::object();
  return j;
}

Json Json::array() {
  Json j;
  j.value_->json = Ordered::array();
  return j;
}

Json Json::parse(std::string_view text, std::string_view what) {
  Json j;
  try {
    j.value_->json = Ordered::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string(what) + " is not valid JSON: " + e.what());
  }
  return j;
}

Json::Json(const Json& other) : value_(std::make_unique<Value>(*other.value_)) {}
Json::Json(Json&& other) noexcept = default;
Json& Json::operator=(const Json& other) {
  value_ = std::make_unique<Value>(*other.value_);
  return *this;
}
Json& Json::operator=(Json&& other) noexcept = default;
Json::~Json() = default;

Json& Json::set(std::string_view key, Json value) {
  if (!value_->json.is_object())
    throw InvalidArgument("Json::set('" + std::string(key) + "') on a value that is not an object");
  value_->json[std::string(key)] = std::move(value.value_->json);
  return *this;
}

Json& Json::push(Json value) {
  if (!value_->json.is_array()) throw InvalidArgument("Json::push on a value that is not an array");
  value_->json.push_back(std::move(value.value_->json));
  return *this;
}

std::string Json::dump() const {
  const Ordered& v = value_->json;
  constexpr auto replace = Ordered::error_handler_t::replace;
  return spaced(holds_non_finite(v) ? with_non_finite_notes(v).dump(-1, ' ', false, replace)
                                    : v.dump(-1, ' ', false, replace));
}

bool Json::has(std::string_view key) const {
  return value_->json.is_object() && value_->json.contains(std::string(key));
}

std::optional<double> Json::number(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const Ordered& v = value_->json[std::string(key)];
  if (!v.is_number()) return std::nullopt;
  return v.get<double>();
}

std::optional<std::string> Json::text(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const Ordered& v = value_->json[std::string(key)];
  if (!v.is_string()) return std::nullopt;
  return v.get<std::string>();
}

}  // namespace lockstep::core
