// The minimal JSON writer and parser (lib/util/json.h) the plan format relies on.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "util/error.h"
#include "util/json.h"

using namespace dawnpiper;

TEST_CASE("json values round-trip through text", "[json]") {
  Json j = Json::object();
  j["name"] = "a \"quoted\"\\ name\n\twith\x01 control";
  j["int"] = int64_t(9223372036854775807LL);
  j["neg"] = int64_t(-9223372036854775807LL - 1);
  j["pi"] = 3.141592653589793;
  j["tiny"] = 4.9406564584124654e-324;
  j["whole"] = 2.0;
  j["yes"] = true;
  j["none"] = Json();
  Json arr = Json::array();
  arr.push_back(1);
  arr.push_back("two");
  arr.push_back(Json::array());
  arr.push_back(Json::object());
  j["list"] = arr;

  for (int indent : {-1, 0, 2}) {
    Json back = Json::parse(j.dump(indent));
    CHECK(back.dump() == j.dump());
    CHECK(back.at("name").as_string() == j.at("name").as_string());
    CHECK(back.at("int").as_int() == INT64_MAX);
    CHECK(back.at("neg").as_int() == INT64_MIN);
    CHECK(back.at("pi").as_double() == 3.141592653589793);
    CHECK(back.at("tiny").as_double() == 4.9406564584124654e-324);
    CHECK_FALSE(back.at("whole").is_integer());  // written as 2.0, stays a double
    CHECK(back.at("yes").as_bool());
    CHECK(back.at("none").is_null());
    CHECK(back.at("list").size() == 4);
    CHECK(back.at("list")[1].as_string() == "two");
  }
  CHECK(j.keys().front() == "name");  // insertion order kept
}

TEST_CASE("random doubles round-trip bit for bit", "[json]") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    if (!std::isfinite(v)) continue;
    Json back = Json::parse(Json(v).dump());
    double w = back.as_double();
    REQUIRE(std::memcmp(&v, &w, sizeof v) == 0);
  }
}

TEST_CASE("json parser reads escapes and unicode", "[json]") {
  Json j = Json::parse(R"({"s": "\u00e9\u4e2d\ud83d\ude00 \/ \b\f\r", "e": 1.5e3, "n": -0.25})");
  CHECK(j.at("s").as_string() == "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80 / \b\f\r");
  CHECK(j.at("e").as_double() == 1500);
  CHECK(j.at("e").as_int() == 1500);  // an exact integer written as a double is accepted
  CHECK(j.at("n").as_double() == -0.25);
  CHECK_THROWS_AS(j.at("n").as_int(), ConfigError);
}

TEST_CASE("json parser rejects malformed text with a position", "[json]") {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "{\"a\":1,}", "tru", "01x", "\"abc", "\"\\x\"", "[1] 2",
                          "{\"a\":\"\\ud800\"}", "-", "1.", "1e"}) {
    INFO(bad);
    CHECK_THROWS_AS(Json::parse(bad), ConfigError);
  }
  CHECK_THROWS_WITH(Json::parse("[1, 2, @]"), Catch::Contains("byte 7"));
  Json j = Json::parse("{\"a\": 1}");
  CHECK_THROWS_WITH(j.at("b"), Catch::Contains("missing key 'b'"));
  CHECK_THROWS_AS(j.at("a").as_string(), ConfigError);
}
