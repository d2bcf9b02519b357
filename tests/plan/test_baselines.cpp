// Baseline planners in the same cost model: torchgpipe's block partition, even, PipeDream's DP,
// vPipe, and the exact DP as the yardstick.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "plan/baselines.h"
#include "plan/planner.h"
#include "plan/stage_evaluator.h"
#include "synthetic_profile.h"
#include "util/error.h"

using namespace dawnpiper;
using namespace dawnpiper::testing;

TEST_CASE("torchgpipe's block partition gives torchgpipe's answers", "[plan][baselines]") {
  // tests/test_balance.py of torchgpipe.
  CHECK(barany_block_partition({1, 2, 3, 4, 5, 6}, 2) == std::vector<int>{4, 2});
  CHECK(barany_block_partition({0, 0}, 2) == std::vector<int>{1, 1});
  CHECK_THROWS_AS(barany_block_partition({42}, 0), ConfigError);
  CHECK_THROWS_AS(barany_block_partition({}, 1), ConfigError);
  CHECK_THROWS_AS(barany_block_partition({42}, 2), ConfigError);
  // Its guarantee: block sums (normalized to [0, 1] per element) differ by at most one element.
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    int n = std::uniform_int_distribution<int>(1, 30)(rng);
    int parts = std::uniform_int_distribution<int>(1, n)(rng);
    std::vector<double> costs;
    for (int i = 0; i < n; ++i) costs.push_back(std::uniform_real_distribution<double>(1, 10)(rng));
    std::vector<int> sizes = barany_block_partition(costs, parts);
    REQUIRE(static_cast<int>(sizes.size()) == parts);
    int total = 0;
    for (int s : sizes) {
      CHECK(s >= 1);
      total += s;
    }
    CHECK(total == n);
  }
}

TEST_CASE("even gives every stage the same number of blocks", "[plan][baselines]") {
  SyntheticOptions o;
  o.nodes = 30;
  o.nodes_per_block = 3;  // 10 blocks
  Profile p = random_profile(2, o);
  PlanOptions opt;
  opt.stages = 4;
  opt.planner = PlannerKind::Even;
  CostModel m(p, opt);
  std::vector<int> units = block_boundaries(m);
  REQUIRE(units.size() == 11);
  Bounds b = even_partition(m);
  CHECK(b == Bounds{0, units[3], units[6], units[8], 30});
  opt.stages = 11;
  CHECK_THROWS_AS(make_plan(p, opt), ConfigError);  // 10 blocks < 11 stages
}

TEST_CASE("gpipe balances time, not memory", "[plan][baselines]") {
  // Eight blocks of equal time; the first four hold ten times the activations. With 1F1B, stage
  // 0 also keeps two micro-batches to stage 1's one.
  Profile p;
  p.micro_batch_size = 1;
  p.nodes.push_back(make_node(0, "input", 0));
  int prev = add_tensor(p, 0, 100, true);
  for (int i = 1; i <= 8; ++i) {
    NodeProfile n = make_node(i, "layer", i);
    set_time(n, 1.0, 2.0);
    n.param_bytes = 1000;
    p.nodes.push_back(n);
    int out = add_tensor(p, i, i <= 4 ? 1000000 : 100000);
    consume(p, i, prev);
    save(p, i, out);
    prev = out;
  }
  PlanOptions opt;
  opt.stages = 2;
  opt.schedule = ScheduleChoice::named("1f1b");
  opt.memopt = MemoptKind::None;
  opt.planner = PlannerKind::GPipe;
  Plan g = make_plan(p, opt);
  REQUIRE(g.stages.size() == 2);
  CHECK(g.stages[0].compute_ms == Approx(g.stages[1].compute_ms));  // 4 + 4 blocks
  CHECK(g.stages[0].memory.total() > 5 * g.stages[1].memory.total());

  // Below gpipe's peak, gpipe (memory-blind) has no plan without memory optimization while
  // DawnPiper moves the cut towards the memory-balanced point.
  opt.capacity_bytes = g.max_peak_bytes() * 4 / 5;
  CHECK_THROWS_AS(make_plan(p, opt), InfeasibleError);
  opt.planner = PlannerKind::DawnPiper;
  Plan d = make_plan(p, opt);
  CHECK(d.max_peak_bytes() <= opt.capacity_bytes);
  CHECK(d.stages[0].end < g.stages[0].end);
  CHECK(d.bottleneck_ms() > g.bottleneck_ms());  // memory costs time here
  // vPipe's boundary moves find a fitting plan too.
  opt.planner = PlannerKind::VPipe;
  CHECK(make_plan(p, opt).max_peak_bytes() <= opt.capacity_bytes);
}

TEST_CASE("pipedream is time-optimal without a memory limit", "[plan][baselines]") {
  // One node per block, negligible communication: PipeDream's DP over blocks is the exact
  // node-granularity optimum.
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SyntheticOptions o;
    o.nodes = 12 + static_cast<int>(seed % 20);
    o.nodes_per_block = 1;
    o.skip_probability = 0.2;
    Profile p = random_profile(seed, o);
    PlanOptions opt;
    opt.stages = 2 + static_cast<int>(seed % 5);
    opt.schedule = seed % 3 == 0   ? ScheduleChoice::named("gpipe")
                   : seed % 3 == 1 ? ScheduleChoice::named("1f1b")
                                   : ScheduleChoice::named("async");
    opt.link_bandwidth = 1e18;
    opt.memopt = MemoptKind::None;
    opt.planner = PlannerKind::PipeDream;
    Plan pd = make_plan(p, opt);
    opt.planner = PlannerKind::Exact;
    Plan ex = make_plan(p, opt);
    INFO("seed " << seed);
    CHECK(pd.bottleneck_ms() == Approx(ex.bottleneck_ms()).epsilon(1e-12));
  }
}

TEST_CASE("pipedream counts communication in its stage times", "[plan][baselines]") {
  // A chain whose middle cut carries a huge tensor: with a slow link PipeDream avoids it.
  Profile p;
  p.micro_batch_size = 1;
  p.nodes.push_back(make_node(0, "input", 0));
  int prev = add_tensor(p, 0, 100, true);
  for (int i = 1; i <= 6; ++i) {
    NodeProfile n = make_node(i, "layer", i);
    set_time(n, 1.0, 1.0);
    p.nodes.push_back(n);
    int out = add_tensor(p, i, i == 3 ? 1000000000 : 1000);
    consume(p, i, prev);
    prev = out;
  }
  PlanOptions opt;
  opt.stages = 2;
  opt.planner = PlannerKind::PipeDream;
  opt.link_bandwidth = 1e9;  // 1 GB per micro-batch: 2 s each way
  Plan pd = make_plan(p, opt);
  CHECK(pd.stages[0].end != 4);  // the balanced cut would send the 1 GB tensor
  opt.link_bandwidth = 1e15;
  CHECK(make_plan(p, opt).stages[0].end == 4);
}

TEST_CASE("exact is never beaten and fits whenever anything fits", "[plan][baselines]") {
  std::mt19937_64 rng(5);
  int compared = 0;
  for (uint64_t seed = 1; seed <= 80; ++seed) {
    SyntheticOptions o;
    o.nodes = 16 + static_cast<int>(seed % 16);
    o.nodes_per_block = 2;
    o.skip_probability = 0.2;
    Profile p = random_profile(seed, o);
    PlanOptions opt;
    opt.stages = 2 + static_cast<int>(seed % 4);
    opt.schedule = seed % 3 == 0   ? ScheduleChoice::named("gpipe")
                   : seed % 3 == 1 ? ScheduleChoice::named("1f1b")
                                   : ScheduleChoice::named("async");
    opt.memopt = seed % 2 ? MemoptKind::SwapRecompute : MemoptKind::Recompute;
    opt.planner = PlannerKind::Exact;
    opt.capacity_bytes = INT64_MAX;
    int64_t peak = make_plan(p, opt).max_peak_bytes();
    opt.capacity_bytes = static_cast<int64_t>(peak * std::uniform_real_distribution<double>(0.4, 1.0)(rng));
    std::optional<Plan> ex = try_plan(p, opt);
    for (PlannerKind planner :
         {PlannerKind::DawnPiper, PlannerKind::GPipe, PlannerKind::PipeDream, PlannerKind::Even}) {
      PlanOptions other = opt;
      other.planner = planner;
      std::optional<Plan> plan = try_plan(p, other);
      INFO("seed " << seed << " " << planner);
      if (plan) {
        REQUIRE(ex);
        CHECK(ex->bottleneck_ms() <= plan->bottleneck_ms() * (1 + 1e-12));
        ++compared;
      }
    }
  }
  CHECK(compared > 100);
}

// The plain DP over every (stage, start, end), every stage evaluated: what exact_partition's
// bound-ordered search must equal.
double all_pairs_optimum(StageEvaluator& ev) {
  const int n = ev.model().size(), l = ev.model().stages();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(l), std::vector<double>(static_cast<size_t>(n) + 1, inf));
  for (int e = 1; e <= n; ++e) best[0][static_cast<size_t>(e)] = ev.evaluate(0, e, 0).time_ms();
  for (int x = 1; x < l; ++x)
    for (int e = x + 1; e <= n; ++e)
      for (int s = x; s < e; ++s)
        best[static_cast<size_t>(x)][static_cast<size_t>(e)] = std::min(
            best[static_cast<size_t>(x)][static_cast<size_t>(e)],
            std::max(best[static_cast<size_t>(x) - 1][static_cast<size_t>(s)], ev.evaluate(s, e, x).time_ms()));
  return best[static_cast<size_t>(l) - 1][static_cast<size_t>(n)];
}

TEST_CASE("exact equals the plain DP over every stage range", "[plan][baselines]") {
  std::mt19937_64 rng(11);
  int binding = 0;
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    SyntheticOptions o;
    o.nodes = 8 + static_cast<int>(seed % 40);
    o.nodes_per_block = 1 + static_cast<int>(seed % 3);
    o.skip_probability = 0.2;
    Profile p = random_profile(seed, o);
    PlanOptions opt;
    opt.stages = 1 + static_cast<int>(seed % 6);
    opt.schedule = seed % 3 == 0   ? ScheduleChoice::named("gpipe")
                   : seed % 3 == 1 ? ScheduleChoice::named("1f1b")
                                   : ScheduleChoice::named("async");
    opt.memopt = seed % 4 == 0 ? MemoptKind::SwapRecompute : seed % 4 == 1 ? MemoptKind::Recompute : MemoptKind::None;
    opt.data_parallel = seed % 5 == 0 ? 4 : 1;
    opt.planner = PlannerKind::Exact;
    opt.capacity_bytes = INT64_MAX;
    const int64_t peak = make_plan(p, opt).max_peak_bytes();
    opt.capacity_bytes = static_cast<int64_t>(peak * std::uniform_real_distribution<double>(0.3, 1.1)(rng));
    CostModel model(p, opt);
    StageEvaluator ev(model, opt.memopt, opt.capacity_bytes);
    const double plain = all_pairs_optimum(ev);
    const Bounds bounds = exact_partition(ev);
    INFO("seed " << seed << " " << opt.schedule << " " << opt.memopt << " stages " << opt.stages);
    if (plain == std::numeric_limits<double>::infinity()) {
      CHECK(bounds.empty());
      continue;
    }
    REQUIRE(bounds.size() == static_cast<size_t>(opt.stages) + 1);
    CHECK(ev.objective(bounds) == plain);
    binding += opt.capacity_bytes < peak;
  }
  CHECK(binding >= 30);  // the capacity binds in a good share of them (40 of 120 when written)
}

TEST_CASE("with nothing to evict the planner keeps the optimum and balances the other stages", "[plan][baselines]") {
  int uneven_before = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SyntheticOptions o;
    o.nodes = 20 + static_cast<int>(seed % 30);
    o.skip_probability = 0.2;
    Profile p = random_profile(seed + 900, o);
    PlanOptions opt;
    opt.stages = 2 + static_cast<int>(seed % 5);
    opt.schedule = seed % 2 ? ScheduleChoice::named("1f1b") : ScheduleChoice::named("gpipe");
    opt.memopt = MemoptKind::None;
    opt.planner = PlannerKind::Exact;
    const Plan exact = make_plan(p, opt);
    opt.planner = PlannerKind::DawnPiper;
    const Plan ours = make_plan(p, opt);
    auto squares = [](const Plan& plan) {
      double sum = 0;
      for (const StagePlan& s : plan.stages) sum += s.time_ms() * s.time_ms();
      return sum;
    };
    INFO("seed " << seed);
    CHECK(ours.bottleneck_ms() == Approx(exact.bottleneck_ms()).epsilon(1e-12));
    CHECK(squares(ours) <= squares(exact) * (1 + 1e-12));
    CostModel model(p, opt);
    const Bounds balanced = balanced_partition(model, INT64_MAX, exact.bottleneck_ms() * (1 + 1e-12));
    REQUIRE(!balanced.empty());
    uneven_before += squares(exact) > squares(ours) * (1 + 1e-9);
  }
  CHECK(uneven_before >= 3);  // the exact DP's tie-breaking alone is uneven in some (5 of 60 when written)
}
