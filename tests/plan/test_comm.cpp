// The communication optimization of appendix B.2 (plan/balance.h: adjust_cut).
#include <catch2/catch.hpp>

#include "plan/balance.h"
#include "plan/cost_model.h"
#include "synthetic_profile.h"

using namespace dawnpiper;
using namespace dawnpiper::testing;

namespace {

// input -> A -> {B, C, D} -> E -> F -> loss: a fork of three cheap branches joined by E; every
// activation is 1 MB. With `long_edge`, A's output is also read by the loss, so it crosses
// every cut after A. Each branch's forward takes `branch_ms`.
Profile fork_join(bool long_edge, double branch_ms = 0.001) {
  Profile p;
  p.micro_batch_size = 1;
  p.nodes.push_back(make_node(0, "input", 0));
  int data = add_tensor(p, 0, 100, true);
  const double fwd[] = {0, 1.0, branch_ms, branch_ms, branch_ms, 0.001, 1.0, 0.01};
  for (int i = 1; i <= 7; ++i) {
    NodeProfile n = make_node(i, "op", i);
    set_time(n, fwd[i], 2 * fwd[i]);
    p.nodes.push_back(n);
    add_tensor(p, i, i == 7 ? 4 : 1000000);
  }
  auto out = [&](int node) { return p.nodes[static_cast<size_t>(node)].outputs[0]; };
  consume(p, 1, data);
  for (int branch : {2, 3, 4}) consume(p, branch, out(1));
  for (int branch : {2, 3, 4}) consume(p, 5, out(branch));
  consume(p, 6, out(5));
  consume(p, 7, out(6));
  consume(p, 7, data);
  if (long_edge) consume(p, 7, out(1));
  return p;
}

}  // namespace

TEST_CASE("a cut where several tensors cross moves to the nearby single-tensor cut", "[plan][comm]") {
  Profile p = fork_join(false);
  PlanOptions opt;
  opt.stages = 2;
  opt.link_bandwidth = 10e9;
  CostModel m(p, opt);
  REQUIRE(m.crossing_count(2) == 1);  // A's output only
  REQUIRE(m.crossing_count(4) == 3);  // A's output, B's, C's
  REQUIRE(m.crossing_count(6) == 1);  // E's output
  const double avg = m.compute_ms(0, m.size()) / 2;
  CommOptimization on;
  // Moving the cut over the cheap branches saves 2 MB of traffic each way.
  CHECK(adjust_cut(m, 4, 4, 4, 1, 7, avg, on) == 2);
  CHECK(adjust_cut(m, 5, 5, 5, 1, 7, avg, on) == 6);
  CHECK(adjust_cut(m, 2, 2, 2, 1, 7, avg, on) == 2);  // already a single tensor
  // With expensive branches, moving would shift more compute than the traffic it saves.
  Profile slow = fork_join(false, 1.0);
  CostModel ms(slow, opt);
  CHECK(adjust_cut(ms, 4, 4, 4, 1, 7, ms.compute_ms(0, ms.size()) / 2, on) == 4);
  CommOptimization off;
  off.enabled = false;
  CHECK(adjust_cut(m, 4, 4, 4, 1, 7, avg, off) == 4);
  // Reaching only one node either way, B's output must be sent anyway (it crosses cuts 3 to 5):
  // cut 3 then carries one avoidable tensor (A's output) where cut 4 carries two.
  CommOptimization narrow;
  narrow.window = 1;
  CHECK(adjust_cut(m, 4, 4, 4, 1, 7, avg, narrow) == 3);
  CommOptimization still;
  still.max_shift = 0;
  CHECK(adjust_cut(m, 4, 4, 4, 1, 7, avg, still) == 4);
}

TEST_CASE("traffic slower than a stage's compute rules a cut out", "[plan][comm]") {
  Profile p = fork_join(false);
  PlanOptions opt;
  opt.stages = 2;
  opt.link_bandwidth = 1e6;  // 1 MB/s: a 1 MB tensor takes a second each way
  CostModel m(p, opt);
  const double avg = m.compute_ms(0, m.size()) / 2;
  CHECK(adjust_cut(m, 2, 2, 2, 1, 7, avg, CommOptimization{}) == -1);
  CHECK(adjust_cut(m, 6, 6, 6, 1, 7, avg, CommOptimization{}) == -1);
}

TEST_CASE("tensors crossing the whole searched range are not counted", "[plan][comm]") {
  Profile p = fork_join(true);
  PlanOptions opt;
  opt.stages = 2;
  CostModel m(p, opt);
  const double avg = m.compute_ms(0, m.size()) / 2;
  REQUIRE(m.crossing_count(3) == 2);  // A's output (to the loss as well) and B's
  REQUIRE(m.spanning_count(2, 7) == 1);
  // Searching cuts 2..7, A's output must be sent anyway: cut 3 carries one avoidable tensor.
  CHECK(adjust_cut(m, 3, 2, 7, 2, 7, avg, CommOptimization{}) == 3);
  // Without the long edge the same cut is moved.
  Profile q = fork_join(false);
  CostModel mq(q, opt);
  CHECK(adjust_cut(mq, 3, 2, 7, 2, 7, avg, CommOptimization{}) == 2);
  // If the cut before A is in reach, A's output is avoidable after all.
  CHECK(adjust_cut(m, 3, 2, 7, 1, 7, avg, CommOptimization{}) == 2);
}
