// Json: the one way the library and its programs write (and read) JSON: the
// metrics records, the heartbeat, traces, flight dumps and the benchmarks'
// JSON lines. A small value type over nlohmann-json (Note [JSON by a
// library]), whose heavy header only engine/core/json.cpp includes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace lockstep::core {

// Note [JSON by a library]: every JSON text is formatted and parsed by
// nlohmann-json (Debian's nlohmann-json3-dev), never by hand; what used to be
// hand-formatted wrote `"grad_norm": nan` into the metrics file (which no
// strict reader accepts, Python's neither) and broke a record on a path with
// a quote in it. The rules the library gives us, kept by dump():
// - a non-finite number is written as null, and an object that held one
//   says which and what it was in a "non_finite" member
//   ({"grad_norm": null, ..., "non_finite": {"grad_norm": "nan"}});
// - strings are escaped by the library; bytes that are not UTF-8 (a file
//   name in Latin-1) are replaced by U+FFFD instead of failing the record;
// - an object keeps its members in the order they were set.
class Json {
 public:
  Json();  // null
  Json(std::nullptr_t) : Json() {}
  Json(bool value);
  Json(double value);
  Json(std::int64_t value);
  Json(std::uint64_t value);
  // Every other arithmetic type, as the nearest of the four above.
  template <typename T,
            typename = std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>>>
  Json(T value)
      : Json(std::is_floating_point_v<T> ? Json(static_cast<double>(value))
             : std::is_signed_v<T>       ? Json(static_cast<std::int64_t>(value))
                                         : Json(static_cast<std::uint64_t>(value))) {}
  Json(std::string_view text);
  Json(const char* text) : Json(std::string_view(text)) {}
  Json(const std::string& text) : Json(std::string_view(text)) {}
  template <typename T>
  Json(const std::optional<T>& value) : Json(value ? Json(*value) : Json()) {}

  static Json object();
  static Json array();
  // Parses `text` strictly (no NaN, no comments, no trailing commas); an
  // InvalidArgument naming `what` and the library's reason when it is not JSON.
  static Json parse(std::string_view text, std::string_view what);

  Json(const Json& other);
  Json(Json&& other) noexcept;
  Json& operator=(const Json& other);
  Json& operator=(Json&& other) noexcept;
  ~Json();

  // An object's member (replacing one of the same name); returns *this.
  Json& set(std::string_view key, Json value);
  // Appends to an array; returns *this.
  Json& push(Json value);
  // One line, no newline at its end, spaced as Python's json.dumps:
  // {"step": 3, "loss": 0.5}.
  std::string dump() const;

  // Readers for an object's members: nullopt when absent or of another type.
  bool has(std::string_view key) const;
  std::optional<double> number(std::string_view key) const;
  std::optional<std::string> text(std::string_view key) const;

 private:
  struct Value;
  std::unique_ptr<Value> value_;
};

}  // namespace lockstep::core
