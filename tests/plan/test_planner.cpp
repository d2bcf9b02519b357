// make_plan / find_max_batch end to end: option errors, every plan within capacity, memopt
// modes honoured, the JSON round trip, the infeasibility message, the micro-batch search.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <sstream>

#include "models/model_config.h"
#include "models/model_source.h"
#include "plan/calibrate.h"
#include "plan/cost_model.h"
#include "plan/planner.h"
#include "plan/schedule_search.h"
#include "plan/stage_evaluator.h"
#include "plan/stage_memory.h"
#include "plan/zero_baseline.h"
#include "profile/analytic.h"
#include "synthetic_profile.h"
#include "util/error.h"
#include "util/units.h"

using namespace dawnpiper;
using namespace dawnpiper::testing;

namespace {

Profile small_profile(uint64_t seed = 1, int nodes = 30) {
  SyntheticOptions o;
  o.nodes = nodes;
  o.nodes_per_block = 2;
  o.skip_probability = 0.2;
  return random_profile(seed, o);
}

// Every structural promise a plan makes to the runtime and to the user.
void check_plan(const Profile& p, const PlanOptions& opt, const Plan& plan) {
  REQUIRE(static_cast<int>(plan.stages.size()) == opt.stages);
  CHECK(plan.nodes == p.size());
  int begin = 0;
  for (const StagePlan& s : plan.stages) {
    CHECK(s.begin == begin);
    CHECK(s.end > s.begin);
    begin = s.end;
    double compute = 0;
    for (int i = s.begin; i < s.end; ++i)
      compute += p.nodes[static_cast<size_t>(i)].fwd_ms + p.nodes[static_cast<size_t>(i)].bwd_ms;
    CHECK(s.compute_ms == Approx(compute));
    CHECK(s.memory.total() <= opt.capacity_bytes);     // within capacity, in the cost model
    CHECK(s.memory.total() <= s.peak_without_memopt);  // optimization never adds memory
    int64_t kept = 0, evicted = 0;
    for (const TensorDecision& d : s.decisions) {
      (d.action == TensorAction::Keep ? kept : evicted) += d.bytes;
      if (opt.memopt == MemoptKind::None) CHECK(d.action == TensorAction::Keep);
      if (opt.memopt == MemoptKind::Recompute) CHECK(d.action != TensorAction::Swap);
    }
    CHECK(s.memory.activation_per_micro_batch == kept);
    CHECK(s.memory.total() == s.peak_without_memopt - s.memory.in_flight * evicted);
    if (opt.memopt == MemoptKind::None) CHECK(s.memopt_ms == 0);
    if (evicted == 0) CHECK(s.memopt_ms == 0);
  }
  CHECK(begin == p.size());
}

int64_t needed_bytes(const std::string& message) {
  std::smatch m;
  REQUIRE(std::regex_search(message, m, std::regex("needs at least [^(]*\\((\\d+) bytes\\)")));
  return std::stoll(m[1]);
}

}  // namespace

TEST_CASE("make_plan rejects bad options", "[plan][planner]") {
  Profile p = small_profile();
  PlanOptions opt;
  opt.stages = 2;
  auto with = [&](auto change) {
    PlanOptions o = opt;
    change(o);
    return o;
  };
  CHECK_NOTHROW(make_plan(p, opt));
  CHECK_THROWS_AS(make_plan(p, with([](PlanOptions& o) { o.stages = 0; })), ConfigError);
  CHECK_THROWS_AS(make_plan(p, with([](PlanOptions& o) { o.stages = 31; })), ConfigError);
  CHECK_THROWS_AS(make_plan(p, with([](PlanOptions& o) { o.capacity_bytes = 0; })), ConfigError);
  CHECK_THROWS_AS(make_plan(p, with([](PlanOptions& o) {
                              o.planner = PlannerKind::GPipe;
                              o.stages = 16;  // 15 blocks
                            })),
                  ConfigError);
}

TEST_CASE("option names are parsed once into enums and printed back by name", "[plan][planner]") {
  CHECK_THROWS_WITH(from_name<PlannerKind>("alpa"), Catch::Contains("unknown planner 'alpa'"));
  CHECK_THROWS_AS(from_name<ScheduleChoice>("zb"), ConfigError);
  CHECK_THROWS_AS(from_name<MemoptKind>("s"), ConfigError);
  CHECK_THROWS_AS(from_name<OptimizerKind>("lion"), ConfigError);
  CHECK(all_values<PlannerKind>().size() == 8);
  for (PlannerKind k : all_values<PlannerKind>()) CHECK(from_name<PlannerKind>(name_of(k)) == k);
  for (MemoptKind m : {MemoptKind::None, MemoptKind::Recompute, MemoptKind::SwapRecompute})
    CHECK(from_name<MemoptKind>(name_of(m)) == m);
  for (OptimizerKind k : {OptimizerKind::Sgd, OptimizerKind::Adam}) CHECK(from_name<OptimizerKind>(name_of(k)) == k);
  // --help's choices come from the same tables, with a value's meaning where it has one.
  CHECK(enum_help<MemoptKind>() == "none | r (recompute) | sr (swap + recompute)");
  CHECK(enum_help<PlannerKind>().rfind("dawnpiper | gpipe | pipedream", 0) == 0);
  // A plan file naming an unknown planner is refused where it is read.
  PlanOptions opt;
  opt.stages = 2;
  const std::string good = make_plan(small_profile(), opt).to_json();
  std::string text = good;
  const std::string key = "\"planner\": \"dawnpiper\"";
  REQUIRE(text.find(key) != std::string::npos);
  text.replace(text.find(key), key.size(), "\"planner\": \"alpa\"");
  CHECK_THROWS_WITH(plan_from_json(text), Catch::Contains("unknown planner 'alpa'"));
  // JSON errors name the value's place in the file.
  const std::string stages = "\"stages\": 2";
  text = good;
  REQUIRE(text.find(stages) != std::string::npos);
  text.replace(text.find(stages), stages.size(), "\"stages\": \"two\"");
  CHECK_THROWS_WITH(plan_from_json(text), Catch::Contains("malformed plan: (/inputs/stages) type must be number"));
  CHECK_THROWS_WITH(plan_from_json("{\"format\": "), Catch::Contains("malformed plan: parse error"));
}

TEST_CASE("every planner's plan respects the capacity and its memopt mode", "[plan][planner]") {
  std::mt19937_64 rng(17);
  int plans = 0, optimized = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    Profile p = small_profile(seed, 20 + static_cast<int>(seed % 20));
    for (ScheduleChoice schedule :
         {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async")}) {
      PlanOptions opt;
      opt.stages = 2 + static_cast<int>(seed % 4);
      opt.schedule = schedule;
      opt.micro_batches = 1 + static_cast<int64_t>(seed % 6);
      opt.optimizer = seed % 2 ? OptimizerKind::Adam : OptimizerKind::Sgd;
      opt.planner = PlannerKind::Exact;
      opt.capacity_bytes = INT64_MAX;
      int64_t peak = make_plan(p, opt).max_peak_bytes();
      opt.capacity_bytes = static_cast<int64_t>(peak * std::uniform_real_distribution<double>(0.5, 1.0)(rng));
      for (PlannerKind planner : all_values<PlannerKind>()) {
        if (is_zero_baseline(planner)) continue;  // no pipeline planner (test_zero_baseline.cpp)
        for (MemoptKind memopt : {MemoptKind::None, MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
          PlanOptions o = opt;
          o.planner = planner;
          o.memopt = memopt;
          std::optional<Plan> plan = try_plan(p, o);
          INFO("seed " << seed << " " << schedule << " " << planner << " " << memopt);
          if (!plan) continue;
          ++plans;
          for (const StagePlan& s : plan->stages) optimized += s.memopt_ms > 0;
          check_plan(p, o, *plan);
          CHECK(plan->options.planner == planner);
        }
      }
    }
  }
  CHECK(plans > 500);
  CHECK(optimized > 100);
}

TEST_CASE("one stage holds the whole graph for every planner", "[plan][planner]") {
  Profile p = small_profile(5, 20);
  for (PlannerKind planner : all_values<PlannerKind>()) {
    if (is_zero_baseline(planner)) continue;  // no pipeline planner (test_zero_baseline.cpp)
    PlanOptions opt;
    opt.stages = 1;
    opt.planner = planner;
    Plan plan = make_plan(p, opt);
    REQUIRE(plan.stages.size() == 1);
    CHECK(plan.stages[0].begin == 0);
    CHECK(plan.stages[0].end == 20);
    CHECK(plan.stages[0].crossing.empty());
  }
}

TEST_CASE("async plans carry stashed weight versions", "[plan][planner]") {
  Profile p = small_profile(4, 40);
  PlanOptions opt;
  opt.stages = 4;
  opt.schedule = ScheduleChoice::named("async");
  Plan plan = make_plan(p, opt);
  for (int x = 0; x < 4; ++x) {
    const MemoryBreakdown& m = plan.stages[static_cast<size_t>(x)].memory;
    CHECK(m.weight_versions == 4 - x);
    CHECK(m.in_flight == 4 - x);
    CHECK(m.stashed_weights == (3 - x) * m.weights);
  }
}

TEST_CASE("plans round-trip through JSON", "[plan][planner]") {
  Profile p = small_profile(6, 36);
  PlanOptions opt;
  opt.stages = 3;
  opt.schedule = ScheduleChoice::named("1f1b");
  opt.optimizer = OptimizerKind::Adam;
  opt.memopt = MemoptKind::SwapRecompute;
  opt.host_bandwidth = 12.5e9;
  opt.link_bandwidth = 3.3e9;
  opt.planner = PlannerKind::Exact;
  opt.capacity_bytes = INT64_MAX;
  opt.capacity_bytes = make_plan(p, opt).max_peak_bytes() * 7 / 10;
  opt.planner = PlannerKind::DawnPiper;
  Plan plan = make_plan(p, opt);
  int decisions = 0;
  for (const StagePlan& s : plan.stages)
    for (const TensorDecision& d : s.decisions) decisions += d.action != TensorAction::Keep;
  REQUIRE(decisions > 0);  // the round trip covers swap / recompute entries

  std::string json = plan.to_json();
  Plan back = plan_from_json(json);
  CHECK(back.to_json() == json);
  CHECK(back.version == Plan::kVersion);
  CHECK(back.options.capacity_bytes == opt.capacity_bytes);
  CHECK(back.options.allocator_headroom_bytes == 0);
  CHECK(back.options.host_bandwidth == opt.host_bandwidth);
  CHECK(back.options.link_bandwidth == opt.link_bandwidth);
  CHECK(back.options.schedule == ScheduleChoice::named("1f1b"));
  CHECK(back.micro_batch_size == plan.micro_batch_size);
  CHECK(back.graph_hash == plan.graph_hash);
  CHECK(back.precision == plan.precision);
  REQUIRE(back.stages.size() == plan.stages.size());
  for (size_t x = 0; x < plan.stages.size(); ++x) {
    const StagePlan &a = plan.stages[x], &b = back.stages[x];
    CHECK(a.begin == b.begin);
    CHECK(a.end == b.end);
    CHECK(a.compute_ms == b.compute_ms);  // bit for bit
    CHECK(a.memopt_ms == b.memopt_ms);
    CHECK(a.memory.total() == b.memory.total());
    CHECK(a.crossing.size() == b.crossing.size());
    REQUIRE(a.decisions.size() == b.decisions.size());
    for (size_t i = 0; i < a.decisions.size(); ++i) {
      CHECK(a.decisions[i].tensor == b.decisions[i].tensor);
      CHECK(a.decisions[i].action == b.decisions[i].action);
      CHECK(a.decisions[i].restore_before == b.decisions[i].restore_before);
      CHECK(a.decisions[i].prefetch_at == b.decisions[i].prefetch_at);
    }
    CHECK(a.evictions == b.evictions);  // the stage program
  }
  // An internal buffer's eviction keeps the node that makes it and the input it copies.
  Plan with_internal = plan;
  for (StagePlan& s : with_internal.stages)
    if (!s.evictions.empty()) {
      Eviction ev = s.evictions.front();
      ev.internal = {ev.restore_before, 3};
      s.evictions.push_back(ev);
      CHECK(plan_from_json(with_internal.to_json()).stages[static_cast<size_t>(s.index)].evictions == s.evictions);
      break;
    }
  // An unlimited capacity survives too (INT64_MAX as an exact integer).
  opt.capacity_bytes = INT64_MAX;
  CHECK(plan_from_json(make_plan(p, opt).to_json(-1)).options.capacity_bytes == INT64_MAX);

  // Damaged plans are refused.
  std::string other_version = std::regex_replace(json, std::regex("\"version\": 2"), "\"version\": 99");
  CHECK_THROWS_WITH(plan_from_json(other_version), Catch::Contains("version 99"));
  // A version-1 plan has no stage programs: make it again.
  std::string older = std::regex_replace(json, std::regex("\"version\": 2"), "\"version\": 1");
  CHECK_THROWS_WITH(plan_from_json(older), Catch::Contains("dawnpiper plan"));
  std::string gap = std::regex_replace(json, std::regex("\"begin\": " + std::to_string(plan.stages[1].begin)),
                                       "\"begin\": " + std::to_string(plan.stages[1].begin + 1));
  CHECK_THROWS_AS(plan_from_json(gap), ConfigError);
  CHECK_THROWS_AS(plan_from_json("{\"stages\": []}"), ConfigError);
  CHECK_THROWS_AS(plan_from_json("not json"), ConfigError);
}

TEST_CASE("the table names every stage", "[plan][planner]") {
  Profile p = small_profile(2, 30);
  PlanOptions opt;
  opt.stages = 3;
  Plan plan = make_plan(p, opt);
  std::ostringstream out;
  plan.print_table(out);
  std::string text = out.str();
  CHECK(text.find("stage") != std::string::npos);
  CHECK(text.find("capacity unlimited") != std::string::npos);
  for (const StagePlan& s : plan.stages)
    CHECK(text.find("[" + std::to_string(s.begin) + "," + std::to_string(s.end) + ")") != std::string::npos);
  CHECK(text.find("bottleneck") != std::string::npos);
}

TEST_CASE("an infeasible plan names the capacity that would work", "[plan][planner]") {
  Profile p = small_profile(8, 30).at_batch(4);
  int named_batch = 0, none_fits = 0;
  for (PlannerKind planner : {PlannerKind::DawnPiper, PlannerKind::Exact, PlannerKind::PipeDream}) {
    for (MemoptKind memopt : {MemoptKind::None, MemoptKind::SwapRecompute}) {
      PlanOptions opt;
      opt.stages = 3;
      opt.schedule = ScheduleChoice::named("1f1b");
      opt.planner = planner;
      opt.memopt = memopt;
      opt.capacity_bytes = 1000000;  // far too small
      std::string message;
      try {
        make_plan(p, opt);
        FAIL("expected InfeasibleError");
      } catch (const InfeasibleError& e) {
        message = e.what();
      }
      INFO(message);
      CHECK(message.find("no feasible plan") != std::string::npos);
      CHECK(message.find("micro-batch size 4") != std::string::npos);
      int64_t need = needed_bytes(message);
      // The reported capacity works, and noticeably less does not.
      opt.capacity_bytes = need;
      CHECK_NOTHROW(make_plan(p, opt));
      opt.capacity_bytes = need - need / 100;
      CHECK_FALSE(try_plan(p, opt));
      // With batch-size fits, the message also says which micro-batch size fits, if any.
      opt.capacity_bytes = need - need / 100;
      try {
        make_plan(p, opt);
        FAIL("expected InfeasibleError");
      } catch (const InfeasibleError& e) {
        std::string m = e.what();
        std::smatch match;
        if (std::regex_search(m, match, std::regex("the largest micro-batch size that fits [^;]* is (\\d+)"))) {
          int64_t b = std::stoll(match[1]);
          CHECK(b >= 1);
          CHECK(b < 4);
          CHECK(try_plan(small_profile(8, 30).at_batch(b), opt));
          CHECK_FALSE(try_plan(small_profile(8, 30).at_batch(b + 1), opt));
          ++named_batch;
        } else {
          CHECK(m.find("not even micro-batch size 1 fits") != std::string::npos);
          CHECK_FALSE(try_plan(small_profile(8, 30).at_batch(1), opt));
          ++none_fits;
        }
      }
    }
  }
  CHECK(named_batch > 0);  // both kinds of message occur here
  CHECK(none_fits > 0);
}

// A capacity below what one node holds by itself (its forward's tensors, its parameters with
// their gradients and optimizer state) fits no partition: the message names that node.
TEST_CASE("an infeasible plan names the node that alone needs more than the capacity", "[plan][planner]") {
  const Profile p = small_profile(8, 30).at_batch(4);
  PlanOptions opt;
  opt.stages = 3;
  opt.schedule = ScheduleChoice::named("1f1b");
  opt.memopt = MemoptKind::SwapRecompute;
  const CostModel model(p, opt);
  int64_t largest = 0;
  int node = -1;
  for (int i = 0; i < model.size(); ++i) {
    int64_t least = INT64_MAX;
    // The need is a lower bound: the node alone on a stage, everything it saves swapped out,
    // replays at least that much.
    std::vector<TensorDecision> swapped;
    for (int t : model.saved_at(i))
      if (model.evictable(t)) swapped.push_back({t, p.tensors[static_cast<size_t>(t)].bytes, TensorAction::Swap, i});
    for (int x = 0; x < opt.stages; ++x) {
      least = std::min(least, model.memory_floor(i, i + 1, x, true));
      CHECK(replay_stage_memory(model, i, i + 1, x, swapped).peak >= model.memory_floor(i, i + 1, x, true));
    }
    if (least > largest) largest = least, node = i;
  }
  REQUIRE(node >= 0);
  auto message_at = [&](int64_t capacity) {
    opt.capacity_bytes = capacity;
    try {
      make_plan(p, opt);
    } catch (const InfeasibleError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const NodeProfile& n = p.nodes[static_cast<size_t>(node)];
  const std::string named = message_at(largest - 1);
  INFO(named);
  CHECK(named.find("; node " + n.name + " (" + n.kind + ") alone needs at least " +
                   format_bytes(static_cast<double>(largest)) + " on any stage") != std::string::npos);
  const std::string unnamed = message_at(largest);  // every node fits alone; three stages may not
  if (!unnamed.empty()) CHECK(unnamed.find("alone needs") == std::string::npos);
}

TEST_CASE("find_max_batch returns the largest micro-batch size that fits", "[plan][planner]") {
  Profile p = small_profile(3, 30);
  for (ScheduleChoice schedule :
       {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async")}) {
    for (MemoptKind memopt : {MemoptKind::None, MemoptKind::SwapRecompute}) {
      PlanOptions opt;
      opt.stages = 3;
      opt.schedule = schedule;
      opt.memopt = memopt;
      opt.capacity_bytes = 400000000;
      MaxBatch mb = find_max_batch(p, opt, 4096);
      INFO(schedule << " " << memopt << " B " << mb.micro_batch_size);
      CHECK(mb.micro_batch_size > 1);
      CHECK(mb.micro_batch_size < 4096);
      CHECK(mb.plan.micro_batch_size == mb.micro_batch_size);
      check_plan(p.at_batch(mb.micro_batch_size), opt, mb.plan);
      // The search need not be monotone in the size: the next sizes below the first failed
      // doubling are probed too.
      int64_t doubling = 1;
      while (doubling <= mb.micro_batch_size) doubling *= 2;
      for (int64_t b = mb.micro_batch_size + 1; b < doubling && b <= mb.micro_batch_size + 4; ++b)
        CHECK_FALSE(try_plan(p.at_batch(b), opt));
      // The cap is honoured.
      MaxBatch capped = find_max_batch(p, opt, 3);
      CHECK(capped.micro_batch_size == std::min<int64_t>(3, mb.micro_batch_size));
    }
  }
  PlanOptions opt;
  opt.stages = 3;
  opt.capacity_bytes = 1000;
  CHECK_THROWS_WITH(find_max_batch(p, opt), Catch::Contains("micro-batch size 1"));
  CHECK_THROWS_AS(find_max_batch(p, opt, 4096, -1), ConfigError);
  Profile no_fits = p;
  for (TensorProfile& t : no_fits.tensors) t.bytes_fit = {};
  for (NodeProfile& n : no_fits.nodes) n.fwd_ms_fit = n.bwd_ms_fit = {};
  CHECK_THROWS_AS(find_max_batch(no_fits, PlanOptions{}), ConfigError);
}

namespace {
// Three stages at `capacity`, judged by the replay: the max-batch tests' configurations.
PlanOptions max_batch_options(const ScheduleChoice& schedule, MemoptKind memopt, int64_t capacity) {
  PlanOptions opt;
  opt.stages = 3;
  opt.schedule = schedule;
  opt.memopt = memopt;
  opt.capacity_bytes = capacity;
  opt.fit_replayed = true;
  return opt;
}
}  // namespace

// Planning the sizes the search may need next on several threads changes how long it takes, not
// its answer: the same sizes decide, in the same order, even where feasibility is not monotone
// in the size.
TEST_CASE("find_max_batch gives the same answer on any number of threads", "[plan][planner]") {
  Profile p = small_profile(3, 30);
  int cases = 0;
  for (ScheduleChoice schedule :
       {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async")}) {
    for (MemoptKind memopt : {MemoptKind::None, MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
      for (int64_t capacity : {150000000, 400000000}) {
        const PlanOptions opt = max_batch_options(schedule, memopt, capacity);
        const MaxBatch one = find_max_batch(p, opt, 4096, 1);
        INFO(schedule << " " << memopt << " " << capacity << " B " << one.micro_batch_size);
        for (int threads : {2, 3, 7}) {
          const MaxBatch many = find_max_batch(p, opt, 4096, threads);
          CHECK(many.micro_batch_size == one.micro_batch_size);
          CHECK(many.plan.stages.size() == one.plan.stages.size());
          for (size_t x = 0; x < one.plan.stages.size(); ++x) {
            CHECK(many.plan.stages[x].begin == one.plan.stages[x].begin);
            CHECK(many.plan.stages[x].memory.replayed_peak == one.plan.stages[x].memory.replayed_peak);
          }
        }
        ++cases;
      }
    }
  }
  CHECK(cases == 18);
}

// The search as its header states it (doubling, bisection, then on until four sizes in a row
// fail), written out here over try_plan: find_max_batch's speculative threads change neither
// its answer nor the plan it returns, which is `plan`'s at that size.
TEST_CASE("find_max_batch answers as the search over try_plan's plans", "[plan][planner]") {
  Profile p = small_profile(3, 30);
  auto reference = [&](const PlanOptions& opt) {
    std::map<int64_t, bool> fits;
    auto ask = [&](int64_t b) {
      if (!fits.count(b)) fits[b] = try_plan(p.at_batch(b), opt).has_value();
      return fits[b];
    };
    if (!ask(1)) return int64_t{0};
    int64_t lo = 1, hi = 2;
    while (ask(hi)) lo = hi, hi *= 2;
    const int64_t ceiling = hi;
    while (hi - lo > 1) (ask(lo + (hi - lo) / 2) ? lo : hi) = lo + (hi - lo) / 2;
    for (int64_t b = lo + 1, misses = 0; b < ceiling && misses < 4; ++b) {
      if (ask(b))
        lo = b, misses = 0;
      else
        ++misses;
    }
    return lo;
  };
  for (ScheduleChoice schedule :
       {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async")}) {
    for (MemoptKind memopt : {MemoptKind::None, MemoptKind::SwapRecompute}) {
      for (int64_t capacity : {150000000, 400000000}) {
        const PlanOptions opt = max_batch_options(schedule, memopt, capacity);
        const MaxBatch found = find_max_batch(p, opt, 4096, 2);
        INFO(schedule << " " << memopt << " " << capacity << " B " << found.micro_batch_size);
        REQUIRE(found.micro_batch_size == reference(opt));
        const std::optional<Plan> best = try_plan(p.at_batch(found.micro_batch_size), opt);
        REQUIRE(best);
        REQUIRE(found.plan.stages.size() == best->stages.size());
        for (size_t x = 0; x < best->stages.size(); ++x) {
          CHECK(found.plan.stages[x].begin == best->stages[x].begin);
          CHECK(found.plan.stages[x].evictions.size() == best->stages[x].evictions.size());
          CHECK(found.plan.stages[x].memory.replayed_peak == best->stages[x].memory.replayed_peak);
        }
      }
    }
  }
}

// find_max_batch stops the plans of sizes it no longer needs through this flag: from then on the
// evaluator answers every stage it has not evaluated as not fitting, without evaluating it.
TEST_CASE("a stopped evaluator evaluates nothing more", "[plan][planner]") {
  const Profile p = small_profile(2, 30);
  PlanOptions opt;
  opt.stages = 3;
  opt.memopt = MemoptKind::SwapRecompute;
  const CostModel model(p, opt);
  std::atomic<bool> stop{false};
  StageEvaluator ev(model, opt.memopt, INT64_MAX);
  ev.set_stop(&stop);
  REQUIRE(ev.evaluate(0, 10, 0).feasible);
  REQUIRE(ev.evaluations() == 1);
  stop = true;
  CHECK(ev.evaluate(0, 10, 0).feasible);  // known before the stop
  CHECK_FALSE(ev.evaluate(10, 20, 1).feasible);
  CHECK(ev.evaluations() == 1);
  stop = false;
  CHECK(ev.evaluate(10, 20, 1).feasible);  // not cached as infeasible
  CHECK(ev.evaluations() == 2);
}

// The search decides with the memory formula; with fit_replayed (the command line's setting) a
// plan is searched again under a lower capacity until every stage's replayed peak fits.
TEST_CASE("with fit_replayed every stage's replayed peak fits the capacity", "[plan][planner]") {
  const Profile p = transformer_like_profile(6);
  PlanOptions unconstrained;
  unconstrained.stages = 3;
  unconstrained.schedule = ScheduleChoice::named("1f1b");
  const Plan free = make_plan(p, unconstrained);
  int64_t top = 0;
  for (const StagePlan& s : free.stages) top = std::max(top, s.memory.predicted_peak());
  int overshooting = 0, fitted = 0;
  for (ScheduleChoice schedule :
       {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async")}) {
    for (MemoptKind memopt : {MemoptKind::None, MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
      for (double fraction : {0.5, 0.6, 0.7, 0.8, 0.9}) {
        PlanOptions o = unconstrained;
        o.schedule = schedule;
        o.memopt = memopt;
        o.capacity_bytes = static_cast<int64_t>(fraction * static_cast<double>(top));
        INFO(schedule << " " << memopt << " capacity " << fraction);
        if (std::optional<Plan> formula = try_plan(p, o)) {
          for (const StagePlan& s : formula->stages) overshooting += s.memory.predicted_peak() > o.capacity_bytes;
        }
        o.fit_replayed = true;
        if (std::optional<Plan> plan = try_plan(p, o)) {
          ++fitted;
          CHECK(plan->options.capacity_bytes == o.capacity_bytes);  // the user's, not the tightened one
          for (const StagePlan& s : plan->stages) CHECK(s.memory.predicted_peak() <= o.capacity_bytes);
        }
      }
    }
  }
  CHECK(overshooting > 0);  // the formula alone does exceed the capacity here
  CHECK(fitted > 0);
}

// Where the formula underestimates a stage by far (bert-large, A100, async, 8 stages, swap: the
// formula counts swapped tensors as gone for every micro-batch in flight, the replay brings them
// back at their prefetch points), testing each stage by its replay inside the search still
// finds a plan; lowering the search capacity from outside found none at micro-batch 150.
TEST_CASE("with fit_replayed the search tests each stage by its replayed peak", "[plan][planner]") {
  const Profile p = analytic_profile(build_model(preset_config("bert-large"), 150), device_spec("a100-40gb"));
  PlanOptions o;
  o.stages = 8;
  o.micro_batches = 8;
  o.schedule = ScheduleChoice::named("async");
  o.memopt = MemoptKind::SwapRecompute;
  o.capacity_bytes = 40LL << 30;
  o.fit_replayed = true;
  std::optional<Plan> plan = try_plan(p, o);
  REQUIRE(plan);
  for (const StagePlan& s : plan->stages) CHECK(s.memory.replayed_peak <= o.capacity_bytes);
}

// BiPar's sweeps assume a stage that fits keeps fitting when its range shrinks; the replayed
// peak breaks that (more recomputation holds more re-run buffers). bert-large, gpipe, 4 stages,
// sr, micro-batch 86: vPipe's block-level search finds a split, BiPar alone found none; the
// dawnpiper planner also refines block-boundary cuts with its own evaluator and does as well.
TEST_CASE("dawnpiper finds a split wherever vPipe's search over block boundaries does", "[plan][planner]") {
  const DeviceSpec a100 = device_spec("a100-40gb");
  const Profile p = analytic_profile(build_model(preset_config("bert-large"), 86), a100);
  PlanOptions o;
  o.host_bandwidth = a100.host_bandwidth;
  o.link_bandwidth = a100.link_bandwidth;
  o.stages = 4;
  o.micro_batches = 4;
  o.schedule = ScheduleChoice::named("gpipe");
  o.memopt = MemoptKind::SwapRecompute;
  o.capacity_bytes = 40LL << 30;
  o.fit_replayed = true;
  o.planner = PlannerKind::VPipe;
  std::optional<Plan> vpipe = try_plan(p, o);
  REQUIRE(vpipe);
  o.planner = PlannerKind::DawnPiper;
  std::optional<Plan> ours = try_plan(p, o);
  REQUIRE(ours);
  CHECK(ours->bottleneck_ms() <= vpipe->bottleneck_ms());
  for (const StagePlan& s : ours->stages) CHECK(s.memory.replayed_peak <= o.capacity_bytes);
}

// The other way round: where the formula overestimates a stage, fit_replayed plans evict only
// what the replay needs, so they never cost more memory-optimization time for the same cuts.
TEST_CASE("with fit_replayed a stage evicts no more than its replay needs", "[plan][planner]") {
  // A large workspace in the first layer's forward: the formula adds it to every in-flight
  // micro-batch's activations, while the replay knows the current micro-batch has few yet.
  Profile p = transformer_like_profile(6);
  int64_t activations = 0;
  for (const TensorProfile& t : p.tensors) activations += t.saved_by.empty() ? 0 : t.bytes;
  p.nodes[2].fwd_workspace = 2 * activations;
  PlanOptions o;
  o.stages = 3;
  o.schedule = ScheduleChoice::named("1f1b");
  int64_t top = 0;
  for (const StagePlan& s : make_plan(p, o).stages) top = std::max(top, s.memory.predicted_peak());
  int relaxed = 0;
  for (MemoptKind memopt : {MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
    for (double fraction : {0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9}) {
      o.memopt = memopt;
      o.capacity_bytes = static_cast<int64_t>(fraction * static_cast<double>(top));
      o.fit_replayed = true;
      std::optional<Plan> plan = try_plan(p, o);
      if (!plan) continue;
      INFO(memopt << " capacity " << fraction);
      PlanOptions formula = o;  // the same cuts, decided by the formula alone
      formula.fit_replayed = false;
      CostModel model(p, formula);
      StageEvaluator evaluator(model, memopt, o.capacity_bytes);
      for (const StagePlan& s : plan->stages) {
        CHECK(s.memory.replayed_peak <= o.capacity_bytes);
        if (s.replayed_peak_without_memopt <= o.capacity_bytes)
          for (const TensorDecision& d : s.decisions) CHECK(d.action == TensorAction::Keep);
        const StagePlan by_formula = evaluator.stage_plan(s.begin, s.end, s.index);
        if (by_formula.memory.replayed_peak > o.capacity_bytes) continue;  // tightened search
        CHECK(s.memopt_ms <= by_formula.memopt_ms + 1e-9);
        relaxed += s.memopt_ms < by_formula.memopt_ms;
      }
    }
  }
  CHECK(relaxed > 0);
}

TEST_CASE("ZeRO's collectives in a stage's time: per update at levels 0-1, also per micro-batch at 2-3",
          "[plan][zero]") {
  const Profile p = analytic_profile(build_model(preset_config("gpt2-tiny"), 4), device_spec("a100-40gb"));
  PlanOptions opt;
  opt.stages = 2;
  opt.schedule = ScheduleChoice::named("1f1b");
  opt.micro_batches = 4;
  opt.link_bandwidth = 10e9;
  opt.data_parallel = 4;
  const CostModel level0(p, opt);
  const int cut = level0.size() / 2;
  // One pass of the stage's parameter bytes over a ring of 4.
  const double pass = 3.0 / 4 * 1e3 * static_cast<double>(level0.held_param_bytes(0, cut)) / 10e9;
  CHECK(level0.allreduce_ms(0, cut) == Approx(2 * pass));
  const double passes[] = {2, 2, 4 + 1, 3 * 4};  // level 2: m reduce-scatters, 1 all-gather
  for (int level = 1; level <= 3; ++level) {
    INFO("level " << level);
    opt.zero_stage = level;
    const CostModel model(p, opt);
    CHECK(model.allreduce_ms(0, cut) == Approx(passes[level] * pass));
    CHECK(model.allreduce_per_micro_batch_ms(0, cut) == Approx(passes[level] * pass / 4));
  }
  // Where they run: the embedding tied across the cut waits for the update (after the stages'
  // sum) at levels 1-3, the rest streams; each level moves what allreduce_ms counts, but the
  // tied weight's reduce-scatter, once a step rather than per micro-batch at levels 2-3.
  const int64_t tied = level0.tied_across_bytes(0, cut);
  CHECK(tied > 0);
  CHECK(tied == level0.tied_across_bytes(cut, level0.size()));
  CHECK(level0.tied_copy_bytes(0, cut) == 0);
  CHECK(level0.tied_copy_bytes(cut, level0.size()) == tied);  // the head's copy
  CHECK(level0.tied_across_bytes(0, level0.size()) == 0);
  const double tied_pass = pass * static_cast<double>(tied) / static_cast<double>(level0.held_param_bytes(0, cut));
  CHECK(level0.collectives(0, cut).reduce_ms == Approx(2 * pass));
  for (int level = 1; level <= 3; ++level) {
    INFO("level " << level);
    opt.zero_stage = level;
    const CostModel::Collectives c = CostModel(p, opt).collectives(0, cut);
    const double moved = c.reduce_ms + c.at_update_ms + 4 * (c.pass_ms + c.gather_ms);
    CHECK(moved == Approx(level == 1 ? passes[1] * pass : passes[level] * pass - 3 * tied_pass));
    CHECK(c.at_update_ms >= tied_pass);
  }
  // The replicas' link (train measures it) replaces the link bandwidth there, and only there.
  opt.zero_stage = 1;
  opt.replica_bandwidth = 0.5e9;
  const CostModel slow(p, opt);
  CHECK(slow.allreduce_ms(0, cut) == Approx(2 * pass * 20));
  CHECK(slow.link_ms(1000) == Approx(level0.link_ms(1000)));
  const Plan plan = make_plan(p, opt);
  CHECK(plan_from_json(plan.to_json()).options.replica_bandwidth == 0.5e9);
  // The drag (train measures it on the CPU) travels with the plan and lengthens its step.
  opt.replica_drag = 0.75;
  const Plan dragged = make_plan(p, opt);
  CHECK(plan_from_json(dragged.to_json()).options.replica_drag == 0.75);
  CHECK(dragged.step_ms() > plan.step_ms());
  opt.replica_drag = 0;
  std::ostringstream table;
  plan.print_table(table);
  CHECK_THAT(table.str(), Catch::Contains("replica link 476.84 MiB/s"));
  opt.replica_bandwidth = 0;
  std::ostringstream unmeasured;
  make_plan(p, opt).print_table(unmeasured);
  CHECK_THAT(unmeasured.str(), Catch::Contains("the link bandwidth: not measured"));
}

TEST_CASE("the optimizer's update in a stage's time and the step: its share of the parameters, a shard under ZeRO",
          "[plan][zero]") {
  Profile p = analytic_profile(build_model(preset_config("gpt2-tiny"), 4), device_spec("a100-40gb"));
  p.update_ms = {10, 30, 28};  // sgd, adam, adamw: one update of the whole model
  PlanOptions opt;
  opt.stages = 2;
  opt.schedule = ScheduleChoice::named("1f1b");
  opt.micro_batches = 4;
  opt.optimizer = OptimizerKind::AdamW;
  const CostModel whole(p, opt);
  const int n = whole.size(), cut = n / 2;
  CHECK(whole.update_ms(0, n) == Approx(28));
  // Each stage its share; the head's copy of the tied embedding is updated where it is read too.
  const double copy = static_cast<double>(whole.tied_copy_bytes(cut, n)) / static_cast<double>(whole.param_bytes(0, n));
  CHECK(whole.update_ms(0, cut) + whole.update_ms(cut, n) == Approx(28 * (1 + copy)));
  CHECK(whole.update_per_micro_batch_ms(0, cut) == Approx(whole.update_ms(0, cut) / 4));
  opt.optimizer = OptimizerKind::Sgd;
  CHECK(CostModel(p, opt).update_ms(0, n) == Approx(10));
  opt.optimizer = OptimizerKind::AdamW;
  // Replicas: each updates everything at level 0, its half at levels 1-3.
  opt.data_parallel = 2;
  CHECK(CostModel(p, opt).update_ms(0, cut) == Approx(whole.update_ms(0, cut)));
  for (int level = 1; level <= 3; ++level) {
    opt.zero_stage = level;
    CHECK(CostModel(p, opt).update_ms(0, cut) == Approx(whole.update_ms(0, cut) / 2));
  }
  opt.data_parallel = 1, opt.zero_stage = 0;
  // async updates after every micro-batch.
  PlanOptions async = opt;
  async.schedule = ScheduleChoice::named("async");
  CHECK(CostModel(p, async).update_per_micro_batch_ms(0, cut) == Approx(whole.update_ms(0, cut)));
  // The plan: in each stage's time, at the end of the simulated step (1f1b ends on stage 0's
  // update: stage 1's runs while stage 0 finishes its last backward), through its JSON.
  const Plan with = make_plan(p, opt);
  Profile unknown = p;
  unknown.update_ms = {};
  const Plan without = make_plan(unknown, opt);
  REQUIRE(with.stages.size() == 2);
  for (size_t x = 0; x < 2; ++x) {
    CHECK(with.stages[x].update_ms > 0);
    CHECK(without.stages[x].update_ms == 0);
  }
  if (with.stages[0].begin == without.stages[0].begin && with.stages[0].end == without.stages[0].end) {
    CHECK(with.stages[0].time_ms() == Approx(without.stages[0].time_ms() + with.stages[0].update_ms / 4));
    CHECK(with.step_ms() == Approx(without.step_ms() + with.stages[0].update_ms));
  }
  const Plan back = plan_from_json(with.to_json());
  CHECK(back.stages[1].update_ms == with.stages[1].update_ms);
  CHECK(back.step_ms() == Approx(with.step_ms()));
  std::ostringstream table;
  with.print_table(table);
  CHECK_THAT(table.str(), Catch::Contains("optimizer update per step"));
  std::ostringstream none;
  without.print_table(none);
  CHECK_THAT(none.str(), !Catch::Contains("optimizer update"));
}

TEST_CASE("data parallelism adds each stage's gradient allreduce to its time", "[plan]") {
  const Profile p = analytic_profile(build_model(preset_config("bert-large"), 4), device_spec("a100-40gb"));
  for (ScheduleChoice schedule : {ScheduleChoice::named("1f1b"), ScheduleChoice::named("async")}) {
    INFO(schedule);
    PlanOptions opt;
    opt.stages = 4;
    opt.schedule = schedule;
    opt.memopt = MemoptKind::None;
    opt.micro_batches = 4;
    opt.link_bandwidth = 10e9;
    const Plan alone = make_plan(p, opt);
    opt.data_parallel = 4;
    const Plan replicated = make_plan(p, opt);
    const CostModel model(p, opt);
    for (const StagePlan& s : replicated.stages) {
      // A ring allreduce moves 2 (D - 1) / D of the stage's gradients over the link per update.
      // (the copy of a tied weight a stage holds included: the last stage's decoder)
      const double expected = 2.0 * 3 / 4 * 1e3 * static_cast<double>(model.held_param_bytes(s.begin, s.end)) / 10e9;
      CHECK(s.allreduce_ms == Approx(expected));
      CHECK(s.allreduce_per_micro_batch_ms ==
            Approx(schedule == ScheduleChoice::named("async") ? expected : expected / 4));
      CHECK(s.time_ms() ==
            Approx(s.compute_ms + s.memopt_ms + s.allreduce_per_micro_batch_ms + s.update_per_micro_batch_ms));
    }
    CHECK(replicated.bottleneck_ms() > alone.bottleneck_ms());
    // The step hides what the drain can of the reductions: no longer than the simulated step with
    // the slowest stage's whole allreduce after it (plans without the placement), no shorter
    // than without data parallelism's collectives.
    Plan unplaced = replicated, free = replicated;
    double slowest = 0;
    for (StagePlan& s : unplaced.stages) {
      s.reduce_ms = s.reduce_tail_ms = s.at_update_ms = s.gather_ms = s.pass_ms = 0;
      slowest = std::max(slowest, s.allreduce_ms);
    }
    for (StagePlan& s : free.stages) s.reduce_ms = s.reduce_tail_ms = s.allreduce_ms = 0;
    unplaced.time_step();
    free.time_step();
    CHECK(replicated.step_ms() <= unplaced.step_ms());
    CHECK(replicated.step_ms() >= free.step_ms());
    if (schedule == ScheduleChoice::named("1f1b")) {
      CHECK(unplaced.step_ms() == Approx(free.step_ms() + slowest));
      CHECK(replicated.step_ms() < unplaced.step_ms());  // the later stages' reductions hide
    }
    const Plan back = plan_from_json(replicated.to_json());
    CHECK(back.options.data_parallel == 4);
    CHECK(back.stages[0].allreduce_ms == replicated.stages[0].allreduce_ms);
    CHECK(back.stages[0].reduce_ms == replicated.stages[0].reduce_ms);
    CHECK(back.step_ms() == Approx(replicated.step_ms()));  // what train --plan-in predicts
    std::ostringstream table;
    replicated.print_table(table);
    CHECK_THAT(table.str(), Catch::Contains("data parallel 4 x 4 stages"));
  }
}

// The evaluator's promise with a replay capacity: a stage it calls feasible replays within the
// capacity, and once a capacity well above the open peak is reached it fits. Feasibility is not
// guaranteed monotone in the capacity (the optimizer's rounds and the replay's re-run buffers):
// the test counts the ranges where a larger capacity lost the fit and prints them.
TEST_CASE("replay-checked feasibility keeps its promise", "[plan][planner]") {
  // Also with the late-swap fallback (StageEvaluator::allow_late_swap): every set it adds is
  // one fixed set (the same at every capacity), so it can only make fit more nearly monotone.
  std::mt19937_64 rng(23);
  int checked = 0, flips = 0, lost = 0, lost_late = 0, gained_late = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    SyntheticOptions so;
    so.nodes = 30;
    so.skip_probability = 0.3;
    const Profile p = random_profile(seed, so);
    PlanOptions o;
    o.stages = 3;
    o.micro_batches = 4;
    o.schedule = seed % 3 == 0   ? ScheduleChoice::named("gpipe")
                 : seed % 3 == 1 ? ScheduleChoice::named("1f1b")
                                 : ScheduleChoice::named("async");
    const CostModel model(p, o);
    for (int trial = 0; trial < 4; ++trial) {
      const int b = std::uniform_int_distribution<int>(0, 20)(rng);
      const int e = std::uniform_int_distribution<int>(b + 1, 30)(rng);
      const int x = std::uniform_int_distribution<int>(0, 2)(rng);
      const int64_t open = replay_stage_memory(model, b, e, x, {}).peak;
      for (MemoptKind mode : {MemoptKind::Recompute, MemoptKind::SwapRecompute}) {
        INFO("seed " << seed << " [" << b << "," << e << ") x " << x << " " << name_of(mode));
        bool was_feasible = false, was_feasible_late = false;
        for (int step = 1; step <= 24; ++step) {  // capacities rising from 15% to 130% of the open peak
          const int64_t capacity = static_cast<int64_t>(static_cast<double>(open) * (0.1 + 0.05 * step));
          StageEvaluator evaluator(model, mode, capacity);
          evaluator.set_replay_capacity(capacity);
          const StageEval ev = evaluator.evaluate(b, e, x);
          if (ev.feasible) {
            CHECK(ev.peak <= capacity);
            CHECK(evaluator.stage_plan(b, e, x).memory.replayed_peak <= capacity);
          }
          if (capacity >= open) CHECK(ev.feasible);
          flips += ev.feasible && !was_feasible;
          lost += !ev.feasible && was_feasible;
          was_feasible = ev.feasible;
          // The fallback applies to swap + recompute only, and keeps what fitted without it.
          CHECK(evaluator.allow_late_swap() == (mode == MemoptKind::SwapRecompute && capacity > 0));
          const StageEval late = evaluator.evaluate(b, e, x);
          if (ev.feasible) CHECK(late.time_ms() == ev.time_ms());
          // What the re-try after allow_late_swap gives is what evaluating afresh with it gives.
          StageEvaluator fresh(model, mode, capacity);
          fresh.set_replay_capacity(capacity);
          fresh.allow_late_swap();
          const StageEval& afresh = fresh.evaluate(b, e, x);
          CHECK(afresh.feasible == late.feasible);
          CHECK(afresh.peak == late.peak);
          CHECK(afresh.memopt_ms == late.memopt_ms);
          if (late.feasible) CHECK(evaluator.stage_plan(b, e, x).memory.replayed_peak <= capacity);
          gained_late += late.feasible && !ev.feasible;
          lost_late += !late.feasible && was_feasible_late;
          was_feasible_late = late.feasible;
          ++checked;
        }
      }
    }
  }
  CHECK(checked == 24 * 4 * 2 * 24);
  CHECK(flips > 100);  // most ranges go from out of reach to fitting within the capacities tried
  CHECK(gained_late > 0);
  WARN("replay-checked feasibility: " << flips << " ranges start fitting as the capacity grows, " << lost
                                      << " times a larger capacity lost the fit; with the late-swap fallback "
                                      << gained_late << " more fit, " << lost_late << " losses");
}

// Where no plan fits otherwise, the dawnpiper planner lets stages swap everything late
// (StageEvaluator::allow_late_swap). At the least capacity with a plan, such a stage is needed,
// what the plan says of it is what its decisions replay to, and it fits.
TEST_CASE("where nothing else fits, stages swap everything late and the plan still fits", "[plan][planner]") {
  const DeviceSpec a100 = device_spec("a100-40gb");
  int late_plans = 0;
  for (const char* preset : {"gpt2-tiny", "bert-tiny", "t5-tiny"}) {
    const Profile p = analytic_profile_model(ModelSource(preset_config(preset)), {1, 2}, a100).at_batch(4);
    for (ScheduleChoice schedule : {ScheduleChoice::named("gpipe"), ScheduleChoice::named("async")}) {
      PlanOptions o;
      o.stages = 3;
      o.micro_batches = 3;
      o.schedule = schedule;
      o.memopt = MemoptKind::SwapRecompute;
      o.host_bandwidth = a100.host_bandwidth;
      o.fit_replayed = true;
      // The least capacity with a plan, to 1/256.
      int64_t lo = 0, hi = try_plan(p, o)->max_peak_bytes();
      while (hi - lo > hi / 256) {
        const int64_t mid = lo + (hi - lo) / 2;
        o.capacity_bytes = mid;
        (try_plan(p, o) ? hi : lo) = mid;
      }
      o.capacity_bytes = hi;
      INFO(preset << " " << name_of(schedule) << " at " << hi << " bytes");
      const std::optional<Plan> plan = try_plan(p, o);
      REQUIRE(plan);
      const CostModel model(p, o);
      StageEvaluator without(model, o.memopt, hi);  // no fallback
      without.set_replay_capacity(hi);
      bool late = false;
      for (const StagePlan& s : plan->stages) {
        CHECK(s.memory.replayed_peak <= hi);
        CHECK(replay_stage_memory(model, s.begin, s.end, s.index, s.decisions).peak == s.memory.replayed_peak);
        late = late || !without.evaluate(s.begin, s.end, s.index).feasible;
      }
      late_plans += late;  // a stage fits only with the fallback
    }
  }
  CHECK(late_plans >= 3);
}

namespace {
// The plans the calibration tests make: 4 stages of 1f1b, nothing to evict.
PlanOptions calibration_options() {
  PlanOptions o;
  o.stages = 4;
  o.schedule = ScheduleChoice::named("1f1b");
  o.micro_batches = 8;
  o.memopt = MemoptKind::None;
  return o;
}
}  // namespace

// Calibrated planning (plan/calibrate.h) against a machine whose stages do not take what the
// profile says: here the nodes of the last fifth run at 0.6 times their profiled time, the
// others at 1.15 times (a head-only stage in cache, longer ones not). The uncalibrated plan
// cuts by the profile; measuring and scaling moves the cuts until the measured stages even out.
TEST_CASE("calibrated planning evens out the measured stages", "[plan][calibrate]") {
  const Profile p = transformer_like_profile(8);
  const PlanOptions o = calibration_options();
  auto truth = [&p](int n) { return n >= p.size() * 4 / 5 ? 0.6 : 1.15; };
  int measurements = 0;
  const StageTimer machine = [&](const Plan& plan) {
    ++measurements;
    std::vector<double> ms;
    for (const StagePlan& s : plan.stages) {
      double t = 0;
      for (int n = s.begin; n < s.end; ++n)
        t += truth(n) * (p.nodes[static_cast<size_t>(n)].fwd_ms + p.nodes[static_cast<size_t>(n)].bwd_ms);
      ms.push_back(t);
    }
    return ms;
  };
  const CalibratedPlan c = calibrate_plan(p, o, 4, machine);
  REQUIRE(c.rounds.size() == 4);
  CHECK(measurements == 4);
  const CalibrationRound& first = c.rounds.front();
  const CalibrationRound& kept = c.rounds[static_cast<size_t>(c.chosen)];
  for (const CalibrationRound& r : c.rounds) CHECK(kept.measured_bottleneck() <= r.measured_bottleneck());
  CHECK(kept.measured_bottleneck() < 0.97 * first.measured_bottleneck());
  CHECK(kept.measured_spread() < first.measured_spread());
  // The kept plan is the one measured: its cuts and what the machine says of it.
  std::vector<int> cuts;
  for (size_t x = 1; x < c.plan.stages.size(); ++x) cuts.push_back(c.plan.stages[x].begin);
  CHECK(cuts == kept.cuts);
  CHECK(machine(c.plan) == kept.measured);
  WARN("measured bottleneck " << first.measured_bottleneck() << " -> " << kept.measured_bottleneck() << " ms, spread "
                              << 100 * first.measured_spread() << "% -> " << 100 * kept.measured_spread() << "%");

  // Scaling: a stage measured at twice its prediction doubles its nodes' times and fits.
  Profile scaled = p;
  const Plan plan = make_plan(p, o);
  std::vector<double> measured;
  for (const StagePlan& s : plan.stages) measured.push_back(s.compute_ms * (s.begin == 0 ? 2.0 : 1.0));
  scale_stage_times(scaled, plan, measured);
  for (int n = 0; n < p.size(); ++n) {
    const double f = n < plan.stages[0].end ? 2.0 : 1.0;
    CHECK(scaled.nodes[static_cast<size_t>(n)].fwd_ms == Approx(f * p.nodes[static_cast<size_t>(n)].fwd_ms));
    CHECK(scaled.nodes[static_cast<size_t>(n)].bwd_ms_fit.per_sample ==
          Approx(f * p.nodes[static_cast<size_t>(n)].bwd_ms_fit.per_sample));
  }
  // A measured forward and backward include the evictor's work: a stage whose re-runs take as
  // long as its compute, measured at twice its compute, took what was predicted.
  Plan evicting = plan;
  evicting.stages[0].memopt_ms = evicting.stages[0].compute_ms;
  Profile unchanged = p;
  scale_stage_times(unchanged, evicting, measured);
  for (int n = 0; n < p.size(); ++n)
    CHECK(unchanged.nodes[static_cast<size_t>(n)].fwd_ms == Approx(p.nodes[static_cast<size_t>(n)].fwd_ms));
}

// Planning from traced runs (plan/calibrate.h, scale_to_measured): the same machine as above,
// measured once through the uncalibrated plan's stages. One run scales each stage's nodes to
// what it measured; runs with other cuts average per node; a stage outside the profile is refused.
TEST_CASE("a traced run corrects the profile it was planned from", "[plan][calibrate]") {
  const Profile p = transformer_like_profile(8);
  const PlanOptions o = calibration_options();
  auto truth = [&p](int n) { return n >= p.size() * 4 / 5 ? 0.6 : 1.15; };
  auto node_ms = [](const Profile& q, int n) {
    return q.nodes[static_cast<size_t>(n)].fwd_ms + q.nodes[static_cast<size_t>(n)].bwd_ms;
  };
  auto run = [&](const Plan& plan) {  // what a trace of the plan measures
    std::vector<MeasuredStage> stages;
    for (const StagePlan& s : plan.stages) {
      double t = 0;
      for (int n = s.begin; n < s.end; ++n) t += truth(n) * node_ms(p, n);
      stages.push_back({s.begin, s.end, t});
    }
    return stages;
  };
  auto measured = [&](const std::vector<MeasuredStage>& stages) {
    std::vector<double> ms;
    for (const MeasuredStage& s : stages) ms.push_back(s.compute_ms);
    return ms;
  };
  auto spread = [](const std::vector<double>& ms) {
    return *std::max_element(ms.begin(), ms.end()) / *std::min_element(ms.begin(), ms.end()) - 1;
  };
  const Plan first = make_plan(p, o);
  const std::vector<MeasuredStage> traced = run(first);
  Profile corrected = p;
  scale_to_measured(corrected, {traced});
  for (const MeasuredStage& s : traced) {  // each stage now adds up to what was measured
    double t = 0;
    for (int n = s.begin; n < s.end; ++n) t += node_ms(corrected, n);
    CHECK(t == Approx(s.compute_ms));
  }
  const Plan second = make_plan(corrected, o);
  const std::vector<double> before = measured(traced), after = measured(run(second));
  CHECK(*std::max_element(after.begin(), after.end()) < 0.97 * *std::max_element(before.begin(), before.end()));
  CHECK(spread(after) < spread(before));
  WARN("traced bottleneck " << *std::max_element(before.begin(), before.end()) << " -> "
                            << *std::max_element(after.begin(), after.end()) << " ms, spread " << 100 * spread(before)
                            << "% -> " << 100 * spread(after) << "%");
  // Two runs: a node's factor is the geometric mean of its stages' measured / profiled ratios.
  auto profiled = [&](int b, int e) {
    double t = 0;
    for (int n = b; n < e; ++n) t += node_ms(p, n);
    return t;
  };
  const std::vector<MeasuredStage> a{{0, 10, 2 * profiled(0, 10)}, {10, p.size(), 0}};  // 0: unmeasured
  const std::vector<MeasuredStage> b{{0, 5, 0.5 * profiled(0, 5)}};
  Profile averaged = p;
  scale_to_measured(averaged, {a, b});
  CHECK(node_ms(averaged, 2) == Approx(node_ms(p, 2)));      // 2 and 0.5: 1
  CHECK(node_ms(averaged, 7) == Approx(2 * node_ms(p, 7)));  // measured once, at 2
  CHECK(node_ms(averaged, 20) == Approx(node_ms(p, 20)));    // not measured
  CHECK_THROWS_AS(scale_to_measured(averaged, {{{0, p.size() + 1, 1.0}}}), ConfigError);
}

// What the device's runtime holds besides the model (cuBLAS workspaces on CUDA,
// Profile::runtime_bytes) is on every stage: each stage's breakdown and replayed peak carry it,
// plans keep it through JSON, and a capacity counts it.
TEST_CASE("the device runtime's bytes are in every stage's predicted peak", "[plan][planner]") {
  const Profile plain = transformer_like_profile(6);
  Profile with_runtime = plain;
  with_runtime.runtime_bytes = 65 << 20;
  PlanOptions o;
  o.stages = 3;
  o.schedule = ScheduleChoice::named("1f1b");
  o.memopt = MemoptKind::None;
  const Plan a = make_plan(plain, o), b = make_plan(with_runtime, o);
  REQUIRE(a.stages.size() == b.stages.size());
  for (size_t x = 0; x < a.stages.size(); ++x) {
    INFO("stage " << x);
    REQUIRE(a.stages[x].begin == b.stages[x].begin);  // unlimited memory: the same cuts
    CHECK(a.stages[x].memory.runtime == 0);
    CHECK(b.stages[x].memory.runtime == with_runtime.runtime_bytes);
    CHECK(b.stages[x].memory.total() == a.stages[x].memory.total() + with_runtime.runtime_bytes);
    CHECK(b.stages[x].memory.replayed_peak == a.stages[x].memory.replayed_peak + with_runtime.runtime_bytes);
  }
  CHECK(plan_from_json(b.to_json()).stages[1].memory.runtime == with_runtime.runtime_bytes);
  // A capacity the runtime-free plan just fits: with the runtime's bytes on top every stage still
  // fits it (the planner cuts and evicts differently), or no plan does.
  PlanOptions capped = o;
  capped.memopt = MemoptKind::SwapRecompute;
  capped.fit_replayed = true;
  capped.capacity_bytes = a.max_predicted_peak_bytes() + (with_runtime.runtime_bytes / 2);
  if (const std::optional<Plan> fitted = try_plan(with_runtime, capped))
    for (const StagePlan& s : fitted->stages) CHECK(s.memory.predicted_peak() <= capped.capacity_bytes);
  CHECK(replay_whole_step(with_runtime, OptimizerKind::Sgd).peak ==
        replay_whole_step(plain, OptimizerKind::Sgd).peak + with_runtime.runtime_bytes);
}

TEST_CASE("device memory is split into what a plan fills and the allocator's headroom", "[plan][planner]") {
  PlanOptions opt;
  opt.stages = 2;
  set_device_memory(opt, 1000, 0.05);
  CHECK(opt.capacity_bytes == 950);
  CHECK(opt.allocator_headroom_bytes == 50);
  set_device_memory(opt, INT64_MAX, 0.05);  // unlimited stays unlimited, with nothing held back
  CHECK(opt.capacity_bytes == INT64_MAX);
  CHECK(opt.allocator_headroom_bytes == 0);
  // The plan keeps both: what it was planned within and what it left free.
  const Profile p = small_profile();
  opt.capacity_bytes = INT64_MAX;
  const int64_t open_peak = make_plan(p, opt).max_peak_bytes();
  set_device_memory(opt, open_peak * 2, 0.1);
  const Plan plan = make_plan(p, opt);
  CHECK(plan.max_peak_bytes() <= opt.capacity_bytes);
  const Plan back = plan_from_json(plan.to_json());
  CHECK(back.options.capacity_bytes == opt.capacity_bytes);
  CHECK(back.options.allocator_headroom_bytes == open_peak * 2 - opt.capacity_bytes);
  std::ostringstream table;
  back.print_table(table);
  CHECK_THAT(table.str(), Catch::Contains("left to the allocator)"));
}

// A split backward (zb-h1) cannot run a stage holding GPT-2's tied embedding and the output
// projection it feeds: plan refuses it by name, auto leaves the schedule out, and two stages run.
TEST_CASE("a split-backward schedule refuses a stage whose tied weight's readers feed each other", "[planner]") {
  const Profile p = analytic_profile(build_model(preset_config("gpt2-tiny"), 4), device_spec("a100-40gb"));
  PlanOptions o;
  o.stages = 1;
  o.micro_batches = 4;
  o.schedule = ScheduleChoice::named("zb-h1");
  CHECK_THROWS_WITH(make_plan(p, o), Catch::Contains("stage 0 cannot split its backward (zb-h1): wte and lm_head"));
  PlanRequest any;
  any.ranks = 1;
  any.micro_batches = 4;
  any.schedule = ScheduleRequest::named("auto");
  CHECK(resolve_plan(p, any).options.schedule != ScheduleChoice::named("zb-h1"));
  o.stages = 2;
  o.schedule = ScheduleChoice::named("zb-h1");
  const Plan two = make_plan(p, o);
  CHECK(split_backward_refusal(p, two).empty());
  CHECK(two.stages[0].weight_ms > 0);
  CHECK(two.stages[0].weight_ms < two.stages[0].compute_ms - two.stages[0].forward_ms);
}

// A request is resolved by the planner alone: under auto into the fastest fitting candidate's
// plan (its own schedule, not auto), at every micro-batch size of --max-batch too; a plan's
// predicted step is simulated once, where it is made, and read back from its JSON unchanged.
TEST_CASE("a plan request resolves auto into one schedule, at one size and at the largest", "[plan][planner]") {
  const Profile p = small_profile(3, 30);
  PlanRequest r;
  r.ranks = 3;
  r.micro_batches = 6;
  r.capacity_bytes = 400000000;
  r.schedule = ScheduleRequest::named("auto");
  const std::vector<ScheduleCandidate> candidates = plan_each_schedule(p, r);
  REQUIRE(candidates.size() == r.schedule.candidates().size());
  const Plan* fastest = fastest_fitting(candidates);
  REQUIRE(fastest != nullptr);
  const Plan chosen = resolve_plan(p, r);
  CHECK(chosen.options.schedule == fastest->options.schedule);
  CHECK(chosen.step_ms() == fastest->step_ms());
  for (const ScheduleCandidate& c : candidates)
    if (c.plan) CHECK(chosen.step_ms() <= c.plan->step_ms());
  CHECK(chosen.options.stages == 3 * chosen.options.schedule.virtual_stages());
  const Plan back = plan_from_json(chosen.to_json());
  CHECK(back.step_ms() == Approx(chosen.step_ms()));
  CHECK(back.bubble_fraction() == Approx(chosen.bubble_fraction()));

  const MaxBatch largest = find_max_batch(p, r, 4096);
  CHECK(largest.micro_batch_size > 1);
  CHECK(r.schedule.admits(largest.plan.options.schedule));
  // The search found that no candidate fits the next size.
  for (const ScheduleChoice& s : r.schedule.candidates())
    CHECK_FALSE(try_plan(p.at_batch(largest.micro_batch_size + 1), r.options_for(s)).has_value());
}
