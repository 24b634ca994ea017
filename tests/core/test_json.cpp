// core::Json (engine/core/json.h, Note [JSON by a library]): what the
// library writes for hostile strings and non-finite numbers, checked against
// texts written out by hand from RFC 8259's rules, and strict parsing.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "engine/core/json.h"
#include "kernels/error.h"

using lockstep::InvalidArgument;
using lockstep::core::Json;

TEST_CASE("Json escapes quotes, backslashes and control characters", "[core][json]") {
  CHECK(Json("").dump() == "\"\"");
  CHECK(Json("say \"hi\"\\").dump() == "\"say \\\"hi\\\"\\\\\"");
  CHECK(Json(std::string("a\nb\tc\x01", 6)).dump() == "\"a\\nb\\tc\\u0001\"");
  CHECK(Json("caf\xc3\xa9 /").dump() == "\"caf\xc3\xa9 /\"");
  // Latin-1 bytes are not UTF-8: replaced (U+FFFD) instead of failing the record.
  CHECK(Json("caf\xe9").dump() == "\"caf\xef\xbf\xbd\"");
}

TEST_CASE("Json writes a non-finite number as null and names it", "[core][json]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(Json::object().set("step", 3).set("grad_norm", nan).set("loss", -inf).dump() ==
        R"({"step": 3, "grad_norm": null, "loss": null, )"
        R"("non_finite": {"grad_norm": "nan", "loss": "-inf"}})");
  CHECK(Json::object().set("loss", 0.5).dump() == R"({"loss": 0.5})");
  CHECK(Json::array().push(1).push(inf).dump() == "[1, null]");
  // Nested objects say it where the number is.
  CHECK(Json::object().set("a", Json::object().set("x", inf)).dump() ==
        R"({"a": {"x": null, "non_finite": {"x": "inf"}}})");
}

TEST_CASE("Json keeps the members' order and the integers' exact values", "[core][json]") {
  const std::int64_t big = (std::int64_t{1} << 62) + 1;  // not a double
  CHECK(Json::object()
            .set("z", 1)
            .set("a", big)
            .set("u", std::uint64_t{18446744073709551615u})
            .set("f", 0.1)
            .set("b", true)
            .set("n", std::optional<double>())
            .dump() ==
        R"({"z": 1, "a": 4611686018427387905, "u": 18446744073709551615, "f": 0.1, "b": true, )"
        R"("n": null})");
  // A key set twice keeps its first place and its last value.
  CHECK(Json::object().set("a", 1).set("b", 2).set("a", 3).dump() == R"({"a": 3, "b": 2})");
  // The spacing never touches a string's own ':' and ','.
  CHECK(Json::object().set("k", "a: b, \"c,\"").dump() == R"({"k": "a: b, \"c,\""})");
}

TEST_CASE("Json parses strictly and reads members back", "[core][json]") {
  const Json j = Json::parse(R"({"seconds": 1.5, "torch_version": "2.15.0", "n": null})", "x");
  CHECK(j.number("seconds") == 1.5);
  CHECK(j.text("torch_version") == "2.15.0");
  CHECK_FALSE(j.number("torch_version"));
  CHECK_FALSE(j.number("n"));
  CHECK_FALSE(j.has("missing"));
  CHECK_THROWS_AS(Json::parse(R"({"loss": nan})", "a record"), InvalidArgument);
  CHECK_THROWS_AS(Json::parse(R"({"loss": NaN})", "a record"), InvalidArgument);
  CHECK_THROWS_WITH(Json::parse(R"({"a": 1,})", "the answer"),
                    Catch::Contains("the answer is not valid JSON"));
  CHECK_THROWS_AS(Json::array().set("a", 1), InvalidArgument);
  CHECK_THROWS_AS(Json::object().push(1), InvalidArgument);
}
