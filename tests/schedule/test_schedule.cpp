// Schedules: compact text, per-stage simulation (in-flight micro-batches, weight versions, gaps)
// and the global simulation (no deadlock, every micro-batch once per stage).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "schedule/registry.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"
#include "util/error.h"

using namespace dawnpiper;

TEST_CASE("compact action strings of small schedules", "[schedule]") {
  Schedule g = make_schedule("gpipe", 2, 2);
  CHECK(to_string(g.actions[0]) == "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0U");
  CHECK(to_string(g.actions[1]) == "1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1 1U");

  Schedule s = make_schedule("1f1b", 2, 3);
  CHECK(to_string(s.actions[0]) == "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2 0U");
  CHECK(to_string(s.actions[1]) == "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2 1U");

  Schedule a = make_schedule("async", 2, 3);
  CHECK(to_string(a.actions[0]) ==
        "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0U 0F2 0SEND_F2 0RECV_B1 0B1 0U 0RECV_B2 0B2 0U");
  CHECK(to_string(a.actions[1]) ==
        "1RECV_F0 1F0 1B0 1SEND_B0 1U 1RECV_F1 1F1 1B1 1SEND_B1 1U 1RECV_F2 1F2 1B2 1SEND_B2 1U");

  Schedule one = make_schedule("1f1b", 1, 2);
  CHECK(one.to_string() == "0F0 0B0 0F1 0B1 0U\n");
}

TEST_CASE("actions parse back from their compact form", "[schedule]") {
  for (const char* text : {"2F0", "2B17", "2U", "1SEND_F3", "1RECV_F3", "0SEND_B12", "3RECV_B0", "0SWAP_OUT2t17",
                           "0SWAP_IN2t17", "4RECOMPUTE9t3", "0SWAP_OUT5"}) {
    CHECK(to_string(parse_action(text)) == text);
  }
  Action a = parse_action("12RECV_B345");
  CHECK(a.kind == ActionKind::RecvGrad);
  CHECK(a.stage == 12);
  CHECK(a.micro_batch == 345);
  CHECK(parse_actions(" 0F0  0U ").size() == 2);
  for (const char* bad : {"", "F0", "0X1", "0F", "0U1", "0Fx", "0F1t2", "-1F0"})
    CHECK_THROWS_AS(parse_action(bad), ConfigError);
  CHECK_THROWS_AS(make_schedule("zigzag", 2, 2), ConfigError);
  CHECK_THROWS_AS(make_schedule("gpipe", 0, 2), ConfigError);
  CHECK_THROWS_AS(make_schedule("gpipe", 2, 0), ConfigError);
}

TEST_CASE("in-flight micro-batches and weight versions come out of the simulation", "[schedule]") {
  for (int l = 1; l <= 6; ++l) {
    for (int m = 1; m <= 12; ++m) {
      std::vector<StageStats> gpipe = simulate_stages(make_schedule("gpipe", l, m));
      std::vector<StageStats> sync = simulate_stages(make_schedule("1f1b", l, m));
      std::vector<StageStats> async = simulate_stages(make_schedule("async", l, m));
      for (int x = 0; x < l; ++x) {
        INFO("l=" << l << " m=" << m << " stage " << x);
        CHECK(gpipe[x].max_in_flight == m);
        CHECK(gpipe[x].max_weight_versions == 1);
        CHECK(gpipe[x].optimizer_steps == 1);
        CHECK(sync[x].max_in_flight == std::min(l - x, m));
        CHECK(sync[x].max_weight_versions == 1);
        CHECK(sync[x].optimizer_steps == 1);
        CHECK(async[x].max_in_flight == std::min(l - x, m));
        CHECK(async[x].optimizer_steps == m);
        CHECK(async[x].max_weight_versions <= l - x);
        // Weight stashing reaches l - x versions once the steady state is full.
        if (m >= 2 * l) CHECK(async[x].max_weight_versions == l - x);
        CHECK(gpipe[x].forwards == m);
        CHECK(sync[x].backwards == m);
      }
    }
  }
}

TEST_CASE("gaps between a micro-batch's forward and backward", "[schedule]") {
  // GPipe: every micro-batch waits for the other m-1 passes (forwards after it, backwards
  // before it), so with unit times the gap is m - 1.
  std::vector<StageStats> g = simulate_stages(make_schedule("gpipe", 3, 5));
  for (const StageStats& s : g) CHECK(s.min_gap_ms(1, 1) == Approx(4));
  // 1F1B: the last stage runs each backward right after its forward.
  std::vector<StageStats> s = simulate_stages(make_schedule("1f1b", 4, 8));
  CHECK(s[3].min_gap_ms(1, 2) == 0);
  // Stage 0 of 1F1B (warm-up 3): micro-batch 0 waits for 3 forwards, the last one for the 3
  // drained backwards, those in the steady state for 3 of each.
  CHECK(s[0].min_gap_ms(1, 2) == Approx(3));
  CHECK(s[0].min_gap_ms(10, 1) == Approx(3));
  CHECK(s[0].min_gap_ms(10, 10) == Approx(30));
}

namespace {
// Independent check of a global order: per-rank order kept, every receive after its send.
void check_global_order(const Schedule& sched, const std::vector<Action>& order) {
  size_t total = 0;
  for (const auto& list : sched.actions) total += list.size();
  REQUIRE(order.size() == total);
  std::vector<size_t> next(sched.actions.size(), 0);
  std::set<std::tuple<int, int, int64_t>> sent;
  std::map<std::pair<int, int64_t>, int> forwards, backwards;
  for (const Action& a : order) {
    const size_t r = static_cast<size_t>(sched.rank_of(a.stage));
    size_t& n = next[r];
    REQUIRE(n < sched.actions[r].size());
    REQUIRE(sched.actions[r][n] == a);
    ++n;
    if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGrad)
      sent.insert({a.stage, static_cast<int>(a.kind), a.micro_batch});
    if (a.kind == ActionKind::RecvActivation)
      REQUIRE(sent.count({a.stage - 1, static_cast<int>(ActionKind::SendActivation), a.micro_batch}) == 1);
    if (a.kind == ActionKind::RecvGrad)
      REQUIRE(sent.count({a.stage + 1, static_cast<int>(ActionKind::SendGrad), a.micro_batch}) == 1);
    if (a.kind == ActionKind::Forward) ++forwards[{a.stage, a.micro_batch}];
    if (passes_gradient_back(a.kind)) ++backwards[{a.stage, a.micro_batch}];  // B, or I (and its W)
  }
  for (int x = 0; x < sched.stages; ++x)
    for (int64_t mb = 0; mb < sched.micro_batches; ++mb) {
      REQUIRE(forwards[{x, mb}] == 1);
      REQUIRE(backwards[{x, mb}] == 1);
    }
}
}  // namespace

TEST_CASE("every schedule runs to completion without deadlock", "[schedule]") {
  for (const ScheduleEntry& entry : registered_schedules())
    for (int v = 1; v <= (entry.traits.interleaves() ? 3 : 1); ++v)
      for (int l = 1; l <= 6; ++l)
        for (int m = 1; m <= 9; ++m) {
          if (entry.traits.interleaves() && m % l != 0) continue;  // refused (below)
          INFO(entry.name << " v=" << v << " l=" << l << " m=" << m);
          Schedule s = ScheduleChoice::named(entry.name).with_virtual_stages(v).make(l * v, m);
          check_global_order(s, simulate_global(s));
        }
}

TEST_CASE("the simulators reject malformed lists and deadlocks", "[schedule]") {
  CHECK_THROWS_AS(simulate_stage(parse_actions("0B0 0F0"), 1), ScheduleError);
  CHECK_THROWS_AS(simulate_stage(parse_actions("0F0 0F0 0B0 0B0"), 1), ScheduleError);
  CHECK_THROWS_AS(simulate_stage(parse_actions("0F0"), 1), ScheduleError);               // never backwarded
  CHECK_THROWS_AS(simulate_stage(parse_actions("1F0 1B0 1SEND_B0"), 2), ScheduleError);  // no RECV_F
  CHECK_THROWS_AS(simulate_stage(parse_actions("0F0 0SEND_F0 0B0"), 2), ScheduleError);  // no RECV_B

  // Stage 0 waits for a gradient before sending the activation that would produce it.
  Schedule dead{
      "gpipe", 2, 1, {parse_actions("0F0 0RECV_B0 0SEND_F0 0B0 0U"), parse_actions("1RECV_F0 1F0 1B0 1SEND_B0 1U")}};
  CHECK_THROWS_WITH(simulate_global(dead), Catch::Contains("deadlock"));

  // A split backward: W after its I, once; an I needs its W.
  CHECK_THROWS_WITH(simulate_stage(parse_actions("0F0 0W0 0I0"), 1), Catch::Contains("0W0: W before its I"));
  CHECK_THROWS_WITH(simulate_stage(parse_actions("0F0 0I0 0W0 0W0"), 1), Catch::Contains("W twice"));
  CHECK_THROWS_WITH(simulate_stage(parse_actions("0F0 0I0"), 1), Catch::Contains("0I0: no W follows this I"));
  CHECK_THROWS_WITH(simulate_stage(parse_actions("0F0 0B0 0I0 0W0"), 1), Catch::Contains("backwarded twice"));
  CHECK(simulate_stage(parse_actions("0F0 0F1 0I0 0I1 0W1 0W0"), 1).max_in_flight == 2);

  // Stages that disagree on the micro-batches.
  Schedule mismatch{
      "gpipe", 2, 1, {parse_actions("0F0 0SEND_F0 0RECV_B0 0B0 0U"), parse_actions("1RECV_F1 1F1 1B1 1SEND_B1 1U")}};
  CHECK_THROWS_AS(simulate_global(mismatch), ScheduleError);
}

TEST_CASE("communication is added to compute lists", "[schedule]") {
  Schedule s;
  s.stages = 3;
  s.micro_batches = 1;
  s.actions = {parse_actions("0F0 0B0 0U"), parse_actions("1F0 1B0 1U"), parse_actions("2F0 2B0 2U")};
  add_communication(s);
  CHECK(to_string(s.actions[0]) == "0F0 0SEND_F0 0RECV_B0 0B0 0U");
  CHECK(to_string(s.actions[1]) == "1RECV_F0 1F0 1SEND_F0 1RECV_B0 1B0 1SEND_B0 1U");
  CHECK(to_string(s.actions[2]) == "2RECV_F0 2F0 2B0 2SEND_B0 2U");
  // A split backward sends its gradients after I; W needs no message.
  Schedule split{"", 2, 1, {parse_actions("0F0 0I0 0W0 0U"), parse_actions("1F0 1I0 1W0 1U")}};
  add_communication(split);
  CHECK(to_string(split.actions[0]) == "0F0 0SEND_F0 0RECV_B0 0I0 0W0 0U");
  CHECK(to_string(split.actions[1]) == "1RECV_F0 1F0 1I0 1SEND_B0 1W0 1U");
}

TEST_CASE("schedule traits: only PipeDream's async stashes and updates per backward", "[schedule]") {
  for (const ScheduleEntry& entry : registered_schedules()) {
    const ScheduleTraits& t = ScheduleChoice::named(entry.name).traits();
    const bool async = std::string(entry.name) == "async";
    INFO(entry.name);
    CHECK(t.stashes_weights == async);
    CHECK(t.updates_once_per_step == !async);
    CHECK(t.drains_every_step == !async);
    CHECK(t.loss_scale(4) == (async ? 1.0 : 0.25));
    CHECK(t.simulated_micro_batches(4, 2) == (async ? 8 : 2));
  }
}

// Uniform stages, free communication: gpipe and 1f1b both take (m + l - 1)(f + b), the bubble
// (l - 1)(f + b) of every stage's idle time (Huang et al.; Narayanan et al.).
TEST_CASE("the timed simulation gives the textbook bubble", "[schedule]") {
  const double f = 1.0, b = 2.0;
  for (const char* name : {"gpipe", "1f1b"})
    for (int l = 1; l <= 8; l *= 2)
      for (int m = 1; m <= 16; m *= 2) {
        INFO(name << " l=" << l << " m=" << m);
        const Schedule s = make_schedule(name, l, m);
        const TimedRun run = simulate_times(s, std::vector<StageTimes>(static_cast<size_t>(l), {f, b, 0.0, 0.0}));
        CHECK(run.step_ms == Approx((m + l - 1) * (f + b)));
        for (double idle : run.idle_ms) CHECK(idle == Approx((l - 1) * (f + b)));
      }
  // A link delays every hop: the first forward reaches the last stage (l - 1) links late, the
  // last backward comes back as many links late.
  const Schedule s = make_schedule("gpipe", 4, 4);
  const TimedRun linked = simulate_times(s, std::vector<StageTimes>(4, {f, b, 0.0, 0.5}));
  CHECK(linked.step_ms == Approx((4 + 4 - 1) * (f + b) + 2 * 3 * 0.5));
  CHECK_THROWS_AS(simulate_times(s, std::vector<StageTimes>(3)), ScheduleError);
}

// The replicas' collectives on their own link: streamed from the stage's last backward of the
// step, the update waits only for what that backward and the drain after it (stage x finishes
// x backwards before stage 0) did not hide; the update's own collectives and a pass's add to them.
TEST_CASE("the timed simulation hides the replicas' reductions behind the drain", "[schedule]") {
  const double f = 1.0, b = 2.0;
  const int l = 4, m = 4;
  const double T = (m + l - 1) * (f + b);
  const Schedule s = make_schedule("1f1b", l, m);
  auto step = [&](StageTimes t) { return simulate_times(s, std::vector<StageTimes>(l, t)).step_ms; };
  StageTimes t{f, b, 0.0, 0.0};
  CHECK(step(t) == Approx(T));
  t.reduce_ms = b;  // within stage 0's own last backward
  CHECK(step(t) == Approx(T));
  t.reduce_ms = 3 * b;  // stage 0 waits 2b; stage 1's drains b longer, and so on
  CHECK(step(t) == Approx(T + 2 * b));
  t.reduce_ms = b, t.reduce_tail_ms = 0.5;  // the last bucket leaves when the backward ends
  CHECK(step(t) == Approx(T + 0.5));
  t.at_update_ms = 0.25;  // in the update itself
  CHECK(step(t) == Approx(T + 0.75));
  // Stage 3 alone reduces 4b: its last backward ends 3b before stage 0's, so b shows.
  std::vector<StageTimes> one(l, StageTimes{f, b, 0.0, 0.0});
  one[3].reduce_ms = 4 * b;
  CHECK(simulate_times(s, one).step_ms == Approx(T));
  one[3].reduce_ms = 5 * b;
  CHECK(simulate_times(s, one).step_ms == Approx(T + b));
  // A backward takes at least its pass's collectives, a forward its gathers.
  StageTimes slow{f, b, 0.0, 0.0};
  slow.pass_ms = 3.0, slow.gather_ms = 1.5;
  CHECK(step(slow) == Approx((m + l - 1) * (1.5 + 3.0)));
}

// Where the rank's own MPI calls move the collectives (the CPU), a pass pays `drag` of their time
// on top of its compute; where they run beside it (drag 0), only what outlasts the compute shows.
TEST_CASE("the timed simulation charges a computing rank its drag of the collectives", "[schedule]") {
  const double f = 1.0, b = 2.0;
  const int l = 4, m = 4;
  const Schedule s = make_schedule("1f1b", l, m);
  auto step = [&](StageTimes t) { return simulate_times(s, std::vector<StageTimes>(l, t)).step_ms; };
  StageTimes t{f, b, 0.0, 0.0};
  t.pass_ms = 1.0, t.gather_ms = 0.5;  // hidden at drag 0
  CHECK(step(t) == Approx((m + l - 1) * (f + b)));
  t.drag = 1;  // moved by the rank itself: added
  CHECK(step(t) == Approx((m + l - 1) * (f + 0.5 + b + 1.0)));
  t.pass_ms = 3.0, t.drag = 0.25;  // the collectives outlast the lengthened backward
  CHECK(step(t) == Approx((m + l - 1) * (f + 0.125 + 3.0)));
  // One stage: the reduction streamed from its last backward, hidden at drag 0, lengthens that
  // backward by drag x its time.
  const Schedule one = make_schedule("1f1b", 1, m);
  StageTimes r{f, b, 0.0, 0.0};
  r.reduce_ms = b;
  CHECK(simulate_times(one, {r}).step_ms == Approx(m * (f + b)));
  r.drag = 0.5;
  CHECK(simulate_times(one, {r}).step_ms == Approx(m * (f + b) + 0.5 * b));
  r.reduce_tail_ms = 0.5;  // the last bucket leaves when the lengthened backward ends
  CHECK(simulate_times(one, {r}).step_ms == Approx(m * (f + b) + 0.5 * b + 0.5));
}

// Uniform stages, free communication, the backward split into I (input gradients) and W
// (weights'): zb-h1 takes m (f + i + w) + (l - 1)(f + i - w) (Qi et al., ZB-H1), 1F1B's
// (m + l - 1)(f + i + w) less (l - 1)(2 w), holding min(l, m) micro-batches on every stage.
TEST_CASE("zb-h1: the textbook bubble and its in-flight count", "[schedule]") {
  for (const auto& [f, i, w] : {std::tuple{1.0, 1.0, 1.0}, {1.0, 1.2, 0.8}, {1.0, 1.0, 0.5}, {2.0, 1.0, 1.0}})
    for (int l : {2, 4, 8})
      for (int m : {l, 2 * l, 3 * l}) {
        INFO("l=" << l << " m=" << m << " f=" << f << " i=" << i << " w=" << w);
        const std::vector<StageTimes> times(static_cast<size_t>(l), {f, i + w, 0.0, 0.0, w});
        const Schedule h1 = make_schedule("zb-h1", l, m);
        CHECK(simulate_times(h1, times).step_ms == Approx(m * (f + i + w) + (l - 1) * (f + i - w)));
        CHECK(simulate_times(make_schedule("1f1b", l, m), times).step_ms == Approx((m + l - 1) * (f + i + w)));
        for (const StageStats& st : simulate_stages(h1)) CHECK(st.max_in_flight == std::min(l, m));
      }
}

TEST_CASE("a schedule file runs as written, its communication added when it writes none", "[schedule]") {
  // 1F1B's compute actions for 2 stages and 3 micro-batches, with comments and blank lines.
  const std::string compute = "# 1f1b by hand\n0F0 0F1 0B0 0F2 0B1 0B2 0U\n\n1F0 1B0 1F1 1B1 1F2 1B2 1U  # last\n";
  const ScheduleChoice own = ScheduleChoice::from_actions("file:own.txt", compute);
  CHECK(own.is_file());
  CHECK(own.make(2, 3).to_string() == make_schedule("1f1b", 2, 3).to_string());
  CHECK(own.traits().updates_once_per_step);
  // Written out with every send and receive, taken as it is.
  const ScheduleChoice full = ScheduleChoice::from_actions("file:full.txt", make_schedule("gpipe", 2, 2).to_string());
  CHECK(full.make(2, 2).to_string() == make_schedule("gpipe", 2, 2).to_string());

  const std::string path = "test_schedule_file.txt";
  {
    std::ofstream out(path);
    out << compute;
  }
  CHECK(ScheduleChoice::named("file:" + path).make(2, 3).to_string() == own.make(2, 3).to_string());
  std::remove(path.c_str());
  CHECK_THROWS_WITH(ScheduleChoice::named("file:" + path), Catch::Contains("cannot read 'test_schedule_file.txt'"));
}

TEST_CASE("a schedule that cannot run is refused with the stage and the action", "[schedule]") {
  auto refused = [](const std::string& text) {
    try {
      ScheduleChoice::from_actions("file:s.txt", text);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused("0F0 0B0 0U\n1B0 1F0 1U\n"), Catch::Contains("stage 1, action 1B0: backward before its forward"));
  CHECK_THAT(refused("0F0 0B0\n"), Catch::Contains("stage 0 (line 1): a schedule file updates once per step"));
  CHECK_THAT(refused("0F0 0B0 0U 0U\n"), Catch::Contains("updates once per step"));
  CHECK_THAT(refused("0F0 1B0 0U\n"), Catch::Contains("stage 0 (line 1), action 1B0"));
  CHECK_THAT(refused("0F0 0SWAP_OUT0t3 0B0 0U\n"), Catch::Contains("the runtime adds its own evictions"));
  CHECK_THAT(refused("0F0 0B0 0U\n1F0 1B0 1U\n1F0 1B0 1U\n"), Catch::Contains("action 1F0"));
  CHECK_THAT(refused("0F0 0Q0\n"), Catch::Contains("line 1: malformed action '0Q0'"));
  CHECK_THAT(refused("# nothing\n"), Catch::Contains("holds no actions"));
  CHECK_THAT(refused("0F1 0B1 0U\n"), Catch::Contains("not 0 .. 0"));
  // A receive with no send: stage 0 never sends what stage 1 waits for.
  CHECK_THAT(refused("0F0 0RECV_B0 0B0 0U\n1RECV_F0 1F0 1B0 1SEND_B0 1U\n"),
             Catch::Contains("stage 0, action 0F0: activations never sent"));
  // Stage 0 waits for a gradient before sending the activation that would produce it.
  CHECK_THAT(refused("0F0 0RECV_B0 0SEND_F0 0B0 0U\n1RECV_F0 1F0 1B0 1SEND_B0 1U\n"),
             Catch::Contains("deadlocks: each stage waits at its next action: 0RECV_B0 1RECV_F0"));

  // Stage 0 sends four activations ahead while stage 1 sends gradients it does not take yet: the
  // transport completes a stage's send before its next, so both wait.
  CHECK_THAT(refused("0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3 0U\n1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 1U\n"),
             Catch::Contains("deadlocks: each stage waits at its next action: 0SEND_F3 1SEND_B1"));

  const ScheduleChoice two = ScheduleChoice::from_actions("file:s.txt", "0F0 0F1 0B0 0B1 0U\n1F0 1F1 1B0 1B1 1U\n");
  CHECK_THROWS_WITH(two.make(4, 2), Catch::Contains("has lists for 2 stages; the run has 4"));
  CHECK_THROWS_WITH(two.make(2, 8), Catch::Contains("runs 2 micro-batches per step; the run has 8"));
  CHECK_THROWS_WITH(
      ScheduleChoice::named("zb-h9"),
      Catch::Contains("unknown schedule 'zb-h9' (choose gpipe, 1f1b, async, zb-h1, zb-h2 or interleaved"));
  CHECK_THAT(refused("0F0 0W0 0I0 0U\n"), Catch::Contains("stage 0, action 0W0: W before its I"));
  CHECK_THAT(refused("0F0 0I0 0U\n"), Catch::Contains("stage 0, action 0I0: no W follows this I"));
  CHECK_THROWS_WITH(ScheduleChoice::named("file:"), Catch::Contains("needs a path"));
}

// Interleaved 1F1B places V stages on each of l ranks, stage c*l + r on rank r; with uniform
// stages of f and b per pass it takes m V (f + b) + (l - 1)(f + b): 1F1B's bubble over V
// (Narayanan et al., SC'21), here with the one-send-buffer rule of the transport.
TEST_CASE("interleaved: its lists, its textbook bubble, its refusals", "[schedule]") {
  const Schedule two = ScheduleChoice::named("interleaved").with_virtual_stages(2).make(4, 2);
  REQUIRE(two.ranks() == 2);
  CHECK(to_string(two.actions[0]) ==
        "0F0 0SEND_F0 0F1 0SEND_F1 2RECV_F0 2F0 2SEND_F0 2RECV_F1 2F1 2SEND_F1 2RECV_B0 2B0 2SEND_B0 2RECV_B1 2B1 "
        "2SEND_B1 0RECV_B0 0B0 "
        "0RECV_B1 0B1 0U 2U");
  CHECK(to_string(two.stage_actions(3)) == "3RECV_F0 3F0 3RECV_F1 3F1 3B0 3SEND_B0 3B1 3SEND_B1 3U");
  const double f = 1.0, b = 2.0;
  for (int l : {2, 3, 4, 8})
    for (int v : {1, 2, 3, 4})
      for (int m : {l, 2 * l, 3 * l, 4 * l}) {
        INFO("l=" << l << " v=" << v << " m=" << m);
        const Schedule s = ScheduleChoice::named("interleaved").with_virtual_stages(v).make(l * v, m);
        const std::vector<StageTimes> times(static_cast<size_t>(l * v), {f, b, 0.0, 0.0});
        const TimedRun run = simulate_times(s, times);
        CHECK(run.step_ms == Approx(m * v * (f + b) + (l - 1) * (f + b)));
        REQUIRE(run.idle_ms.size() == static_cast<size_t>(l));
      }
  CHECK_THROWS_WITH(ScheduleChoice::named("interleaved").make(4, 3), Catch::Contains("not a multiple of the 2 ranks"));
  CHECK_THROWS_WITH(ScheduleChoice::named("interleaved").make(3, 2), Catch::Contains("3 stages cannot be placed 2"));
  CHECK_THROWS_WITH(ScheduleChoice::named("1f1b").with_virtual_stages(2), Catch::Contains("only interleaved"));
  CHECK(ScheduleChoice::named("interleaved").virtual_stages() == 2);
  CHECK(ScheduleChoice::named("1f1b").with_virtual_stages(0).virtual_stages() == 1);
}

// zb-h2 forwards up to 2l - 1 micro-batches ahead, so that the first stage's warm-up has no
// bubble either: m (f + i + w) + (l - 1) f once m >= 2l, with whatever F/I/W ratio (its lists are
// laid out with passes of one length), never slower than zb-h1. Its ranks keep two sends going:
// with one, a stage forwarding ahead waits for the next to take its previous send.
TEST_CASE("zb-h2: its step, its in-flight count, its send depth", "[schedule]") {
  for (const auto& [f, i, w] : {std::tuple{1.0, 1.0, 1.0}, {1.0, 1.2, 0.8}, {1.0, 1.0, 0.5}, {2.0, 1.0, 1.0}})
    for (int l : {2, 4, 8})
      for (int m : {l, 2 * l, 3 * l}) {
        INFO("l=" << l << " m=" << m << " f=" << f << " i=" << i << " w=" << w);
        const std::vector<StageTimes> times(static_cast<size_t>(l), {f, i + w, 0.0, 0.0, w});
        const Schedule h2 = make_schedule("zb-h2", l, m);
        const double step = simulate_times(h2, times).step_ms;
        if (m >= 2 * l) CHECK(step == Approx(m * (f + i + w) + (l - 1) * f));
        CHECK(step <= simulate_times(make_schedule("zb-h1", l, m), times).step_ms + 1e-9);
        for (const StageStats& st : simulate_stages(h2)) CHECK(st.max_in_flight <= std::min(2 * l - 1, m));
      }
  const std::vector<StageTimes> unit(4, {1.0, 2.0, 0.0, 0.0, 1.0});
  Schedule one_send = make_schedule("zb-h2", 4, 4);
  one_send.sends_in_flight = 1;
  CHECK(simulate_times(one_send, unit).step_ms == Approx(16));
  CHECK(simulate_times(make_schedule("zb-h2", 4, 4), unit).step_ms == Approx(15));
}

// --schedule reads a request: `auto` is the planner's to resolve into one of its candidates and
// is no schedule to run; a named one is its own only candidate.
TEST_CASE("a schedule request: auto names its candidates and runs nothing itself", "[schedule]") {
  CHECK_THROWS_WITH(ScheduleChoice::named("auto"), Catch::Contains("a request the planner resolves"));
  const ScheduleRequest any = ScheduleRequest::named("auto");
  CHECK(any.is_auto());
  CHECK_THROWS_AS(any.choice(), std::logic_error);
  std::vector<std::string> names;
  for (const ScheduleChoice& c : any.candidates()) {
    names.push_back(c.name());
    CHECK(c.traits().updates_once_per_step);  // PipeDream's async trains another model
  }
  CHECK(names == std::vector<std::string>{"gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved"});
  for (const ScheduleChoice& c : any.with_virtual_stages(3).candidates())
    CHECK(c.virtual_stages() == (c.traits().interleaves() ? 3 : 1));
  CHECK(any.admits(ScheduleChoice::named("zb-h2")));

  const ScheduleRequest one = ScheduleRequest::named("zb-h1");
  CHECK_FALSE(one.is_auto());
  REQUIRE(one.candidates().size() == 1);
  CHECK(one.candidates()[0] == ScheduleChoice::named("zb-h1"));
  CHECK(one.admits(ScheduleChoice::named("zb-h1")));
  CHECK_FALSE(one.admits(ScheduleChoice::named("1f1b")));
  CHECK_THROWS_AS(one.with_virtual_stages(2), ConfigError);  // zb-h1 does not interleave
  CHECK(ScheduleRequest::named("interleaved").with_virtual_stages(4).virtual_stages() == 4);
}
