// The stage cost model: its O(log^2 n) range queries against brute force, the memory breakdown
// with simulated in-flight counts, and the compute- / memory-balanced cuts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "models/model_config.h"
#include "models/model_source.h"
#include "plan/balance.h"
#include "plan/cost_model.h"
#include "profile/analytic.h"
#include "synthetic_profile.h"
#include "util/error.h"

using namespace dawnpiper;
using namespace dawnpiper::testing;

TEST_CASE("range queries of the cost model match brute force", "[plan][cost]") {
  for (uint64_t seed = 1; seed <= 25; ++seed) {
    SyntheticOptions o;
    o.nodes = 24;
    o.skip_probability = 0.35;
    Profile p = random_profile(seed, o);
    PlanOptions opt;
    opt.stages = 3;
    CostModel m(p, opt);
    const int n = m.size();
    for (int b = 0; b <= n; ++b) {
      for (int e = b; e <= n; ++e) {
        std::set<int> saved;
        double compute = 0;
        int64_t params = 0, transient = 0;
        for (int i = b; i < e; ++i) {
          const NodeProfile& node = p.nodes[static_cast<size_t>(i)];
          compute += node.fwd_ms + node.bwd_ms;
          params += node.param_bytes;
          transient = std::max({transient, node.fwd_workspace, node.bwd_workspace});
        }
        for (const TensorProfile& t : p.tensors)
          for (int s : t.saved_by)
            if (s >= b && s < e) saved.insert(t.id);
        int64_t act = 0;
        for (int t : saved) act += p.tensors[static_cast<size_t>(t)].bytes;
        INFO("seed " << seed << " range [" << b << "," << e << ")");
        REQUIRE(m.activation_bytes(b, e) == act);
        REQUIRE(m.param_bytes(b, e) == params);
        REQUIRE(m.compute_ms(b, e) == Approx(compute));
        REQUIRE(m.transient_bytes(b, e) == transient);
      }
    }
    for (int cut = 0; cut <= n; ++cut) {
      int count = 0;
      int64_t bytes = 0;
      std::vector<int> ids;
      for (const TensorProfile& t : p.tensors) {
        int last = t.consumers.empty() ? -1 : *std::max_element(t.consumers.begin(), t.consumers.end());
        if (!t.is_data && t.producer < cut && last >= cut) {
          ++count;
          bytes += t.bytes;
          ids.push_back(t.id);
        }
      }
      REQUIRE(m.crossing_count(cut) == count);
      REQUIRE(m.crossing_bytes(cut) == bytes);
      std::vector<int> got;
      for (const TensorBytes& c : m.crossing(cut)) got.push_back(c.tensor);
      REQUIRE(got == ids);
    }
    for (int lo = 0; lo <= n; ++lo) {
      for (int hi = lo; hi <= n; ++hi) {
        int count = 0;
        int64_t bytes = 0;
        for (const TensorProfile& t : p.tensors) {
          int last = t.consumers.empty() ? -1 : *std::max_element(t.consumers.begin(), t.consumers.end());
          if (!t.is_data && last > t.producer && t.producer < lo && last >= hi) {
            ++count;
            bytes += t.bytes;
          }
        }
        REQUIRE(m.spanning_count(lo, hi) == count);
        REQUIRE(m.spanning_bytes(lo, hi) == bytes);
      }
    }
  }
}

TEST_CASE("memory breakdown uses the simulated in-flight and weight-version counts", "[plan][cost]") {
  SyntheticOptions o;
  o.nodes = 30;
  Profile p = random_profile(3, o);
  PlanOptions opt;
  opt.stages = 4;
  opt.schedule = ScheduleChoice::named("async");
  opt.optimizer = OptimizerKind::Adam;
  opt.micro_batches = 2;  // async still simulates a long enough stream for the steady state
  CostModel async(p, opt);
  for (int x = 0; x < 4; ++x) {
    CHECK(async.in_flight(x) == 4 - x);
    CHECK(async.weight_versions(x) == 4 - x);
    MemoryBreakdown mem = async.memory(2, 9, x, 1000);
    CHECK(mem.weights == async.param_bytes(2, 9));
    CHECK(mem.stashed_weights == (3 - x) * mem.weights);
    CHECK(mem.gradients == mem.weights);
    CHECK(mem.optimizer == 2 * mem.weights);  // adam: two moments
    CHECK(mem.activations == (4 - x) * 1000);
    CHECK(mem.total() == mem.weights * (4 - x + 1 + 2) + (4 - x) * 1000 + mem.transient);
    // One stage's "balanced group peak" is its peak.
    CHECK(async.balanced_group_peak(2, 9, x, x) == Approx(async.peak_without_memopt(2, 9, x)));
  }
  opt.schedule = ScheduleChoice::named("gpipe");
  opt.micro_batches = 5;
  opt.optimizer = OptimizerKind::Sgd;
  CostModel gpipe(p, opt);
  for (int x = 0; x < 4; ++x) {
    CHECK(gpipe.in_flight(x) == 5);
    CHECK(gpipe.weight_versions(x) == 1);
    CHECK(gpipe.memory(0, 5, x, 10).optimizer == gpipe.param_bytes(0, 5));
  }
  opt.schedule = ScheduleChoice::named("1f1b");
  CostModel sync(p, opt);
  for (int x = 0; x < 4; ++x) CHECK(sync.in_flight(x) == std::min(4 - x, 5));
}

// A stage reading a weight another stage owns (GPT-2's head and its embedding) holds a copy,
// with its gradient and optimizer state, as the replay and the runtime do: the formula the search
// starts from counts it too.
TEST_CASE("a stage's memory holds its copies of weights tied across stages", "[plan][cost]") {
  const Profile p = analytic_profile(build_model(preset_config("gpt2-tiny"), 4), device_spec("a100-40gb"));
  PlanOptions opt;
  opt.stages = 2;
  opt.schedule = ScheduleChoice::named("1f1b");
  opt.micro_batches = 4;
  opt.optimizer = OptimizerKind::AdamW;
  const CostModel model(p, opt);
  const int n = model.size(), cut = n / 2;
  const int64_t copy = model.tied_copy_bytes(cut, n);
  REQUIRE(copy > 0);
  CHECK(model.tied_copy_bytes(0, cut) == 0);  // the owner's own
  CHECK(model.tied_copy_bytes(0, n) == 0);
  const MemoryBreakdown head = model.memory(cut, n, 1, 0);
  CHECK(head.weights == model.param_bytes(cut, n) + copy);
  CHECK(head.gradients == head.weights);
  CHECK(head.optimizer == 2 * head.weights);
  // The stages hold the whole model and one copy more.
  CHECK(model.memory(0, cut, 0, 0).weights + head.weights == model.memory(0, n, 0, 0).weights + copy);
  // The floor the search prunes with, and the balanced estimate, carry it as well.
  CHECK(model.memory_floor(cut, n, 1, true) >= 4 * (model.param_bytes(cut, n) + copy));
  CHECK(model.balanced_group_peak(cut, n, 1, 1) ==
        Approx(model.peak_without_memopt(cut, n, 1) - model.constant_bytes(cut, n) - model.runtime_bytes()));
  // So Alg. 1's memory-balanced cut of two stages is the one whose larger peak is least.
  auto worse = [&](int c) {
    return std::max(model.balanced_group_peak(0, c, 0, 0), model.balanced_group_peak(c, n, 1, 1));
  };
  double least = std::numeric_limits<double>::infinity();
  for (int c = 1; c < n; ++c) least = std::min(least, worse(c));
  CHECK(worse(memory_balanced_cut(model, 0, n, 0, 1, 2)) == Approx(least));
  // A group of both stages, which holds the embedding and the head, will part them: its estimate
  // puts the whole copy (with gradient and momenta) on its last stage, and spreads the rest.
  auto spread = [&](int x) {
    const MemoryBreakdown m = model.memory(0, n, x, model.activation_bytes(0, n));
    return static_cast<double>(m.weights * (m.weight_versions + 1) + m.optimizer + m.activations);
  };
  const double held_copy = 4.0 * static_cast<double>(copy);  // weight, gradient, two moments
  CHECK(model.balanced_group_peak(0, n, 0, 1) == Approx(static_cast<double>(model.transient_bytes(0, n)) +
                                                        (1 + held_copy / spread(1)) / (1 / spread(0) + 1 / spread(1))));
  // ZeRO level 1 over 2 replicas: the copy's optimizer state is sharded with the rest.
  opt.data_parallel = 2;
  opt.zero_stage = 1;
  const MemoryBreakdown sharded = CostModel(p, opt).memory(cut, n, 1, 0);
  CHECK(sharded.weights == head.weights);
  CHECK(sharded.optimizer == 2 * ((head.weights + 1) / 2));
}

TEST_CASE("a stage counts each constant once, however many of its nodes share it", "[plan][cost]") {
  SyntheticOptions o;
  o.nodes = 12;
  Profile p = random_profile(5, o);
  for (auto [node, key, bytes] : {std::tuple<int, const char*, int64_t>{3, "mask 32", 1024},
                                  {5, "buckets", 8192},
                                  {7, "mask 32", 1024},
                                  {9, "mask 64", 4096}}) {
    p.nodes[static_cast<size_t>(node)].constant_key = key;
    p.nodes[static_cast<size_t>(node)].constant_bytes = bytes;
  }
  PlanOptions opt;
  opt.stages = 2;
  const CostModel model(p, opt);
  CHECK(model.constant_bytes(0, 3) == 0);
  CHECK(model.constant_bytes(3, 4) == 1024);
  CHECK(model.constant_bytes(0, 12) == 1024 + 8192 + 4096);
  CHECK(model.constant_bytes(4, 8) == 8192 + 1024);
  CHECK(model.constant_bytes(6, 10) == 1024 + 4096);
  const MemoryBreakdown mem = model.memory(0, 8, 0, 100);
  CHECK(mem.constants == 1024 + 8192);
  CHECK(mem.total() == mem.weights + mem.stashed_weights + mem.gradients + mem.optimizer + mem.activations +
                           mem.transient + mem.constants);
}

TEST_CASE("balanced cuts minimize their balance criterion", "[plan][cost]") {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SyntheticOptions o;
    o.nodes = 30;
    o.skip_probability = 0.2;
    Profile p = random_profile(seed, o);
    PlanOptions opt;
    opt.stages = 5;
    opt.schedule = seed % 2 ? ScheduleChoice::named("async") : ScheduleChoice::named("1f1b");
    CostModel m(p, opt);
    const int n = m.size();
    for (int s = 2; s <= 5; ++s) {
      for (int k = 1; k < s; ++k) {
        int cb = compute_balanced_cut(m, 0, n, k, s);
        double best = std::numeric_limits<double>::infinity();
        for (int c = k; c <= n - (s - k); ++c) best = std::min(best, split_lower_bound(m, 0, c, n, k, s));
        CHECK(split_lower_bound(m, 0, cb, n, k, s) == Approx(best));
      }
    }
    // Two stages: the memory-balanced cut minimizes the larger of the two peaks.
    int mb = memory_balanced_cut(m, 2, n, 1, 1, 2);
    auto worse_peak = [&](int c) { return std::max(m.peak_without_memopt(2, c, 1), m.peak_without_memopt(c, n, 2)); };
    int64_t best = std::numeric_limits<int64_t>::max();
    for (int c = 3; c <= n - 1; ++c) best = std::min(best, worse_peak(c));
    CHECK(worse_peak(mb) == best);
  }
}

TEST_CASE("earlier stages hold more, so the memory-balanced cut lies before the compute-balanced", "[plan][cost]") {
  // Identical nodes: the compute-balanced cut halves the chain; in 1F1B and async stage 0 holds
  // two micro-batches and stage 1 one, so memory balance gives stage 0 fewer nodes. In GPipe
  // both hold all of them.
  SyntheticOptions o;
  o.nodes = 41;
  o.fwd_min_ms = o.fwd_max_ms = 1;
  o.bwd_ratio_min = o.bwd_ratio_max = 2;
  o.bytes_min = o.bytes_max = 1000000;
  o.param_min = o.param_max = 100000;
  o.workspace_max = 0;
  o.save_input_probability = 1;
  o.save_output_probability = 0;
  Profile p = random_profile(1, o);
  for (ScheduleChoice schedule :
       {ScheduleChoice::named("gpipe"), ScheduleChoice::named("1f1b"), ScheduleChoice::named("async")}) {
    PlanOptions opt;
    opt.stages = 2;
    opt.schedule = schedule;
    CostModel m(p, opt);
    int cb = compute_balanced_cut(m, 0, m.size(), 1, 2);
    int mb = memory_balanced_cut(m, 0, m.size(), 0, 1, 2);
    INFO(schedule << " cb " << cb << " mb " << mb);
    CHECK(std::abs(cb - 21) <= 1);  // node 0 (input) takes no time
    if (schedule == ScheduleChoice::named("gpipe"))
      CHECK(std::abs(mb - cb) <= 1);
    else
      CHECK(mb < cb - 4);
  }
}

TEST_CASE("the cost model rejects malformed profiles and options", "[plan][cost]") {
  SyntheticOptions o;
  o.nodes = 8;
  Profile p = random_profile(1, o);
  PlanOptions opt;
  opt.stages = 2;
  Profile bad = p;
  bad.tensors[3].consumers.push_back(99);
  CHECK_THROWS_AS(CostModel(bad, opt), ConfigError);
  bad = p;
  bad.tensors[4].consumers.push_back(1);  // consumed before it is produced
  CHECK_THROWS_AS(CostModel(bad, opt), ConfigError);
  PlanOptions o2 = opt;
  o2.host_bandwidth = 0;
  CHECK_THROWS_AS(CostModel(p, o2), ConfigError);
}
