// core::json_string (engine/core/json.h), the one JSON string quoter of the
// trace and the metrics records: quotes, backslashes and control characters
// escaped, other bytes kept, checked against literals written out by hand.
#include <catch2/catch.hpp>

#include <string>

#include "engine/core/json.h"

using lockstep::core::json_string;

TEST_CASE("json_string quotes and escapes what JSON requires", "[core][json]") {
  CHECK(json_string("") == "\"\"");
  CHECK(json_string("fc1") == "\"fc1\"");
  CHECK(json_string("say \"hi\"\\") == "\"say \\\"hi\\\"\\\\\"");
  CHECK(json_string(std::string("a\nb\tc\x01", 6)) == "\"a\\u000ab\\u0009c\\u0001\"");
  CHECK(json_string("caf\xc3\xa9 /") == "\"caf\xc3\xa9 /\"");
}
