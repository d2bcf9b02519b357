#include <catch2/catch.hpp>

#include "util/error.h"
#include "util/units.h"

using namespace dawnpiper;

TEST_CASE("byte sizes parse in binary and decimal units", "[util]") {
  CHECK(parse_bytes("512MiB") == 512LL * 1024 * 1024);
  CHECK(parse_bytes("40GiB") == 40LL * 1024 * 1024 * 1024);
  CHECK(parse_bytes("1.5 GB") == 1500000000LL);
  CHECK(parse_bytes("1000") == 1000);
  CHECK(parse_bytes("2kib") == 2048);
  CHECK_THROWS_AS(parse_bytes("lots"), ConfigError);
  CHECK_THROWS_AS(parse_bytes("12XB"), ConfigError);
  CHECK_THROWS_AS(parse_bytes("-1GiB"), ConfigError);
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(17) == "17 B");
}
