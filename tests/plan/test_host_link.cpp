// The measured host link: the copy time a swap is charged, and where the planner takes it from.
#include <catch2/catch.hpp>

#include <cmath>

#include "plan/cost_model.h"
#include "plan/planner.h"
#include "profile/host_link.h"
#include "synthetic_profile.h"
#include "util/error.h"

using namespace dawnpiper;
using namespace dawnpiper::testing;

namespace {
// An H100's pinned copies as the GPU check measured them (scripts/link_bandwidth.py, GB/s).
HostLink h100_link() {
  HostLink link;
  link.samples = {{int64_t{1} << 20, 17.2e9, 17.3e9, 23.9e9},
                  {int64_t{4} << 20, 35.7e9, 33.5e9, 55.7e9},
                  {int64_t{16} << 20, 48.1e9, 47.4e9, 83.1e9},
                  {int64_t{64} << 20, 52.9e9, 51.8e9, 94.5e9}};
  return link;
}
}  // namespace

TEST_CASE("a swap's copy time follows the measured link at its size", "[plan][host-link]") {
  const HostLink link = h100_link();
  // At a measured size: the slower direction's bandwidth.
  CHECK(link.copy_seconds(int64_t{4} << 20) == Approx(static_cast<double>(int64_t{4} << 20) / 33.5e9));
  // Beyond the measured sizes: the nearest one's bandwidth.
  CHECK(link.copy_seconds(int64_t{1} << 30) == Approx(static_cast<double>(int64_t{1} << 30) / 51.8e9));
  CHECK(link.copy_seconds(int64_t{1} << 10) == Approx(1024.0 / 17.2e9));
  // Between two sizes: the bandwidth interpolated in log size (2 MiB: halfway from 1 to 4 MiB).
  const double two = static_cast<double>(int64_t{2} << 20);
  CHECK(link.copy_seconds(int64_t{2} << 20) ==
        Approx(two / std::min(17.2e9 + 0.5 * (35.7e9 - 17.2e9), 17.3e9 + 0.5 * (33.5e9 - 17.3e9))));
  // Larger copies never take less time.
  double last = 0;
  for (int64_t b = 1000; b < (int64_t{1} << 31); b = b * 3 / 2) {
    CHECK(link.copy_seconds(b) >= last);
    last = link.copy_seconds(b);
  }
  CHECK(HostLink{}.copy_seconds(1 << 20) == 0);
}

TEST_CASE("host link samples round-trip and bad ones are refused", "[plan][host-link]") {
  const HostLink link = h100_link();
  const HostLink back = HostLink::from_json(link.to_json());
  REQUIRE(back.samples.size() == link.samples.size());
  CHECK(back.to_json() == link.to_json());
  CHECK_THROWS_AS(HostLink::from_json("[[1, 2, 3]]"), ConfigError);
  CHECK_THROWS_AS(HostLink::from_json("[[1048576, 0, 3, 4]]"), ConfigError);
  CHECK_THROWS_AS(HostLink::from_json("[[4194304, 1, 1, 1], [1048576, 1, 1, 1]]"), ConfigError);
  CHECK_THROWS_AS(HostLink::from_json("{"), ConfigError);
  CHECK(link.summary().find("17.2 GB/s") != std::string::npos);
}

TEST_CASE("the planner times swaps with the profile's link unless --host-bandwidth is given", "[plan][host-link]") {
  SyntheticOptions o;
  o.nodes = 20;
  Profile p = random_profile(5, o);
  PlanOptions opt;
  opt.stages = 1;
  opt.schedule = ScheduleChoice::named("gpipe");
  const int64_t bytes = int64_t{3} << 20;
  // Not measured: the constant.
  CHECK(CostModel(p, opt).host_ms(bytes) == Approx(1e3 * static_cast<double>(bytes) / opt.host_bandwidth));
  // Measured in the profile: the link.
  p.host_link = h100_link();
  CHECK(CostModel(p, opt).host_ms(bytes) == Approx(1e3 * p.host_link.copy_seconds(bytes)));
  CHECK(CostModel(p, opt).host_ms(bytes) < 1e3 * static_cast<double>(bytes) / opt.host_bandwidth);
  // Given on the command line: the constant again.
  PlanOptions given = opt;
  given.host_bandwidth = 8e9;
  given.host_bandwidth_given = true;
  CHECK(CostModel(p, given).host_ms(bytes) == Approx(1e3 * static_cast<double>(bytes) / 8e9));
  // The plan records the link it used, and a plan read back times swaps the same.
  opt.capacity_bytes = INT64_MAX;
  opt.memopt = MemoptKind::None;
  const Plan plan = make_plan(p, opt);
  REQUIRE(plan.options.host_link.measured());
  const Plan back = plan_from_json(plan.to_json());
  CHECK(back.options.host_link.to_json() == p.host_link.to_json());
  CHECK(CostModel(p, back.options).host_ms(bytes) == Approx(CostModel(p, opt).host_ms(bytes)));
}
